"""The second listen (`duetaspan.outbound.gate`, `phrases.later_verdict`): after the audio's `human`, the line's
next utterance within `recheck_s` is transcribed with all before it, once; a menu's or greeting's phrase that a
person would not say gates the call again. A menu read slowly ("Thank you for calling Acme Bank." then a pause
a person's "hello?" would make, then "For billing, press one.") is the case: its first sentence is a person by
cadence and by its words, its second sentence starts too late for the detector's reading-on rule."""

from __future__ import annotations

import asyncio

import numpy as np

from duetaspan.outbound import DetectTuning, classify
from duetaspan.outbound.cli import with_second_opinion
from duetaspan.outbound.gate import RATE, SECOND_LISTEN_S, SECOND_OPINION_S, AnswerGate
from duetaspan.outbound.phrases import later_verdict, phrase_verdict
from tests.outbound.test_answer_recheck import _at_24k, _noise, _Tick, _ticks, _words

FIRST, SECOND = "Thank you for calling Acme Bank.", "For billing, press one."


def slow_menu(rate: int = 8000) -> np.ndarray:
    """The first sentence (1.4 s), 1.5 s of quiet (past `recheck_start_s`), the second (1.8 s), then quiet."""
    return np.concatenate([_noise(0.3, 21, rate), _words(1.4, 210, rate), _noise(1.5, 22, rate),
                           _words(1.8, 230, rate), _noise(3.0, 23, rate)])  # fmt: skip


def person_answering(rate: int = 8000) -> np.ndarray:
    """"Hello?" (0.6 s), 1.5 s of the agent talking, then the person's answer (1.7 s) and quiet."""
    return np.concatenate([_noise(0.3, 31, rate), _words(0.6, 310, rate), _noise(1.5, 32, rate),
                           _words(1.7, 330, rate), _noise(3.0, 33, rate)])  # fmt: skip


class ScriptedASR:
    """An ASR that hears `first` in the first `split_s` of what it is given, and `first + later` in more."""

    def __init__(self, first: str, later: str, split_s: float = 3.2) -> None:
        self.first, self.later, self.split_s = first, later, split_s
        self.heard: list[float] = []

    def text(self, pcm: np.ndarray, rate: int) -> str:
        self.heard.append(len(pcm) / rate)
        return self.first if len(pcm) / rate <= self.split_s else f"{self.first} {self.later}"

    async def transcribe(self, pcm: np.ndarray, rate: int) -> str:
        await asyncio.sleep(0)
        return self.text(pcm, rate)


async def _play(gate: AnswerGate, pcm: np.ndarray) -> list[_Tick]:
    """`pcm` (24 kHz) to the gate in 80 ms ticks, the event loop turning between them (the ASR answers)."""
    out = []
    for tick in _ticks(gate, pcm):
        out.append(tick)
        for _ in range(3):
            await asyncio.sleep(0)
    return out


def test_later_phrases_are_the_machines_a_person_would_not_say():
    for said in ("Hello? Who is calling?", "She's not available right now.", "Do you want to leave a message?",
                 "You can leave a message with me.", "Please hold, I'll get him.", "I'll call you back.",
                 "Yeah, this is Dana. What's this about?"):  # fmt: skip
        assert later_verdict(said) is None, said
    assert later_verdict(f"{FIRST} {SECOND}") == ("ivr", "press one")
    assert later_verdict("This is Marcus. Please leave a message.") == ("voicemail", "leave a message")
    assert later_verdict("Hi, you've reached Tom.")[0] == "voicemail"
    assert later_verdict("Welcome to City Dental. If you know your party's extension, dial it at any time.")[0] == "ivr"
    # how tiny.en hears "This is Marcus. Leave a message." on an 8 kHz line: both listens take it
    for garbled in ("live in Marcus, leave my message.", "This info, leave a minute."):
        assert phrase_verdict(garbled)[0] == later_verdict(garbled)[0] == "voicemail", garbled


async def test_the_second_listen_gates_a_slow_menu_again_as_ivr():
    asr = ScriptedASR(FIRST, SECOND)
    gate = AnswerGate(timeout_s=4.0, transcribe=asr.transcribe)
    ticks = await _play(gate, _at_24k(slow_menu()))
    kinds = [(v.verdict, v.source) for v in gate.verdicts]
    assert kinds == [("human", "audio"), ("ivr", "asr")], gate.verdicts
    human, ivr = gate.verdicts
    assert gate.gated and gate.verdict is ivr and "press one" in ivr.reason and ivr.transcript.endswith(SECOND)
    # the first opinion heard up to the verdict; the listen up to the second sentence's end (and its pause)
    assert len(asr.heard) == 2 and asr.heard[0] <= min(human.decided_at_s, SECOND_OPINION_S) + 0.1, asr.heard
    second_end = 0.3 + 1.4 + 1.5 + 1.8
    assert second_end < asr.heard[1] < second_end + 1.5 and asr.heard[1] <= SECOND_LISTEN_S, asr.heard
    assert second_end < ivr.decided_at_s < second_end + 1.5, ivr
    # the agent spoke between the verdicts and is silent from the overturn on
    spoke = [x.t for x in ticks if not x.result.silent]
    assert spoke and min(spoke) < ivr.decided_at_s and max(spoke) < ivr.decided_at_s + 0.1, spoke
    assert gate.summary()["verdict"] == "ivr"


async def test_a_person_answering_the_agent_stays_a_person_and_is_listened_to_once():
    asr = ScriptedASR("Hello?", "Yes, this is Dana. Who is calling? Can I take a message?", split_s=1.5)
    gate = AnswerGate(timeout_s=4.0, transcribe=asr.transcribe)
    await _play(gate, _at_24k(np.concatenate([person_answering(), _words(1.5, 340), _noise(2.0, 34)])))
    assert [v.verdict for v in gate.verdicts] == ["human"] and not gate.gated, gate.verdicts
    assert len(asr.heard) == 2, asr.heard  # the second opinion, then one listen however much more is said


async def test_no_second_listen_past_recheck_s_or_without_an_asr():
    asr = ScriptedASR(FIRST, SECOND)
    gate = AnswerGate(timeout_s=4.0, transcribe=asr.transcribe, tuning=DetectTuning(recheck_s=1.0))
    await _play(gate, _at_24k(slow_menu()))  # the second sentence starts 1.5 s after the first ends
    assert [v.verdict for v in gate.verdicts] == ["human"] and len(asr.heard) == 1, (gate.verdicts, asr.heard)
    plain = AnswerGate(timeout_s=4.0)
    await _play(plain, _at_24k(slow_menu()))
    assert [v.verdict for v in plain.verdicts] == ["human"] and not plain.gated


async def test_a_failing_asr_leaves_the_person_and_the_call_going(caplog):
    async def broken(pcm: np.ndarray, rate: int) -> str:
        raise RuntimeError("ASR endpoint down")

    gate = AnswerGate(timeout_s=4.0, transcribe=broken)
    await _play(gate, _at_24k(slow_menu()))
    assert [v.verdict for v in gate.verdicts] == ["human"] and not gate.gated
    assert "the second listen's ASR failed (ASR endpoint down)" in caplog.text


def test_detect_asr_mirrors_the_second_listen():
    """`with_second_opinion` (`duetaspan detect --asr`, the benchmark) gives a file what the call's gate gives it:
    the slow menu overturned when its second sentence's end was heard, the person left as they were."""
    pcm = slow_menu()
    asr = ScriptedASR(FIRST, SECOND)
    det = classify(pcm, 8000)
    assert det.final is det.verdict and det.verdict.verdict == "human", det.history
    final = with_second_opinion(det, pcm, 8000, asr.text)
    assert final.verdict == "ivr" and final.source == "asr", final
    (start, end), ended = det.utterances[1], det.ended_at[1]
    assert start > det.verdict.decided_at_s and end < ended <= final.decided_at_s < ended + 1.0, (final, det.ended_at)
    assert asr.heard[1] == ended  # all heard up to when the utterance's end was known
    person = person_answering()
    det = classify(person, 8000)
    said = ScriptedASR("Hello?", "Yes, this is Dana. Who is calling?", split_s=1.5)
    kept = with_second_opinion(det, person, 8000, said.text)
    assert (kept.verdict, kept.source) == ("human", "audio") and len(said.heard) == 2, kept
    # an utterance ending past `recheck_s` is not listened to (the gate stops listening then)
    det = classify(pcm, 8000, DetectTuning(recheck_s=1.0))
    late = ScriptedASR(FIRST, SECOND)
    assert with_second_opinion(det, pcm, 8000, late.text).verdict == "human" and len(late.heard) == 1


def test_detect_asr_second_listen_with_a_real_whisper(whisper_folder):
    """`tests/fixtures/answers/menu_slow.wav` (espeak-ng through a mu-law line): "Thank you for calling Acme
    Bank.", 2 s of quiet, "For billing, press one.". Cadence says a person (the pause is too long for the
    reading-on rule), the first opinion hears no menu; the real tiny.en hears "press one" in the second listen."""
    import json
    import subprocess
    import sys

    from tests.outbound.test_detector import ANSWERS, LABELS

    done = subprocess.run([sys.executable, "-m", "duetaspan", "detect", str(ANSWERS / "menu_slow.wav"), "--json",
                           "--asr", str(whisper_folder)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)
    assert row["first_verdict"] == "human" and row["verdict"] == "ivr" and row["source"] == "asr", row
    assert "spoke again" in row["reason"] and "press" in row["transcript"].lower(), row
    assert row["decided_at_s"] > LABELS["menu_slow.wav"]["extra"]["second_sentence_end_s"], row
    plain = subprocess.run([sys.executable, "-m", "duetaspan", "detect", str(ANSWERS / "menu_slow.wav"), "--json"],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert json.loads(plain.stdout)["verdict"] == "human"  # audio alone: a person


async def test_the_gate_second_listen_with_a_real_whisper(whisper_asr):
    """The call's gate with the real tiny.en as its ASR: the slow menu at the pipeline's 24 kHz is gated again as
    `ivr` after the agent had started speaking."""
    from scipy.signal import resample_poly

    from duetaspan.outbound import read_wav
    from tests.outbound.test_detector import ANSWERS

    pcm, rate = read_wav(str(ANSWERS / "menu_slow.wav"))
    gate = AnswerGate(timeout_s=4.0, transcribe=whisper_asr.transcribe)
    ticks = await _play(gate, resample_poly(pcm, RATE, rate).astype(np.float32))
    for _ in range(600):  # the ASR runs in a thread: give it time on a busy machine (up to 60 s)
        if len(gate.verdicts) > 1:
            break
        await asyncio.sleep(0.1)
    assert [(v.verdict, v.source) for v in gate.verdicts] == [("human", "audio"), ("ivr", "asr")], gate.verdicts
    assert gate.gated and any(not x.result.silent for x in ticks)
