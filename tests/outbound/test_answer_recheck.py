"""After a `human` verdict the detector listens on for `recheck_s` (`DetectTuning`): a greeting read slowly
pauses after its first sentence as a person pauses after "hello?", then reads on; a beep may follow a short
greeting. Either revises the `human`, and the call's gate (`AnswerGate`) closes again and handles the machine.
A person's second "hello?" revises nothing."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from duetaspan.outbound import AnswerDetector, DetectTuning, classify
from duetaspan.outbound.gate import RATE, AnswerGate

FLOOR = 0.002  # the line's own noise (rms)


def _noise(seconds: float, seed: int, rate: int = 8000) -> np.ndarray:
    return (FLOOR * np.random.default_rng(seed).standard_normal(int(seconds * rate))).astype(np.float32)


def _words(seconds: float, seed: int, rate: int = 8000) -> np.ndarray:
    """Speech-like sound: 0.2 s syllables of loud noise, 0.08 s of line noise between them."""
    out = []
    for i in range(int(seconds / 0.28)):
        out += [(0.12 * np.random.default_rng(seed + i).standard_normal(int(0.2 * rate))).astype(np.float32),
                _noise(0.08, seed + 100 + i, rate)]  # fmt: skip
    return np.concatenate(out)


def _tone(hz: float, seconds: float, rate: int = 8000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def slow_greeting(rate: int = 8000) -> np.ndarray:
    """'Welcome to City Dental.' (1.4 s), a 0.9 s sentence pause (a person's "hello?" then waiting), then the menu
    reading on for 4 s."""
    return np.concatenate([_noise(0.3, 1, rate), _words(1.4, 10, rate), _noise(0.9, 2, rate), _words(4.0, 30, rate),
                           _noise(2.0, 3, rate)])  # fmt: skip


def test_a_greeting_reading_on_after_its_first_sentence_revises_the_person_to_voicemail():
    det = classify(slow_greeting(), 8000)
    first, final = det.verdict, det.final
    assert first is not None and first.verdict == "human", det.history
    assert final is not None and final.verdict == "voicemail", det.history
    # decided as the next sentence passes `machine_s`: ~2.3 s after it started, ~1 s after the verdict
    _, (second_start, _) = det.utterances[:2]
    assert 2.2 <= final.decided_at_s - second_start <= 2.6, (final, det.utterances)
    assert "after the person's verdict" in final.reason
    # the sentence running on decides it by itself (the speech-in-a-window rule set out of reach)
    assert classify(slow_greeting(), 8000, DetectTuning(reading_on_speech_s=99.0)).final.verdict == "voicemail"
    # with the recheck off, the first sentence stays a person (the third round's behaviour)
    off = classify(slow_greeting(), 8000, DetectTuning(recheck_s=0.0))
    assert off.final is off.verdict and off.verdict.verdict == "human", off.history


def test_a_menu_reading_short_sentences_on_after_its_first_is_revised_too():
    """'Thank you for calling.', then 1.8 s sentences 0.7 s apart: none runs past `machine_s`, but 2.4 s of
    speech come within 4 s of the `human` verdict, the first of it right after the verdict."""
    parts = [_noise(0.3, 15), _words(1.4, 90), _noise(0.9, 16)]
    for i in range(3):
        parts += [_words(1.8, 91 + 10 * i), _noise(0.7, 17 + i)]
    det = classify(np.concatenate(parts), 8000)
    assert det.verdict.verdict == "human" and det.final.verdict == "voicemail", det.history
    assert all(end - start < 2.3 for start, end in det.utterances), det.utterances
    assert det.final.decided_at_s - det.verdict.decided_at_s <= 4.0, det.history


def test_a_persons_second_hello_and_words_that_start_late_revise_nothing():
    # "hello?" (0.6 s), 1.5 s of waiting, "hello? who is this?" (1.4 s): a person, twice
    twice = np.concatenate([_noise(0.3, 4), _words(0.6, 40), _noise(1.5, 5), _words(1.4, 50), _noise(2.0, 6)])
    det = classify(twice, 8000)
    assert [v.verdict for v in det.history] == ["human"], det.history
    # a long answer that starts later than `recheck_start_s` after the verdict (the person heard the agent),
    # however much of it comes within `reading_on_s`
    later = np.concatenate([_noise(0.3, 7), _words(0.6, 60), _noise(1.8, 8), _words(3.5, 70), _noise(2.0, 9)])
    det = classify(later, 8000)
    assert [v.verdict for v in det.history] == ["human"], det.history
    # the same long answer starting right after the verdict is what a greeting does: revised
    soon = np.concatenate([_noise(0.3, 7), _words(0.6, 60), _noise(0.8, 8), _words(3.5, 70), _noise(2.0, 9)])
    assert classify(soon, 8000).final.verdict == "voicemail"


def test_a_beep_after_a_short_greeting_is_found_by_a_streaming_detector():
    """'This is Dana. Leave a message.' is a person by cadence; its beep revises it (`final`), at its start."""
    pcm = np.concatenate([_noise(0.3, 11), _words(1.7, 80), _noise(1.0, 12), _tone(1000.0, 0.5), _noise(1.5, 13)])
    det = AnswerDetector(8000)
    for i in range(0, len(pcm), 160):
        det.push(pcm[i : i + 160])
    assert det.verdict.verdict == "human" and det.final.verdict == "beep", det.history
    assert abs(det.final.beep_at_s - (0.3 + 1.68 + 1.0)) < 0.1, det.final


@dataclasses.dataclass
class _Result:
    pcm: np.ndarray
    silent: bool = False
    text: str = "agent words"


@dataclasses.dataclass
class _Tick:
    t: float
    caller_pcm: np.ndarray
    result: _Result


def _ticks(gate: AnswerGate, pcm: np.ndarray) -> Iterator[_Tick]:
    """`pcm` (24 kHz) to the gate in 80 ms ticks as the service gives it, one tick a step: what the gate let out."""
    t, step = 0.0, RATE * 2 // 25
    for i in range(0, len(pcm), step):
        chunk = pcm[i : i + step]
        gate.hear(chunk)
        yield gate.tick(_Tick(t, chunk, _Result(np.full(len(chunk), 0.1, np.float32))))
        t += len(chunk) / RATE


def _play(gate: AnswerGate, pcm: np.ndarray) -> list[_Tick]:
    return list(_ticks(gate, pcm))


def _at_24k(pcm: np.ndarray) -> np.ndarray:
    return np.repeat(pcm, 3).astype(np.float32)


def test_the_gate_closes_again_and_leaves_the_message_when_the_greeting_reads_on():
    ended: list[tuple[str, str]] = []
    message = np.full(RATE, 0.2, np.float32)
    gate = AnswerGate(timeout_s=4.0, message_pcm=message, end=lambda reason, outcome: ended.append((outcome, reason)))
    ticks = _play(gate, _at_24k(np.concatenate([slow_greeting(), _noise(3.0, 14)])))  # 2 s of quiet, the message
    kinds = [v.verdict for v in gate.verdicts]
    assert kinds[:2] == ["human", "voicemail"], gate.verdicts
    assert gate.ungated_at is not None  # the agent spoke for a moment after the first sentence ...
    revised_at = gate.verdicts[1].decided_at_s
    spoke = [x.t for x in ticks if not x.result.silent]
    assert spoke and min(spoke) < revised_at, spoke
    # ... was silenced from the revision on, and the message played once the greeting had ended
    after = [x for x in ticks if x.t >= revised_at + 0.1]
    agent = [x for x in after if not x.result.silent and x.result.text]
    assert not agent, [x.t for x in agent]
    assert ended and ended[0][0] == "voicemail_left", ended
    assert gate.summary()["verdict"] == "voicemail" and gate.summary()["outcome"] == "voicemail_left"


def test_a_call_that_ends_after_the_revision_before_the_message_is_a_voicemail_not_a_person():
    """The greeting hangs up before the message was left: the campaign's outcome is the machine's, though the
    gate had opened for a moment."""
    gate = AnswerGate(timeout_s=4.0, message_pcm=np.full(RATE, 0.2, np.float32))
    _play(gate, _at_24k(slow_greeting()))
    assert gate.ungated_at is not None and gate.verdict is not None and gate.verdict.verdict == "voicemail"
    assert gate.call_outcome() == "voicemail_no_message"


def test_the_gate_stops_listening_once_recheck_s_has_passed():
    gate = AnswerGate(timeout_s=4.0, tuning=DetectTuning(recheck_s=0.5))
    _play(gate, _at_24k(slow_greeting()))
    assert [v.verdict for v in gate.verdicts] == ["human"], gate.verdicts
    assert not gate.gated
    # and the detector heard no more than that (an open call's audio costs it nothing after the window)
    assert gate.detector.t <= gate.verdicts[0].decided_at_s + 0.5 + 0.1, gate.detector.t
