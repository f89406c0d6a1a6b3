"""Answer detection on lines whose noise is nearly as loud as the words (the fifth held-out batch's noisy half
was mostly `silence`): voicing (periodicity at a speaking pitch) and the voiced band's own level find the
words; noise alone, of any colour or swelling like traffic, stays `silence`. Each rule is switched off once
to show the case it decides."""

from __future__ import annotations

import numpy as np
import pytest

from duetaspan.outbound import DetectTuning, classify, read_wav
from duetaspan.outbound.dsp import PhoneFrames
from tests.support import REPO_ROOT

ANSWERS = REPO_ROOT / "tests" / "fixtures" / "answers"
SPEECH_REF = 0.35 / np.sqrt(8)  # the corpus' speech level, against which its SNRs are stated


def _noise(n: int, colour: str, seed: int) -> np.ndarray:
    """Unit-rms noise in a phone line's band (over 200 Hz): white, pink (1/f power), brown (1/f^2), or street
    (white under 2500 Hz swelling as cars pass, as benchmarks/answer_corpus.py makes it)."""
    x = np.random.default_rng(seed).standard_normal(n)
    spec, hz = np.fft.rfft(x), np.fft.rfftfreq(n, 1 / 8000)
    spec[hz < 200] = 0
    hz[0] = hz[1]
    if colour == "pink":
        x = np.fft.irfft(spec / np.sqrt(hz), n)
    elif colour == "brown":
        x = np.fft.irfft(spec / hz, n)
    elif colour == "street":
        x = np.fft.irfft(np.where(hz > 2500, 0, spec), n)
        x = x * (1 + 0.8 * np.sin(2 * np.pi * 0.25 * np.arange(n) / 8000) ** 2)
    return x / np.sqrt(np.mean(x**2))


def _on_a_noisy_line(name: str, colour: str, snr_db: float, seed: int = 0) -> np.ndarray:
    pcm, rate = read_wav(str(ANSWERS / name))
    assert rate == 8000
    return (pcm + _noise(len(pcm), colour, seed) * SPEECH_REF * 10 ** (-snr_db / 20)).astype(np.float32)


def test_voicing_is_high_for_a_vowel_and_low_for_noise():
    t = np.arange(8000) / 8000
    vowel = sum(a * np.sin(2 * np.pi * 140 * k * t) for k, a in enumerate([1.0, 0.8, 0.9, 0.6, 0.4, 0.3, 0.2], 1))
    voiced = [f.voicing for f in PhoneFrames(8000).push((0.1 * vowel).astype(np.float32))][2:]
    assert min(voiced) > 0.9
    for colour in ("white", "pink", "street"):
        frames = list(PhoneFrames(8000).push((0.05 * _noise(8000 * 5, colour, 1)).astype(np.float32)))
        share = np.mean([f.voicing >= DetectTuning().voicing for f in frames])
        assert share < 0.02, (colour, share)


@pytest.mark.parametrize(
    ("fixture", "colour", "snr_db", "expected", "without", "then"),
    [
        # a short "hello" under white noise 7 dB under speech: only its voicing stands out
        ("hello_short.wav", "white", 7.0, "human", {"voicing": 1.01}, "silence"),
        # a greeting under street noise 5 dB under speech: its voiced band over the band's floor decides
        ("greeting_beep.wav", "street", 5.0, "beep", {"band_margin_db": 99.0}, "silence"),
        # with neither (the fifth round's detector), a person under pink noise is `silence`
        ("hello_short.wav", "pink", 9.0, "human", {"voicing": 1.01, "band_margin_db": 99.0}, "silence"),
    ],
)
def test_words_under_line_noise_are_heard(fixture, colour, snr_db, expected, without, then):
    pcm = _on_a_noisy_line(fixture, colour, snr_db)
    assert classify(pcm, 8000).final.verdict == expected
    assert classify(pcm, 8000, DetectTuning(**without)).final.verdict == then


@pytest.mark.parametrize("colour", ["white", "pink", "brown", "street"])
def test_noise_alone_is_silence_at_any_colour(colour):
    for seed in range(3):
        det = classify((0.03 * _noise(8000 * 6, colour, seed)).astype(np.float32), 8000)
        assert det.verdict.verdict == "silence", (colour, seed, det.history)
