"""Wav I/O in every common encoding, resampling to 24 kHz and loudness normalisation."""

from __future__ import annotations

import struct
import wave

import numpy as np
import pytest

from duetaspan.errors import AudioFormatError
from duetaspan.model.audio import (
    frames_of,
    integrated_loudness,
    normalize_loudness,
    read_wav,
    to_model_rate,
    write_wav,
)


def _tone(rate: int, seconds: float = 1.0, amp: float = 0.3) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (amp * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def test_write_read_stereo_round_trip(tmp_path):
    x = _tone(24000)
    write_wav(tmp_path / "s.wav", np.stack([x, -x], axis=1), 24000)
    with wave.open(str(tmp_path / "s.wav")) as w:  # the stdlib agrees on the header
        assert (w.getnchannels(), w.getframerate(), w.getsampwidth()) == (2, 24000, 2)
    pcm, rate = read_wav(tmp_path / "s.wav")
    assert rate == 24000 and pcm.shape == (24000, 2)
    assert np.abs(pcm[:, 0] - x).max() < 1e-4 and np.abs(pcm[:, 1] + x).max() < 1e-4


def _raw_wav(path, tag: int, bits: int, channels: int, rate: int, payload: bytes) -> None:
    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * block, block, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(payload))
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body) + len(payload)) + body + payload)


@pytest.mark.parametrize("kind", ["u8", "i24", "i32", "f32", "f64"])
def test_read_encodings(tmp_path, kind):
    x = _tone(8000, 0.5)
    if kind == "u8":
        payload, tag, bits = (np.round(x * 127) + 128).astype(np.uint8).tobytes(), 1, 8
    elif kind == "i24":
        v = np.round(x * (2**23 - 1)).astype(np.int32)
        payload = b"".join(int(s).to_bytes(3, "little", signed=True) for s in v)
        tag, bits = 1, 24
    elif kind == "i32":
        payload, tag, bits = np.round(x * (2**31 - 1)).astype("<i4").tobytes(), 1, 32
    elif kind == "f32":
        payload, tag, bits = x.astype("<f4").tobytes(), 3, 32
    else:
        payload, tag, bits = x.astype("<f8").tobytes(), 3, 64
    _raw_wav(tmp_path / "x.wav", tag, bits, 1, 8000, payload)
    pcm, rate = read_wav(tmp_path / "x.wav")
    assert rate == 8000 and pcm.shape == (len(x), 1)
    assert np.abs(pcm[:, 0] - x).max() < (0.01 if kind == "u8" else 1e-4)


def test_bad_files(tmp_path):
    with pytest.raises(AudioFormatError, match="cannot read"):
        read_wav(tmp_path / "missing.wav")
    (tmp_path / "junk.wav").write_bytes(b"hello")
    with pytest.raises(AudioFormatError, match="not a RIFF"):
        read_wav(tmp_path / "junk.wav")
    _raw_wav(tmp_path / "alaw.wav", 6, 8, 1, 8000, b"\x00" * 100)
    with pytest.raises(AudioFormatError, match="unsupported"):
        read_wav(tmp_path / "alaw.wav")


def test_to_model_rate_mixes_and_resamples():
    x = _tone(8000)
    out = to_model_rate(np.stack([x, x], axis=1), 8000)
    assert out.dtype == np.float32 and abs(len(out) - 24000) <= 1
    spectrum = np.abs(np.fft.rfft(out))
    assert abs(np.argmax(spectrum) * 24000 / len(out) - 440) < 2


def test_loudness_normalisation():
    x = _tone(24000, 2.0)
    assert integrated_loudness(x) > -20
    y = normalize_loudness(x)
    assert abs(integrated_loudness(y) - (-24.0)) < 0.2
    silence = np.zeros(24000, np.float32)
    assert np.array_equal(normalize_loudness(silence), silence)
    with pytest.raises(AudioFormatError, match="too short"):
        integrated_loudness(x[:2400])


def test_frames_of_pads_the_tail():
    frames = frames_of(np.ones(1920 * 2 + 5, np.float32), 1920)
    assert frames.shape == (3, 1920) and frames[2, :5].sum() == 5 and frames[2, 5:].sum() == 0
    assert frames_of(np.ones(1925, np.float32), 1920, pad=False).shape == (1, 1920)
