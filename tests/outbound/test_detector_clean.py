"""Hold music on a very clean line is music, not a person (the seventh held-out batch: 3 of its 6 hold files,
music from the answer over brown noise 56-65 dB down, were `human`). Such a line's own noise, through G.711,
sits at -73 to -86 dBFS; with everything under -72 dBFS taken for digital silence (no line at all), the floor
had nothing of the line to keep and followed the music from its first half second, so the music was the
line's noise and its first chord a "hello?". Digital silence is now what a concealed or DTX frame is, all
zeros (under -90 dBFS), or one code repeated (`Frame.flat`: A-law's idle code decodes to +8, -72.2 dBFS, and
was digital silence only by being 0.2 dB under the old line; the resampling filter of a 16 kHz line now starts
from the first sample, so an idle code stays one code through it); a clean line's faint noise is the line's."""

from __future__ import annotations

import random
import shutil

import numpy as np
import pytest

from duetaspan.outbound import classify
from duetaspan.outbound import detector as detector_module
from tests.support import benchmark_module

pytestmark = pytest.mark.skipif(shutil.which("sox") is None, reason="the music, the noise and the line are sox's")
RATE = 8000


def _hold_on_a_clean_line(tmp_path, snr_db: float, seed: int) -> np.ndarray:
    """As benchmarks/answer_corpus.py makes a hold file without "please hold": the corpus' chords from 0.36 s,
    brown noise `snr_db` under the corpus' speech level, through 8 kHz mu-law."""
    corpus = benchmark_module("answer_corpus")
    x = np.concatenate([corpus._gap(0.36), corpus.music(6.0, tmp_path, random.Random(seed))])
    bed = corpus.noise(len(x) / RATE + 0.1, "brownnoise", tmp_path)
    x = x + bed[: len(x)] * 0.35 / np.sqrt(8) * 10 ** (-snr_db / 20)
    return corpus.phone_line(x, tmp_path).astype(np.float32)


@pytest.mark.parametrize(("snr_db", "seed"), [(58.0, 1), (62.0, 2)])
def test_hold_music_from_the_answer_on_a_clean_line_is_music(tmp_path, monkeypatch, snr_db, seed):
    call = _hold_on_a_clean_line(tmp_path, snr_db, seed)
    det = classify(call, RATE)
    assert det.verdict.verdict == "ivr", det.history
    assert det.verdict.decided_at_s < 3.0
    # taking the line's faint noise for digital silence (the eighth round's -72 dBFS): the music is a person
    monkeypatch.setattr(detector_module, "_DIGITAL_SILENCE_DB", -72.0)
    assert classify(call, RATE).verdict.verdict == "human"


@pytest.mark.parametrize("rate", [8000, 16000])
@pytest.mark.parametrize("idle", [0.0, 8 / 32768, -8 / 32768], ids=["zeros", "alaw-idle", "alaw-idle-neg"])
def test_a_person_after_a_lines_idle_code_is_a_person(rate, idle):
    """Digital silence as a PBX sends it: zeros (mu-law 0xFF), or A-law's idle code 0xD5, which decodes to +8
    (-72.2 dBFS: one code repeated, no signal). Then the person on their line's noise (-44 dBFS): that noise is
    the line's floor, not speech. Taken for a line (its level alone: over -90 dBFS), the idle code was the floor,
    the line's noise over it was speech, and the hello ran on into it: `voicemail`."""
    from scipy.signal import resample_poly

    from duetaspan.outbound import read_wav
    from tests.support import REPO_ROOT

    hello, at = read_wav(str(REPO_ROOT / "tests" / "fixtures" / "answers" / "hello.wav"))
    line = 10 ** (-44 / 20) * np.random.default_rng(7).standard_normal(len(hello))
    words = resample_poly(hello + line, rate // at, 1)
    det = classify(np.concatenate([np.full(2 * rate, idle), words]).astype(np.float32), rate)
    assert det.verdict.verdict == "human", det.history
