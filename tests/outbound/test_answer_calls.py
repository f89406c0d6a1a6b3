"""Answer detection on calls the agent places, over the Twilio fake (a real WebSocket speaking Twilio's protocol
with real mu-law audio, the committed phone-line fixtures as the callee): the agent's output is gated (mu-law
silence) until the verdict; a person's "hello?" un-gates it and the agent speaks; a greeting with a beep gets
the voicemail message only after the beep, then the call ends `voicemail_left`; the verdicts are in the record,
the `on_answer` handler and `/metrics`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from duetaspan.adapters.twilio.audio import int16_to_ulaw
from duetaspan.agent import Agent
from duetaspan.config import AgentConfig
from duetaspan.observability.metrics import ServeMetrics
from duetaspan.observability.observer import Observability
from duetaspan.outbound import read_wav
from duetaspan.outbound.scheduler import _answered_outcome
from duetaspan.serving import twilio_dial_outcome
from duetaspan.testing.sessions import capture_sessions
from tests.adapters.twilio.peer import ACCOUNT_SID, FakeTwilioRest, Received, renumber, serve_agent_on_twilio
from tests.support import REPO_ROOT, twilio_stream_messages

ANSWERS = REPO_ROOT / "tests" / "fixtures" / "answers"
LABELS = json.loads((ANSWERS / "labels.json").read_text())
TO, FROM = "+15551234567", "+15557654321"
SILENT = 0xFF  # mu-law of 0
Callee = str | Sequence[str | float | np.ndarray]  # what the callee plays: a fixture, or parts (`_audio`)


def _stream(name: Callee, tail_s: float = 3.0) -> list[dict]:
    """The fixture `name`, or the parts in turn (see `_audio`), then `tail_s` of silence, as the callee's
    Twilio Media Stream."""
    parts = [name] if isinstance(name, str) else list(name)
    pcm = np.concatenate([_audio(p) for p in [*parts, tail_s]])
    label = "+".join(p if isinstance(p, str) else f"{len(_audio(p)) / 8000:g}s" for p in parts)
    return twilio_stream_messages(int16_to_ulaw((pcm * 32767).astype(np.int16)), label)


def _audio(part: str | float | np.ndarray) -> np.ndarray:
    """A fixture by name, 8 kHz audio as it is, or that many seconds of digital silence."""
    if isinstance(part, np.ndarray):
        return part.astype(np.float32)
    if not isinstance(part, str):
        return np.zeros(int(part * 8000), dtype=np.float32)
    pcm, rate = read_wav(str(ANSWERS / part))
    assert rate == 8000
    return pcm


def callee_stream(fixture: Callee, tail_s: float, sid: str, form: dict) -> tuple[str, list[dict]]:
    """What a Twilio callee plays for the call `calls.create` made (`form`): the stream URL of its TwiML and
    the fixture's Media Stream for `sid`, whose `start` echoes the TwiML's <Parameter>s as Twilio does (our
    dial says direction outbound-api there)."""
    url = re.search(r'<Stream [^>]*url="([^"]+)"', form["Twiml"]).group(1)
    messages = renumber(_stream(fixture, tail_s), sid, ACCOUNT_SID)
    messages[1]["start"]["customParameters"] = dict(re.findall(r'<Parameter name="([^"]+)" value="([^"]*)"', form["Twiml"]))
    return url, messages


async def _wait(predicate, timeout_s: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def detecting_agent(tmp_path, fixture: Callee, tail_s: float = 3.0, asr: dict | None = None,
                          react: Callable[[list[dict], Received], Iterable[dict]] | None = None, **outbound):  # fmt: skip
    """The agent dialling a Twilio fake callee that plays `fixture` then `tail_s` of silence; with `react`, the
    callee plays `react(messages, got)` instead: the same messages, taken as what reached it (`got`, filled as
    it plays) says, as a person picking up when they hear something would."""
    config = AgentConfig.from_dict({"outbound": {"detect": True, **outbound}, **({"asr": asr} if asr else {})},
                                   base_dir=tmp_path)  # fmt: skip
    agent = Agent(model="tiny-random", device="cpu", router=False, record_dir=tmp_path / "rec", seed=0,
                  max_calls=2, config=config)  # fmt: skip
    agent.observability = Observability(metrics=ServeMetrics(engine=lambda: agent.runner, transports=["twilio"]))
    sessions = capture_sessions(agent)
    played: dict = {}
    box: list = []

    async def callee(sid: str, form: dict) -> None:
        await asyncio.sleep(0.2)
        url, messages = callee_stream(fixture, tail_s, sid, form)
        async with box[0].open_stream(url) as ws:
            played["t0"] = time.monotonic()  # the callee's stream time 0 (media paced in real time from here)
            got = Received()
            played["got"] = await box[0].play(ws, react(messages, got) if react else messages, got=got)

    fake = FakeTwilioRest(on_create=callee)
    async with fake.running() as rest_url, agent, serve_agent_on_twilio(agent, rest_url) as (peer, service):
        box.append(peer)
        agent.twilio_service = service
        service.dialer.on_dial = twilio_dial_outcome(agent, None)
        yield agent, service, sessions, played, fake


def _hung_up(fake) -> bool:
    """The agent ended the call through the REST API (`Status=completed` on the call)."""
    return {"Status": "completed"} in [r["form"] for r in fake.requests]


def is_audible(payload: bytes) -> bool:
    """Whether one 20 ms mu-law media message holds sound, not silence."""
    return sum(b != SILENT for b in payload) > 20


def _first_sound_s(played: dict) -> float | None:
    """When the first of the agent's audio that is not silence reached the callee, in its stream time."""
    got = played["got"]
    for payload, at in zip(got.media_bytes(), got.media_times(), strict=True):
        if is_audible(payload):
            return at - played["t0"]
    return None


async def test_a_person_ungates_the_agent_right_after_hello(tmp_path):
    async with detecting_agent(tmp_path, "hello.wav") as (agent, _service, sessions, played, _fake):
        heard = []
        result = await agent.dial(TO, caller=FROM, ring_timeout_s=20)
        assert result.outcome == "answered"
        await _wait(lambda: sessions and sessions[0].service.answer is not None)
        sessions[0].service.add_event_handler("on_answer", lambda _s, v: heard.append(v))
        await _wait(lambda: "got" in played and sessions[0].record is not None)
        metrics = agent.observability.metrics.render()
    gate = sessions[0].service.answer
    assert gate.verdict.verdict == "human" and not gate.gated and [v.verdict for v in heard] == ["human"]
    assert result.call.answer is gate and _answered_outcome(result) == "human"  # a campaign attempt's outcome
    words_end = LABELS["hello.wav"]["speech_end_s"]
    assert words_end < gate.verdict.decided_at_s < words_end + 1.0
    # nothing the model said went out before the verdict; after it, the agent's audio did
    first = _first_sound_s(played)
    assert first is not None and first >= gate.verdict.decided_at_s - 0.05, (first, gate.verdict)
    print(f"agent audio reached the callee {first - words_end:.2f} s after the end of hello")
    record = json.loads((tmp_path / "rec" / f"{result.call_id}.json").read_text())
    assert record["meta"]["answer"]["verdict"] == "human" and record["meta"]["direction"] == "outbound"
    assert b'duetaspan_answer_verdicts_total{verdict="human"} 1.0' in metrics
    assert b"duetaspan_answer_decision_seconds_count 1.0" in metrics


async def test_voicemail_message_starts_after_the_beep_then_the_call_ends(tmp_path):
    message = ANSWERS / "hello.wav"  # any wav: the message left after the tone
    async with detecting_agent(tmp_path, "greeting_beep.wav", tail_s=12.0, voicemail_wav=str(message)) as (
        agent, _service, sessions, played, fake):  # fmt: skip
        result = await agent.dial(TO, caller=FROM, ring_timeout_s=20)
        await _wait(lambda: "got" in played and sessions and sessions[0].record is not None)
        await _wait(lambda: _hung_up(fake), timeout_s=30)  # the REST hang-up may follow the record's close
    gate = sessions[0].service.answer
    assert [v.verdict for v in gate.verdicts][:2] == ["voicemail", "beep"]
    beep = LABELS["greeting_beep.wav"]["beep_at_s"]
    assert gate.outcome == "voicemail_left" and gate.message_s > 1.0
    assert result.call.answer is gate and _answered_outcome(result) == "voicemail_left"
    first = _first_sound_s(played)
    assert first is not None and first > beep + 0.3, (first, beep)  # never before the beep (it lasts 0.37 s)
    record = json.loads((tmp_path / "rec" / f"{result.call_id}.json").read_text())
    answer = record["meta"]["answer"]
    assert answer["outcome"] == "voicemail_left" and abs(answer["beep_at_s"] - beep) < 0.25
    assert record["meta"]["outcome"] == "voicemail_left"
    assert {"Status": "completed"} in [r["form"] for r in fake.requests]  # hung up through the REST API


async def test_the_transcripts_second_opinion_overturns_a_person_and_closes_the_gate(tmp_path):
    """Cadence calls the short "hello" fixture a person; the (scripted, loopback) ASR hears a greeting's words:
    the gate closes again, and with no message configured the call ends `voicemail_no_message`."""
    from duetaspan.testing.asr import ScriptedASR

    asr = ScriptedASR({"default": "This is Dana. Leave a message."})
    async with asr:
        async with detecting_agent(tmp_path, "hello.wav", tail_s=6.0,
                                   asr={"kind": "transcribe", "url": asr.transcribe_url}) as (
                agent, _service, sessions, played, fake):  # fmt: skip
            result = await agent.dial(TO, caller=FROM, ring_timeout_s=20)
            await _wait(lambda: "got" in played and sessions and sessions[0].record is not None)
            await _wait(lambda: _hung_up(fake), timeout_s=30)
    gate = sessions[0].service.answer
    assert [(v.verdict, v.source) for v in gate.verdicts][:2] == [("human", "audio"), ("voicemail", "asr")]
    assert gate.verdict.verdict == "voicemail" and "leave a message" in gate.verdict.reason
    assert gate.outcome == "voicemail_no_message" and gate.gated
    assert result.call.answer is gate and _answered_outcome(result) == "voicemail_no_message"
    assert asr.requests and asr.requests[0]["sample_rate"] in (16000, 24000)
    record = json.loads((tmp_path / "rec" / f"{result.call_id}.json").read_text())
    assert record["meta"]["answer"]["verdict"] == "voicemail" and record["meta"]["outcome"] == "voicemail_no_message"
    assert {"Status": "completed"} in [r["form"] for r in fake.requests]
