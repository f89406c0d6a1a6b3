"""A slow speaker is a person, not a greeting (the held-out batches' people at 86-109 wpm: "Yeah, this is
Marcus." ran 2.2-2.7 s before its pause, past `max_human_s`, and was `voicemail`: hung up on in a campaign).
Such an utterance has few syllables (five, where a greeting's first 2.3 s have seven or more at any rate
but the slowest), so the detector counts them (`duetaspan.outbound.syllables`) and waits for a slow stretch
with few syllables up to `slow_human_s`; hold music, whose held notes have few syllables too, is not waited
for. Each part is switched off once to show what it decides."""

from __future__ import annotations

import random
import shutil

import numpy as np
import pytest

from duetaspan.outbound import DetectTuning, classify
from duetaspan.outbound.detector import _NUCLEUS_VOICING
from duetaspan.outbound.dsp import PhoneFrames
from duetaspan.outbound.syllables import Nuclei
from tests.support import benchmark_module

RATE = 8000

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="the voices are espeak-ng's (Debian's)")


def _speak(tmp_path, text: str, wpm: int, voice: str = "en-us") -> np.ndarray:
    """espeak-ng's words at `wpm`, at 8 kHz and trimmed, as the corpus makes them (`answer_corpus.speak`)."""
    return benchmark_module("answer_corpus").speak(text, voice, wpm, 50, tmp_path).astype(np.float32)


def _call(*parts: np.ndarray, seed: int = 0) -> np.ndarray:
    """The parts 0.3 s in, then 2 s of quiet, on a faint hiss (a clean line)."""
    quiet = lambda s: np.zeros(int(s * RATE), dtype=np.float32)  # noqa: E731
    x = np.concatenate([quiet(0.3), *parts, quiet(2.0)])
    return (x + 1e-3 * np.random.default_rng(seed).standard_normal(len(x))).astype(np.float32)


def _syllables(x: np.ndarray) -> int:
    n = Nuclei()
    for f in PhoneFrames(RATE).push(x):
        n.push(f.band_db, f.voicing >= _NUCLEUS_VOICING)
    return n.count


@needs_espeak
def test_syllables_are_counted_in_words_and_not_in_a_held_chord(tmp_path):
    # "Hello, Elena here." has six; a word one; a chord held 3 s one
    assert 5 <= _syllables(_call(_speak(tmp_path, "Hello, Elena here.", 150))) <= 7
    assert _syllables(_call(_speak(tmp_path, "Hey.", 150))) == 1
    t = np.arange(3 * RATE) / RATE
    chord = sum(0.1 * np.sin(2 * np.pi * hz * t) for hz in (261.6, 329.6, 392.0)).astype(np.float32)
    assert _syllables(_call(chord)) == 1  # its onset and its end: one, however long it is held


@needs_espeak
def test_a_slow_persons_few_words_are_a_person_not_a_greeting(tmp_path):
    words = _speak(tmp_path, "Yeah, this is Marcus.", 90)
    call = _call(words)
    det = classify(call, RATE)
    first = det.utterances[0]
    assert first[1] - first[0] > DetectTuning().max_human_s  # longer than a hello: the case this rule is for
    assert det.verdict.verdict == "human", det.history
    assert det.verdict.decided_at_s - (0.3 + len(words) / RATE) < 1.0  # within 1 s of the words' end
    # without the rule (the eighth round's detector): a greeting
    assert classify(call, RATE, DetectTuning(slow_human_s=0.0)).verdict.verdict == "voicemail"
    # and it is the syllables that decide: counting a syllable more than it has makes it a greeting
    assert classify(call, RATE, DetectTuning(slow_syllables=_syllables(call) - 1)).verdict.verdict == "voicemail"


@needs_espeak
def test_a_slow_greeting_is_still_a_greeting_and_a_normal_one_is_not_waited_for(tmp_path):
    slow = _call(_speak(tmp_path, "You have reached the voicemail of Elena Smith. Please leave a message.", 110))
    det = classify(slow, RATE)
    assert det.verdict.verdict == "voicemail", det.history
    assert det.verdict.decided_at_s <= 0.3 + DetectTuning().slow_human_s + 0.1
    normal = _call(_speak(tmp_path, "You have reached the voicemail of Elena Smith. Please leave a message.", 170))
    at = classify(normal, RATE).verdict.decided_at_s
    assert at == classify(normal, RATE, DetectTuning(slow_human_s=0.0)).verdict.decided_at_s  # no later than before


@needs_espeak
@pytest.mark.skipif(shutil.which("sox") is None, reason="the hold music, the noise and the line are sox's")
@pytest.mark.parametrize("snr_db", [None, 13.0], ids=["clean", "pink-13dB"])
def test_hold_music_after_please_hold_is_not_waited_for_as_a_slow_speaker(tmp_path, snr_db):
    """"Please hold." then chords held a beat each: as few syllables as a slow person's words, but level. On a
    line 13 dB over pink noise the chords' spectra blur (not the music rule's `ivr`, a greeting's `voicemail`),
    and the level alone says they are not words: decided as soon as without the slow rule (the ninth held-out
    batch's noisy holds waited 0.3-0.4 s longer when only the full music rule ended the wait)."""
    corpus = benchmark_module("answer_corpus")
    words = corpus.speak("Please hold.", "en-us", 215, 50, tmp_path)  # trimmed, as the corpus has it
    x = np.concatenate([corpus._gap(0.2), words, corpus._gap(0.3), corpus.music(6.0, tmp_path, random.Random(3))])
    if snr_db is not None:
        bed = corpus.noise(len(x) / RATE + 0.1, "pinknoise", tmp_path)
        x = x + bed[: len(x)] * 0.35 / np.sqrt(8) * 10 ** (-snr_db / 20)
    call = corpus.phone_line(x, tmp_path).astype(np.float32)
    det = classify(call, RATE)
    assert det.verdict.verdict == ("ivr" if snr_db is None else "voicemail"), det.history
    assert det.verdict.decided_at_s == classify(call, RATE, DetectTuning(slow_human_s=0.0)).verdict.decided_at_s


def test_a_sound_without_a_syllable_is_not_waited_for():
    # 3 s of hiss (a fan by the phone, a rush on the line) with a sharp onset: no syllable in it, no words
    rng = np.random.default_rng(0)
    call = _call((0.1 * rng.standard_normal(3 * RATE)).astype(np.float32))
    det = classify(call, RATE)
    assert det.verdict.verdict == "voicemail", det.history
    assert det.verdict.decided_at_s == classify(call, RATE, DetectTuning(slow_human_s=0.0)).verdict.decided_at_s
