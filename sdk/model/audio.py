"""Audio plumbing for the model: wav files in and out, resampling to 24 kHz (soxr), loudness to −24 LUFS.

`read_wav` accepts PCM 8/16/24/32-bit and float 32/64-bit RIFF files (plain or WAVE_FORMAT_EXTENSIBLE) with any
channel count; `to_model_rate` mixes down to mono and resamples. Loudness is BS.1770 K-weighted integrated
loudness from the `loudness` package (EBU R128).

Example:
    >>> pcm, rate = read_wav("caller.wav")                  # doctest: +SKIP
    >>> mono24k = to_model_rate(pcm, rate)                  # float32[n] at 24 kHz
    >>> write_wav("out.wav", np.stack([mono24k, mono24k], axis=1), 24000)
"""

from __future__ import annotations

import struct
from pathlib import Path

import loudness
import numpy as np
import soxr

from duetaspan.errors import AudioFormatError
from duetaspan.model.convention import SAMPLE_RATE, VOICE_PROMPT_LUFS

_PCM = 1
_FLOAT = 3
_EXTENSIBLE = 0xFFFE
_MIN_LOUDNESS_SECONDS = 0.4  # BS.1770 gating blocks are 400 ms


def read_wav(path: str | Path) -> tuple[np.ndarray, int]:
    """Read a RIFF/WAVE file as float32 `[samples, channels]` in [-1, 1] and its sample rate.

    Raises AudioFormatError for a missing, empty or unsupported file.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise AudioFormatError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise AudioFormatError(f"{path}: not a RIFF/WAVE file")
    fmt: tuple[int, int, int, int] | None = None
    payload: bytes | None = None
    pos = 12
    while pos + 8 <= len(data):
        chunk_id, size = data[pos : pos + 4], struct.unpack("<I", data[pos + 4 : pos + 8])[0]
        body = data[pos + 8 : pos + 8 + size]
        if chunk_id == b"fmt ":
            if len(body) < 16:
                raise AudioFormatError(f"{path}: truncated fmt chunk")
            tag, channels, rate, _, _, bits = struct.unpack("<HHIIHH", body[:16])
            if tag == _EXTENSIBLE and len(body) >= 26:
                tag = struct.unpack("<H", body[24:26])[0]
            fmt = (tag, channels, rate, bits)
        elif chunk_id == b"data":
            payload = body
        pos += 8 + size + (size & 1)
    if fmt is None or payload is None:
        raise AudioFormatError(f"{path}: missing fmt or data chunk")
    tag, channels, rate, bits = fmt
    if channels < 1 or rate < 1:
        raise AudioFormatError(f"{path}: invalid header ({channels} channels at {rate} Hz)")
    pcm = _decode_samples(payload, tag, bits, path)
    usable = len(pcm) - len(pcm) % channels
    return pcm[:usable].reshape(-1, channels), rate


def _decode_samples(payload: bytes, tag: int, bits: int, path: Path) -> np.ndarray:
    if tag == _PCM and bits == 8:
        return (np.frombuffer(payload, np.uint8).astype(np.float32) - 128.0) / 128.0
    if tag == _PCM and bits == 16:
        return np.frombuffer(payload[: len(payload) // 2 * 2], "<i2").astype(np.float32) / 32768.0
    if tag == _PCM and bits == 24:
        raw = np.frombuffer(payload[: len(payload) // 3 * 3], np.uint8).reshape(-1, 3).astype(np.int32)
        values = raw[:, 0] | (raw[:, 1] << 8) | (raw[:, 2] << 16)
        values = np.where(values >= 1 << 23, values - (1 << 24), values)
        return values.astype(np.float32) / float(1 << 23)
    if tag == _PCM and bits == 32:
        return (np.frombuffer(payload[: len(payload) // 4 * 4], "<i4") / 2.0**31).astype(np.float32)
    if tag == _FLOAT and bits in (32, 64):
        dtype = "<f4" if bits == 32 else "<f8"
        width = bits // 8
        return np.frombuffer(payload[: len(payload) // width * width], dtype).astype(np.float32)
    raise AudioFormatError(f"{path}: unsupported wav encoding (format tag {tag}, {bits} bits)")


def write_wav(path: str | Path, pcm: np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
    """Write float PCM `[samples]` or `[samples, channels]` as 16-bit PCM wav (clipped to [-1, 1])."""
    pcm = np.asarray(pcm, dtype=np.float32)
    if pcm.ndim == 1:
        pcm = pcm[:, None]
    channels = pcm.shape[1]
    ints = (np.clip(pcm, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()
    header = b"RIFF" + struct.pack("<I", 36 + len(ints)) + b"WAVE"
    header += b"fmt " + struct.pack(
        "<IHHIIHH", 16, _PCM, channels, sample_rate, sample_rate * channels * 2, channels * 2, 16
    )
    Path(path).write_bytes(header + b"data" + struct.pack("<I", len(ints)) + ints)


def resample(pcm: np.ndarray, rate_in: int, rate_out: int = SAMPLE_RATE) -> np.ndarray:
    """Resample float32 `[samples]` or `[samples, channels]` with soxr (high quality)."""
    pcm = np.asarray(pcm, dtype=np.float32)
    if rate_in == rate_out or len(pcm) == 0:
        return pcm
    return soxr.resample(pcm, rate_in, rate_out, quality="HQ").astype(np.float32)


def to_model_rate(pcm: np.ndarray, rate: int) -> np.ndarray:
    """Mix any channel count down to mono and resample to the model's 24 kHz: float32 `[samples]`."""
    pcm = np.asarray(pcm, dtype=np.float32)
    mono = pcm.mean(axis=1) if pcm.ndim == 2 else pcm
    return np.ascontiguousarray(resample(mono, rate, SAMPLE_RATE), dtype=np.float32)


def integrated_loudness(pcm: np.ndarray, rate: int = SAMPLE_RATE) -> float:
    """BS.1770 integrated loudness of mono float PCM in LUFS (-inf for digital silence)."""
    pcm = np.ascontiguousarray(pcm, dtype=np.float32)
    if len(pcm) < int(_MIN_LOUDNESS_SECONDS * rate):
        raise AudioFormatError(
            f"{len(pcm) / rate:.2f} s of audio is too short to measure loudness (>= 0.4 s)"
        )
    return float(loudness.integrated_loudness(pcm, rate))


def normalize_loudness(
    pcm: np.ndarray, rate: int = SAMPLE_RATE, target_lufs: float = VOICE_PROMPT_LUFS
) -> np.ndarray:
    """Scale mono PCM to `target_lufs` (PersonaPlex normalises voice prompts to −24 LUFS).

    Silence (no gated block above −70 LUFS) is returned unchanged; the result is clipped to [-1, 1].
    """
    measured = integrated_loudness(pcm, rate)
    if not np.isfinite(measured):
        return np.asarray(pcm, dtype=np.float32)
    gain = 10.0 ** ((target_lufs - measured) / 20.0)
    return np.clip(np.asarray(pcm, dtype=np.float32) * gain, -1.0, 1.0)


def frames_of(pcm: np.ndarray, frame_size: int, pad: bool = True) -> np.ndarray:
    """Cut mono PCM into `[n, frame_size]` frames, zero-padding the last partial frame when `pad`."""
    pcm = np.asarray(pcm, dtype=np.float32)
    n = -(-len(pcm) // frame_size) if pad else len(pcm) // frame_size
    out = np.zeros((n, frame_size), dtype=np.float32)
    flat = out.reshape(-1)
    take = min(len(pcm), n * frame_size)
    flat[:take] = pcm[:take]
    return out
