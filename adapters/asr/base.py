"""The ASR errors, `ASRClient` (the router's `Transcriber` protocol), WAV encoding and transcript clean-up.

Example:
    >>> import numpy as np
    >>> data = wav_bytes(np.zeros(1600, dtype=np.float32), 16000)
    >>> data[:4], len(data)
    (b'RIFF', 3244)
    >>> clean_transcript("language English<asr_text>  What time is it?")
    'What time is it?'
"""

from __future__ import annotations

import io
import re
import wave

import numpy as np

from duetaspan.errors import AudioFormatError
from duetaspan.router.ports import Transcriber, TranscriptionError


class ASRError(TranscriptionError):
    """The ASR backend failed (down, HTTP error, malformed reply); the message names the backend."""


class ASRTimeout(ASRError, TimeoutError):
    """The ASR backend did not answer in time."""


# The router owns the protocol (`duetaspan.router.ports.Transcriber`); the adapters keep their name for it.
ASRClient = Transcriber


class NullASR:
    """An ASR that hears nothing (`ASRConfig(kind="none")`): every `<ret>` then gets no question."""

    async def transcribe(self, pcm: np.ndarray, sample_rate: int) -> str:
        return ""

    async def aclose(self) -> None:
        return None


def check_pcm(pcm: np.ndarray, sample_rate: int) -> np.ndarray:
    """Validate and flatten mono float PCM; raises `AudioFormatError` with the reason."""
    if sample_rate <= 0:
        raise AudioFormatError(f"ASR: sample_rate must be positive, got {sample_rate}")
    array = np.asarray(pcm)
    if array.ndim != 1:
        raise AudioFormatError(f"ASR: expected mono 1-D PCM, got shape {array.shape}")
    if array.size == 0:
        raise AudioFormatError("ASR: empty audio")
    return array.astype(np.float32, copy=False)


def wav_bytes(pcm: np.ndarray, sample_rate: int) -> bytes:
    """Mono float32 PCM in [-1, 1] as a 16-bit PCM WAV file."""
    array = check_pcm(pcm, sample_rate)
    ints = (np.clip(array, -1.0, 1.0) * 32767.0).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(int(sample_rate))
        w.writeframes(ints.tobytes())
    return buffer.getvalue()


# Qwen3-ASR servers prefix the text with the detected language.
_LANGUAGE_PREFIX = re.compile(r"^\s*language\s+[A-Za-z-]+\s*<asr_text>", re.IGNORECASE)


def clean_transcript(text: str) -> str:
    """Strip backend artefacts (language prefixes, stray tags) and collapse whitespace; keeps the case."""
    text = _LANGUAGE_PREFIX.sub("", text or "")
    text = text.replace("<asr_text>", " ")
    return " ".join(text.split())
