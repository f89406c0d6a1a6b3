"""Call screening on calls the agent places, over the Twilio fake of `test_answer_calls` (a real WebSocket
speaking Twilio's protocol with real mu-law audio, the committed phone-line fixtures as the callee, a scripted
loopback ASR as the transcript's second opinion). A screener asks who is calling (`screening.wav`; the ASR
hears "state your name"): the verdict goes `voicemail` (the audio) then `screening` (the transcript), the
configured `[outbound] screening_reply`, spoken by the `tts_command` (espeak-ng), reaches the callee exactly
once and only after the screener's question, and nothing else is audible until the person picks up: their
"hello" opens the gate and the agent speaks. With no person after the reply, only the line's quiet for longer
than `screening_wait_s` (and longer than the detector's `silence_s`, which at the start of a call means a quiet
person, here no person yet), the call ends `screening_rejected` with the agent never un-gated. Between the
parts the callee plays the line's own noise, as a phone line does, not digital silence."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import time
from collections.abc import Iterator

import numpy as np
import pytest

from duetaspan.adapters.twilio.audio import int16_to_ulaw, ulaw_to_int16
from duetaspan.agent.answer import render
from duetaspan.outbound.scheduler import _answered_outcome
from tests.outbound.test_answer_calls import (
    FROM,
    LABELS,
    TO,
    _audio,
    _hung_up,
    _wait,
    detecting_agent,
    is_audible,
)

pytestmark = [
    pytest.mark.slow,  # two real-time calls of 20-25 s
    pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="the reply is spoken by espeak-ng (Debian's)"),
]

SCREENER_SAYS = ("Hi, the person you're calling is using a screening service. Please state your name and why you "
                 "are calling.")  # fmt: skip
REPLY = "This is Ava from Harbor Dental, calling about tomorrow's appointment."
TTS = ["espeak-ng", "-s", "150", "-w", "{out}", "{text}"]
FRAME = 160  # one 20 ms media message at 8 kHz


def _speech_end_s(pcm: np.ndarray, rate: int = 8000) -> float:
    """Where a fixture's last loud 20 ms frame ends (the screener's question: about 6.2 s of its 8.1 s)."""
    frames = pcm[: len(pcm) // FRAME * FRAME].reshape(-1, FRAME)
    loud = np.flatnonzero(np.sqrt(np.mean(frames**2, axis=1)) > 0.02)
    return float(loud[-1] + 1) * FRAME / rate


def _line(seconds: float) -> np.ndarray:
    """The line's own noise (the level of the screener's quiet tail, seeded), not digital silence: between
    the screener and the person the line stays open, and the detector's noise floor follows it."""
    quiet = _audio("screening.wav")[-12000:]  # its last 1.5 s: after the question
    rms = float(np.sqrt(np.mean(quiet**2)))
    return np.random.default_rng(33).normal(0.0, rms, int(seconds * 8000)).astype(np.float32)


def _picks_up_after_the_reply(hello_from_s: float, gap_s: float, at: dict):
    """A person who picks up `gap_s` after the screening reply ended where they are: a callee's `react` (see
    `detecting_agent`) that plays the messages as they are until the reply has reached it (nine tenths of
    its audible 20 ms messages, as the test renders it) and `gap_s` of quiet has followed its last audible
    message; then skips to the media message at `hello_from_s` in its stream (the
    rest of the line's noise before the hello left out), renumbered to run on. When the person started, in
    the callee's stream time, goes in `at["hello_s"]`. A timeline fixed in advance raced the agent: when its
    ticks waited seconds for a core on a loaded machine, the reply, played on those ticks, ran on into the
    person's hello, which the agent never heard as a person (r34; and a pause that long inside the reply is
    not its end)."""
    ulaw = int16_to_ulaw((_reply_8k() * 32767).astype(np.int16))
    whole = sum(is_audible(ulaw[i : i + FRAME]) for i in range(0, len(ulaw), FRAME))
    step_s = FRAME / 8000

    def react(messages: list[dict], got) -> Iterator[dict]:
        media = [m for m in messages if m.get("event") == "media"]
        hello = round(hello_from_s / step_s)
        yield from (m for m in messages if m.get("event") not in ("media", "stop"))
        start = time.monotonic()  # asked for the first media message: the callee's stream time 0
        sent, seen, voiced, last_voiced, i = 0, 0, 0, 0.0, 0
        while i < len(media):
            for msg, t in zip(got.messages[seen:], got.times[seen:], strict=True):  # arrived since the last send
                if msg.get("event") == "media" and is_audible(base64.b64decode(msg["media"]["payload"])):
                    voiced, last_voiced = voiced + 1, t - start
            seen = len(got.times)
            now = sent * step_s
            if i < hello and voiced >= 0.9 * whole and now - last_voiced >= gap_s:
                i, at["hello_s"] = hello, now
            m = media[i]
            yield {**m, "media": {**m["media"], "chunk": str(sent + 1), "timestamp": str(20 * sent)}}
            sent, i = sent + 1, i + 1
        yield from (m for m in messages if m.get("event") == "stop")

    return react


def _reply_8k() -> np.ndarray:
    """The reply as the test renders it itself with the same command, at the line's 8 kHz."""
    from scipy.signal import resample_poly

    return resample_poly(render(REPLY, TTS), 1, 3).astype(np.float32)


def _heard(played: dict) -> tuple[np.ndarray, list[bool], list[float]]:
    """What reached the callee: its audio at 8 kHz, whether each 20 ms message was audible, its arrival
    time in the callee's stream time."""
    got = played["got"]
    payloads = got.media_bytes()
    audio = ulaw_to_int16(b"".join(payloads)).astype(np.float32) / 32768
    return audio, [is_audible(p) for p in payloads], [t - played["t0"] for t in got.media_times()]


def _found(heard: np.ndarray, reply: np.ndarray, chunk: int = 1600, threshold: float = 0.8) -> list[tuple[int, list]]:
    """For each voiced 0.2 s piece of the reply: its start in the reply, and the places in `heard` where its
    normalised cross-correlation passes `threshold` (1.0: the very waveform; places a piece apart count apart).
    Piece by piece, as `test_answer_sip._match` does, so a gap in what the transport sent (a late tick under
    load) moves nothing after it."""
    from scipy.signal import fftconvolve

    energy = np.sqrt(np.maximum(fftconvolve(heard**2, np.ones(chunk), mode="valid"), 0.0))
    found = []
    for start in range(0, len(reply) - chunk + 1, chunk):
        piece = reply[start : start + chunk]
        norm = float(np.linalg.norm(piece))
        if np.sqrt(np.mean(piece**2)) < 0.02:
            continue
        xc = fftconvolve(heard, piece[::-1], mode="valid")
        ncc = np.where(energy > 0.1 * norm, np.abs(xc) / np.maximum(energy, 1e-9) / norm, 0.0)
        hits = np.flatnonzero(ncc > threshold)
        found.append((start, [int(h) for i, h in enumerate(hits) if i == 0 or h - hits[i - 1] > chunk]))
    return found


def _once(heard: np.ndarray, reply: np.ndarray) -> tuple[int, int]:
    """Check that the reply reached the callee exactly once, in order; its first and last 20 ms message."""
    found = _found(heard, reply)
    assert max(len(places) for _, places in found) == 1, found  # no piece of it twice
    at = [(places[0], start) for start, places in found if places]
    assert len(at) >= 0.8 * len(found), found  # the reply, nearly every piece of it (a late frame may split one)
    assert [a for a, _ in at] == sorted(a for a, _ in at), at  # in order
    return (at[0][0] - at[0][1]) // FRAME, (at[-1][0] + len(reply) - at[-1][1]) // FRAME  # its first and last sample


def _said(gate) -> list[tuple[str, float, str]]:
    return [(v.verdict, v.decided_at_s, v.reason) for v in gate.verdicts]


async def _screened_call(tmp_path, fixture, tail_s: float, hangs_up: bool = False, **outbound):
    """Dial the callee with the screening reply configured and the ASR hearing the screener; returns what the
    test checks once the call is over (and the agent's REST hang-up, `hangs_up`, with when it came)."""
    from duetaspan.testing.asr import ScriptedASR

    asr = ScriptedASR({"default": SCREENER_SAYS})
    heard_verdicts: list = []
    async with asr:
        asr_config = {"kind": "transcribe", "url": asr.transcribe_url}
        config = {"asr": asr_config, "screening_reply": REPLY, "tts_command": TTS}
        async with detecting_agent(tmp_path, fixture, tail_s=tail_s, **config, **outbound) as (
                agent, _service, sessions, played, fake):  # fmt: skip
            result = await agent.dial(TO, caller=FROM, ring_timeout_s=20)
            assert result.outcome == "answered", result
            await _wait(lambda: sessions and sessions[0].service.answer is not None)
            sessions[0].service.add_event_handler("on_answer", lambda _s, v: heard_verdicts.append(v))
            loop, ended = asyncio.get_running_loop(), []
            deadline, closed = loop.time() + 120, None
            while "got" not in played or sessions[0].record is None or (hangs_up and not ended):
                if not ended and "t0" in played and _hung_up(fake):  # the agent hung up (REST), in stream time
                    ended.append(time.monotonic() - played["t0"])
                if closed is None and "got" in played and sessions[0].record is not None:
                    closed = loop.time()  # the REST hang-up may follow the record's close under load
                assert loop.time() < deadline, "the call did not end"
                if closed is not None and loop.time() > closed + 30:
                    break
                await asyncio.sleep(0.05)
            assert asr.requests, "the second opinion asked the ASR"
    record = json.loads((tmp_path / "rec" / f"{result.call_id}.json").read_text())
    return result, sessions[0].service.answer, heard_verdicts, played, fake, record, ended[0] if ended else None


async def test_a_screener_hears_the_reply_once_then_the_persons_hello_opens_the_gate(tmp_path):
    question_end = _speech_end_s(_audio("screening.wav"))
    # the person picks up 4 s after the reply has reached them: longer than the detector's silence_s (3.5 s);
    # the line's noise runs on until then (at most 30 s)
    at: dict = {}
    line_s = 30.0
    react = _picks_up_after_the_reply(len(_audio("screening.wav")) / 8000 + line_s, 4.0, at)
    result, gate, heard_verdicts, played, _fake, record, _ = await _screened_call(
        tmp_path, ["screening.wav", _line(line_s), "hello.wav"], tail_s=3.0, react=react)  # fmt: skip
    assert "hello_s" in at, "the reply never reached the callee and ended"
    hello_at = at["hello_s"]
    steps = [(v.verdict, v.source) for v in gate.verdicts]
    assert steps == [("voicemail", "audio"), ("screening", "asr"), ("human", "audio")], _said(gate)
    assert [v.verdict for v in heard_verdicts] == ["voicemail", "screening", "human"]  # the on_answer handler
    assert "state your name" in gate.verdicts[1].reason and gate.verdict.verdict == "screening"
    human = gate.verdicts[2]
    words_end = hello_at + LABELS["hello.wav"]["speech_end_s"]
    assert words_end < human.decided_at_s < words_end + 1.0, (human, words_end)
    reply = _reply_8k()
    reply_s = len(reply) / 8000
    assert not gate.gated and gate.outcome is None
    assert question_end + reply_s <= gate.ungated_at <= human.decided_at_s + 0.2, gate.ungated_at  # gate time
    assert result.call.answer is gate and _answered_outcome(result) == "human"

    audio, audible, arrived = _heard(played)
    first, last = _once(audio, reply)
    assert arrived[first] >= question_end, (arrived[first], question_end)  # after the screener's question
    assert arrived[first] < hello_at, (arrived[first], hello_at)  # and before the person came
    # nothing audible before the reply, nor between the reply and the person's verdict; the agent then speaks
    assert not any(audible[: max(0, first - 2)]), [i for i, a in enumerate(audible[:first]) if a]
    after = [i for i, a in enumerate(audible) if a and i > last + 5]
    assert after, "the agent said nothing once the gate opened"
    assert arrived[after[0]] >= human.decided_at_s - 0.05, (arrived[after[0]], human)
    print(f"screening: reply at the callee {arrived[first]:.2f} s ({arrived[first] - question_end:.2f} s after the "
          f"question), the person's verdict {human.decided_at_s - words_end:.2f} s after their "
          f"words, the agent's audio {arrived[after[0]] - words_end:.2f} s after them")

    answer = record["meta"]["answer"]
    assert [v["verdict"] for v in answer["verdicts"]] == ["voicemail", "screening", "human"]
    assert answer["verdict"] == "screening" and answer["ungated_at_s"] is not None and answer["outcome"] is None
    assert record["meta"]["direction"] == "outbound"


async def test_no_person_after_the_reply_ends_the_call_screening_rejected(tmp_path):
    wait_s = 6.0  # longer than the detector's silence_s (3.5 s): quiet after the reply is no person
    result, gate, heard_verdicts, played, fake, record, ended_at = await _screened_call(
        tmp_path, ["screening.wav", _line(18.0)], tail_s=1.0, hangs_up=True, screening_wait_s=wait_s)  # fmt: skip
    steps = [(v.verdict, v.source) for v in gate.verdicts]
    assert steps == [("voicemail", "audio"), ("screening", "asr")], _said(gate)  # no `silence` un-gated it
    assert [v.verdict for v in heard_verdicts] == ["voicemail", "screening"]
    assert gate.outcome == "screening_rejected" and gate.gated and gate.ungated_at is None
    assert result.call.answer is gate and _answered_outcome(result) == "screening_rejected"
    assert _hung_up(fake), fake.requests  # the agent ended the call through the REST API

    reply = _reply_8k()
    question_end = _speech_end_s(_audio("screening.wav"))
    audio, audible, arrived = _heard(played)
    first, last = _once(audio, reply)
    # the reply and nothing else: the agent stayed gated to the end
    assert [i for i, a in enumerate(audible) if a and not first - 2 <= i <= last + 5] == []
    assert arrived[first] >= question_end, (arrived[first], question_end)
    # the hang-up came no sooner than `screening_wait_s` after the reply (which began after the question; arrival
    # times only lag the callee's stream time)
    reply_end = arrived[last - 1]
    assert ended_at is not None and ended_at >= question_end + len(reply) / 8000 + wait_s, (ended_at, reply_end)
    print(f"screening rejected: the reply reached the callee {arrived[first]:.2f}-{reply_end:.2f} s, the agent hung "
          f"up at {ended_at:.2f} s")

    answer = record["meta"]["answer"]
    assert answer["outcome"] == "screening_rejected" and answer["ungated_at_s"] is None
    assert record["meta"]["outcome"] == "screening_rejected"
