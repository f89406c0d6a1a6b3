"""Caller audio to the model's format: int16 bytes at any rate -> float32 24 kHz -> exact 1920-sample frames.

Pipecat's default stream resampler (SOXR "VHQ") holds back ~150 ms of 8 kHz telephone audio, more than one
model frame. We resample with SOXR "QQ" (quick cubic) by default: measured at 8k->24k in 20 ms chunks
(`benchmarks/clock.py`) it holds back ~0 ms, against ~25 ms for "LQ" and ~150 ms for "VHQ"; the caller's
audio is narrowband anyway, so the steeper filters buy nothing the model can hear. The re-blocking into
80 ms frames is then the only latency this path adds.

Example:
    >>> import numpy as np
    >>> rs = StreamResampler(8000, 24000)
    >>> blocker = FrameBlocker(1920)
    >>> frames = blocker.push(rs.process(np.zeros(1600, np.float32)))  # 200 ms at 8 kHz
    >>> [f.shape for f in frames][:1]
    [(1920,)]
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import soxr

from duetaspan.errors import AudioFormatError

Quality = Literal["QQ", "LQ", "MQ", "HQ", "VHQ"]


def int16_bytes_to_float(audio: bytes) -> np.ndarray:
    """Little-endian int16 PCM bytes -> float32 in [-1, 1)."""
    if len(audio) % 2:
        raise AudioFormatError(f"int16 PCM needs an even number of bytes, got {len(audio)}")
    return np.frombuffer(audio, dtype="<i2").astype(np.float32) / 32768.0


def float_to_int16_bytes(pcm: np.ndarray) -> bytes:
    """float32 in [-1, 1] -> little-endian int16 PCM bytes (clipped)."""
    return (np.clip(pcm, -1.0, 32767 / 32768) * 32768.0).astype("<i2").tobytes()


class StreamResampler:
    """A stateful mono float32 resampler for one stream (one rate pair), or a pass-through at equal rates."""

    def __init__(self, in_rate: int, out_rate: int, quality: Quality = "QQ") -> None:
        if in_rate <= 0 or out_rate <= 0:
            raise AudioFormatError(f"sample rates must be positive, got {in_rate} -> {out_rate}")
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream = (
            None
            if in_rate == out_rate
            else soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality=quality)
        )

    def process(self, pcm: np.ndarray) -> np.ndarray:
        """Resample the next chunk; returns what the filter can emit so far (may be empty)."""
        pcm = np.ascontiguousarray(pcm, dtype=np.float32)
        if self._stream is None:
            return pcm
        return self._stream.resample_chunk(pcm)


class FrameBlocker:
    """Cuts a stream of float32 chunks into exact frames of `frame_size` samples, keeping the remainder."""

    def __init__(self, frame_size: int) -> None:
        self.frame_size = frame_size
        self._buf = np.zeros(0, np.float32)

    @property
    def pending(self) -> int:
        """Samples waiting for the next full frame."""
        return int(self._buf.size)

    def push(self, pcm: np.ndarray) -> list[np.ndarray]:
        """Append samples; return every complete frame now available, oldest first."""
        if pcm.size:
            self._buf = np.concatenate([self._buf, pcm.astype(np.float32, copy=False)])
        n = self._buf.size // self.frame_size
        if n == 0:
            return []
        frames = [self._buf[i * self.frame_size : (i + 1) * self.frame_size].copy() for i in range(n)]
        self._buf = self._buf[n * self.frame_size :].copy()
        return frames
