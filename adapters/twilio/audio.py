"""Twilio's audio: G.711 mu-law at 8 kHz in 20 ms chunks, to and from the model's 24 kHz float32 PCM.

The codec is vectorised numpy over lookup tables (no `audioop`, which Python 3.13 removed); resampling uses
soxr's streaming resampler so chunk boundaries leave no clicks. The inbound side defaults to soxr's "QQ"
quality because it emits output for every 20 ms chunk (the higher qualities buffer 60-140 ms, which would add
that much latency before the model hears the caller); the outbound side uses "HQ", where latency matters less.

Example:
    >>> import numpy as np
    >>> dec, enc = MulawDecoder(), MulawEncoder()
    >>> len(dec.decode(bytes([0xFF]) * 160))           # 20 ms of mu-law silence -> ~480 samples at 24 kHz
    475
    >>> enc.encode(np.zeros(1920, np.float32))[:4]      # 80 ms of 24 kHz silence -> mu-law (0xFF is zero)
    b'\xff\xff\xff\xff'
"""

from __future__ import annotations

import functools

import numpy as np
import soxr

from duetaspan.errors import AudioFormatError
from duetaspan.model.convention import SAMPLE_RATE

TWILIO_RATE = 8000
CHUNK_MS = 20
CHUNK_BYTES = TWILIO_RATE * CHUNK_MS // 1000  # 160 mu-law bytes per 20 ms media message
MULAW_SILENCE = 0xFF

_BIAS = 0x84
_CLIP14 = 8159
_SEGMENT_ENDS = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])


@functools.cache
def _decode_table() -> np.ndarray:
    """int16 value of each of the 256 mu-law bytes (ITU-T G.711)."""
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent = (u >> 4) & 0x07
    mantissa = u & 0x0F
    magnitude = (((mantissa << 3) + _BIAS) << exponent) - _BIAS
    table = np.where(u & 0x80, -magnitude, magnitude).astype(np.int16)
    table.flags.writeable = False
    return table


@functools.cache
def _encode_table() -> np.ndarray:
    """mu-law byte of every int16 value, indexed by `value + 32768` (G.711 on 14-bit samples, as audioop)."""
    x = np.arange(-32768, 32768, dtype=np.int32) >> 2
    mask = np.where(x < 0, 0x7F, 0xFF)
    magnitude = np.minimum(np.abs(x), _CLIP14) + (_BIAS >> 2)
    segment = np.searchsorted(_SEGMENT_ENDS, magnitude)  # first segment whose end >= magnitude
    mantissa = (magnitude >> (segment + 1)) & 0x0F
    code = np.where(segment >= 8, 0x7F, (segment << 4) | mantissa)  # past the last segment: full scale
    table = (code ^ mask).astype(np.uint8)
    table.flags.writeable = False
    return table


def ulaw_to_int16(data: bytes) -> np.ndarray:
    """Decode mu-law bytes to int16 samples."""
    return _decode_table()[np.frombuffer(data, dtype=np.uint8)]


def int16_to_ulaw(samples: np.ndarray) -> bytes:
    """Encode int16 samples to mu-law bytes."""
    return _encode_table()[samples.astype(np.int32) + 32768].tobytes()


def float_to_int16(pcm: np.ndarray) -> np.ndarray:
    """float32 in [-1, 1] to int16 with clipping (the model can overshoot full scale)."""
    return np.clip(np.rint(pcm * 32768.0), -32768, 32767).astype(np.int16)


class MulawDecoder:
    """Streaming decoder for one call's inbound audio: mu-law 8 kHz bytes -> float32 PCM at `rate`."""

    def __init__(self, rate: int = SAMPLE_RATE, quality: str = "QQ") -> None:
        self.rate = rate
        self._resampler = (
            soxr.ResampleStream(TWILIO_RATE, rate, 1, dtype="float32", quality=quality)
            if rate != TWILIO_RATE
            else None
        )

    def decode(self, data: bytes) -> np.ndarray:
        """Decode one chunk; returns the resampled samples available so far (may be empty)."""
        if not data:
            raise AudioFormatError("empty mu-law chunk")
        pcm = ulaw_to_int16(data).astype(np.float32) / 32768.0
        if self._resampler is None:
            return pcm
        return self._resampler.resample_chunk(pcm)


class MulawEncoder:
    """Streaming encoder for one call's outbound audio: float32 PCM at `rate` -> mu-law 8 kHz bytes."""

    def __init__(self, rate: int = SAMPLE_RATE, quality: str = "HQ") -> None:
        self.rate = rate
        self._resampler = (
            soxr.ResampleStream(rate, TWILIO_RATE, 1, dtype="float32", quality=quality)
            if rate != TWILIO_RATE
            else None
        )

    def encode(self, pcm: np.ndarray) -> bytes:
        """Encode float32 samples (any length); returns the mu-law bytes available so far."""
        pcm = np.asarray(pcm, dtype=np.float32).reshape(-1)
        if self._resampler is not None:
            pcm = self._resampler.resample_chunk(pcm)
        return int16_to_ulaw(float_to_int16(pcm))

    def reset(self) -> None:
        """Forget buffered samples (after a `clear`, the old tail must not leak into new speech)."""
        if self._resampler is not None:
            self._resampler.clear()


# the keypad's row and column tones (ITU-T Q.23)
DTMF_FREQS: dict[str, tuple[float, float]] = {
    "1": (697, 1209), "2": (697, 1336), "3": (697, 1477), "A": (697, 1633),
    "4": (770, 1209), "5": (770, 1336), "6": (770, 1477), "B": (770, 1633),
    "7": (852, 1209), "8": (852, 1336), "9": (852, 1477), "C": (852, 1633),
    "*": (941, 1209), "0": (941, 1336), "#": (941, 1477), "D": (941, 1633),
}  # fmt: skip


def dtmf_tones(digits: str, sample_rate: int, tone_ms: int = 160, gap_ms: int = 90, level: float = 0.25) -> np.ndarray:
    """In-band DTMF: each key's two tones for `tone_ms` then `gap_ms` of silence, float32 at `sample_rate`
    (what a Twilio call's stream carries: `<Play digits>` would replace the call's `<Connect><Stream>`)."""
    out = []
    t = np.arange(int(sample_rate * tone_ms / 1000)) / sample_rate
    ramp = np.minimum(1.0, np.minimum(t, t[::-1]) / 0.005)  # 5 ms edges: no clicks
    for key in digits.upper():
        low, high = DTMF_FREQS[key]
        out.append((level * ramp * (np.sin(2 * np.pi * low * t) + np.sin(2 * np.pi * high * t)) / 2).astype(np.float32))
        out.append(np.zeros(int(sample_rate * gap_ms / 1000), dtype=np.float32))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)

