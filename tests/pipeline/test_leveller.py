"""Caller-audio levelling toward -24 LUFS (quiet and loud fixtures, silence, clipping, off switch)."""

from __future__ import annotations

import numpy as np

from duetaspan.pipeline.leveller import Leveller, LevellerConfig, measure_lufs
from tests.support import load_wav


def _run(lev: Leveller, pcm: np.ndarray) -> np.ndarray:
    return np.concatenate([lev.process(pcm[i : i + 1920]) for i in range(0, pcm.size - 1919, 1920)])


def _looped(name: str, seconds: float) -> np.ndarray:
    pcm, sr = load_wav(name)
    assert sr == 24000
    return np.tile(pcm, int(np.ceil(seconds * sr / pcm.size)))[: int(seconds * sr)]


def test_quiet_caller_is_raised_toward_minus_24_lufs():
    speech = _looped("weather_sydney", 8.0)
    quiet = speech * (10 ** ((-48 - measure_lufs(speech, 24000)) / 20))  # a very quiet phone line
    assert abs(measure_lufs(quiet, 24000) + 48) < 0.5
    lev = Leveller(LevellerConfig())
    out = _run(lev, quiet)
    settled = out[3 * 24000 :]
    assert abs(measure_lufs(settled, 24000) + 24.0) < 2.0, measure_lufs(settled, 24000)
    assert 20.0 < lev.gain_db < 28.0
    assert np.max(np.abs(out)) <= lev.config.ceiling + 1e-6


def test_loud_caller_is_lowered_and_never_clips():
    speech = _looped("book_table", 6.0)
    loud = np.clip(speech * (10 ** ((-12 - measure_lufs(speech, 24000)) / 20)), -1, 1)
    lev = Leveller(LevellerConfig())
    out = _run(lev, loud)
    assert abs(measure_lufs(out[3 * 24000 :], 24000) + 24.0) < 2.5
    assert np.max(np.abs(out)) <= 0.97 + 1e-6


def test_silence_holds_the_gain_and_switch_off_passes_through():
    lev = Leveller(LevellerConfig())
    hiss = (1e-5 * np.random.default_rng(0).standard_normal(24000 * 3)).astype(np.float32)
    out = _run(lev, hiss)
    assert lev.gain_db == 0.0 and np.allclose(out, hiss[: out.size])
    speech = _looped("greeting", 2.0) * 0.01
    off = Leveller(LevellerConfig(enabled=False))
    assert np.array_equal(_run(off, speech), speech[: (speech.size // 1920) * 1920])
