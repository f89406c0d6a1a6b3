"""In-process faster-whisper (the `whisper` extra: `pip install 'duetaspan[whisper]'`), imported lazily.

Decoding runs in a worker thread so the event loop keeps its 80 ms clock.

Example:
    >>> client = FasterWhisperClient("base.en", device="cpu")   # loads nothing until the first call
    >>> # text = await client.transcribe(pcm, 16000)
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np

from duetaspan.adapters.asr.base import ASRError, check_pcm, clean_transcript
from duetaspan.errors import ConfigError

WHISPER_RATE = 16_000


class FasterWhisperClient:
    """faster-whisper `WhisperModel` behind the ASR protocol; the model loads on first use."""

    def __init__(
        self,
        model: str = "base.en",
        *,
        device: str = "auto",
        compute_type: str = "default",
        language: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.model_name = model
        self.device = device
        self.compute_type = compute_type
        self.language = language
        self.timeout_s = timeout_s
        self._model: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                try:
                    from faster_whisper import WhisperModel
                except ImportError as exc:
                    raise ConfigError(
                        "ASR kind 'whisper' needs faster-whisper: pip install 'duetaspan[whisper]'"
                    ) from exc
                self._model = WhisperModel(
                    self.model_name, device=self.device, compute_type=self.compute_type
                )
            return self._model

    def _run(self, pcm: np.ndarray) -> str:
        model = self._load()
        segments, _info = model.transcribe(pcm, language=self.language, beam_size=1, vad_filter=False)
        return clean_transcript(" ".join(segment.text for segment in segments))

    async def transcribe(self, pcm: np.ndarray, sample_rate: int) -> str:
        array = check_pcm(pcm, sample_rate)
        if sample_rate != WHISPER_RATE:
            import soxr

            array = soxr.resample(array, sample_rate, WHISPER_RATE).astype(np.float32)
        try:
            return await asyncio.wait_for(asyncio.to_thread(self._run, array), self.timeout_s)
        except ConfigError:
            raise
        except TimeoutError as exc:
            raise ASRError(f"faster-whisper took longer than {self.timeout_s:.1f} s") from exc
        except Exception as exc:  # the library raises plain RuntimeErrors
            raise ASRError(f"faster-whisper failed: {exc}") from exc

    async def aclose(self) -> None:
        self._model = None
