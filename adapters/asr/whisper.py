"""In-process faster-whisper (the `whisper` extra: `pip install 'duetaspan[whisper]'`), imported lazily.

`model` is a Whisper size (`tiny.en`, `base.en`, `small.en`, `medium.en`, `large-v3`, ...: faster-whisper
downloads it from Hugging Face on first use and caches it), a Hugging Face repository id (`org/name`), or a
local folder of CTranslate2 files (`model.bin`, `config.json`, `tokenizer.json`, `vocabulary.txt`). Decoding
runs in a worker thread so the event loop keeps its 80 ms clock. The result is a `Transcript`: the text (a
`str`) with each word's start and end in seconds.

Example:
    >>> client = FasterWhisperClient("base.en", device="cpu")   # loads nothing until the first call
    >>> # heard = await client.transcribe(pcm, 16000); str(heard), heard.words[0].start
    >>> check_model_name("whisper-1")
    Traceback (most recent call last):
    ...
    duetaspan.errors.ConfigError: asr.model 'whisper-1' is an OpenAI API model name, not a faster-whisper \
model: for kind 'whisper' set [asr] model to a size (tiny.en, base.en, small.en, ...) or a local folder \
holding model.bin
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from duetaspan.adapters.asr.base import ASRError, check_pcm, clean_transcript
from duetaspan.errors import ConfigError
from duetaspan.router.ports import Transcript, Word

WHISPER_RATE = 16_000
DEFAULT_MODEL = "base.en"
# faster-whisper's own size names (faster_whisper.utils.available_models(), read without importing it)
SIZES = (
    "tiny.en", "tiny", "base.en", "base", "small.en", "small", "medium.en", "medium", "large-v1", "large-v2",
    "large-v3", "large", "distil-large-v2", "distil-medium.en", "distil-small.en", "distil-large-v3",
    "distil-large-v3.5", "large-v3-turbo", "turbo",
)  # fmt: skip
FILES = ("model.bin", "config.json", "tokenizer.json")
# loaded models by (model, device, compute type, threads): every client of one model in a process (each agent,
# each test) shares one copy in memory; CTranslate2 models take concurrent requests
_LOADED: dict[tuple[str, str, str, int], Any] = {}
_LOADING = threading.Lock()


def check_model_name(name: str) -> str:
    """`name` as faster-whisper takes it (a size, `org/name`, or an existing folder, made absolute); a
    `ConfigError` naming the fix otherwise."""
    name = (name or "").strip()
    fix = "set [asr] model to a size (tiny.en, base.en, small.en, ...) or a local folder holding model.bin"
    if not name:
        raise ConfigError(f"asr.model is empty: for kind 'whisper' {fix}")
    if name.startswith("whisper-") or name.startswith("gpt-"):
        raise ConfigError(
            f"asr.model {name!r} is an OpenAI API model name, not a faster-whisper model: for kind 'whisper' {fix}"
        )
    folder = Path(name).expanduser()
    if folder.is_dir():
        missing = [f for f in FILES if not (folder / f).is_file()]
        if missing:
            raise ConfigError(
                f"asr.model folder {str(folder)!r} has no {', '.join(missing)}: a faster-whisper model folder "
                "holds model.bin, config.json, tokenizer.json and vocabulary.txt (CTranslate2's conversion of "
                "a Whisper model)"
            )
        return str(folder.resolve())
    if name in SIZES or (name.count("/") == 1 and not name.startswith((".", "/", "~"))):
        return name  # a size, or a Hugging Face repository id: downloaded on first use
    if name.startswith((".", "/", "~")) or "/" in name:
        raise ConfigError(f"asr.model folder {name!r} does not exist: {fix}")
    raise ConfigError(f"asr.model {name!r} is no Whisper size ({', '.join(SIZES[:6])}, ...): {fix}")


class FasterWhisperClient:
    """faster-whisper `WhisperModel` behind the ASR protocol; the model loads on first use (or `load()`).

    Args:
        model: a size, a Hugging Face id or a local folder (see the module docstring).
        device: "cpu", "cuda" or "auto".
        compute_type: CTranslate2's ("default", "int8", "float16", ...).
        language: an ISO code ("en"); None: detect (`.en` models are English only).
        timeout_s: one transcription's time limit.
        cpu_threads: decoding threads on the CPU (0: CTranslate2's default).
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        device: str = "auto",
        compute_type: str = "default",
        language: str | None = None,
        timeout_s: float = 10.0,
        cpu_threads: int = 0,
    ) -> None:
        self.model_name = check_model_name(model)
        self.device = device
        self.compute_type = compute_type
        self.language = language
        self.timeout_s = timeout_s
        self.cpu_threads = cpu_threads
        self.load_s: float | None = None
        self._model: Any = None
        self._lock = threading.Lock()

    def load(self) -> Any:
        """Load the model now (it loads on first use otherwise); `ConfigError` naming the fix on failure."""
        with self._lock, _LOADING:
            key = (self.model_name, self.device, self.compute_type, self.cpu_threads)
            if self._model is None and key in _LOADED:
                self._model, self.load_s = _LOADED[key], 0.0
            if self._model is None:
                try:
                    from faster_whisper import WhisperModel
                except ImportError as exc:
                    raise ConfigError(
                        "ASR kind 'whisper' needs faster-whisper: pip install 'duetaspan[whisper]'"
                    ) from exc
                start = time.perf_counter()
                try:
                    self._model = WhisperModel(
                        self.model_name, device=self.device, compute_type=self.compute_type,
                        cpu_threads=self.cpu_threads,
                    )  # fmt: skip
                except Exception as exc:  # huggingface_hub, CTranslate2 and OS errors alike
                    local = Path(self.model_name).is_dir()
                    hint = (
                        "the folder's files are not a CTranslate2 Whisper model"
                        if local
                        else "faster-whisper downloads sizes from Hugging Face on first use: without network, "
                        "set [asr] model to a local folder holding model.bin, config.json, tokenizer.json"
                    )
                    raise ConfigError(
                        f"faster-whisper could not load {self.model_name!r}: {exc} ({hint})"
                    ) from exc
                self.load_s = time.perf_counter() - start
                _LOADED[key] = self._model
            return self._model

    def _run(self, pcm: np.ndarray) -> Transcript:
        model = self._model or self.load()
        segments, _info = model.transcribe(
            pcm, language=self.language, beam_size=1, vad_filter=False, word_timestamps=True
        )
        words: list[Word] = []
        texts: list[str] = []
        for segment in segments:
            texts.append(segment.text)
            for w in segment.words or ():
                if w.word.strip():
                    words.append(Word(w.word.strip(), round(float(w.start), 3), round(float(w.end), 3)))
        return Transcript(clean_transcript(" ".join(texts)), words)

    async def transcribe(self, pcm: np.ndarray, sample_rate: int) -> Transcript:
        """The text of `pcm` with its words' times (seconds from the start of `pcm`)."""
        array = check_pcm(pcm, sample_rate)
        if sample_rate != WHISPER_RATE:
            import soxr

            array = soxr.resample(array, sample_rate, WHISPER_RATE).astype(np.float32)
        if self._model is None:  # the first call loads (or downloads) the model: not within timeout_s
            await asyncio.to_thread(self.load)
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
