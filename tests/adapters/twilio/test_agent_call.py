"""A recorded Twilio call against a real agent (`tiny-random` engine, in process) over real sockets: caller
audio in, the model's audio back as paced mu-law, marks, DTMF into the call context, `stop` ending the call
with its slot freed and its artifacts complete, and a tool's `end_call` hanging up through Twilio's REST API."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import wave

import pytest

from duetaspan.adapters.twilio.audio import CHUNK_BYTES
from duetaspan.agent import Agent
from duetaspan.testing.sessions import capture_sessions
from tests.adapters.twilio.peer import (
    ACCOUNT_SID,
    FakeTwilioRest,
    renumber,
    serve_agent_on_twilio,
)
from tests.support import load_twilio_stream, wait_until

FIXTURE = "time_tokyo"


@contextlib.asynccontextmanager
async def agent_server(record_dir, rest_url):
    agent = Agent(model="tiny-random", device="cpu", router=False, record_dir=record_dir, seed=0, max_calls=2)
    sessions = capture_sessions(agent)
    async with agent, serve_agent_on_twilio(agent, rest_url) as (peer, service):
        yield peer, service, agent, sessions


def _dtmf(stream_sid: str, digit: str) -> dict:
    return {"event": "dtmf", "streamSid": stream_sid, "dtmf": {"track": "inbound_track", "digit": digit}}


@pytest.mark.serial  # asserts the frames the engine makes in real time (wav length): CPU quiet
async def test_recorded_call_runs_on_the_agent_end_to_end(tmp_path):
    fake = FakeTwilioRest()
    async with (
        fake.running() as rest_url,
        agent_server(tmp_path, rest_url) as (peer, service, agent, sessions),
    ):
        messages = renumber(load_twilio_stream(FIXTURE), "CA-agent")
        sid = messages[1]["streamSid"]
        messages = [*messages[:50], _dtmf(sid, "1"), *messages[50:100], _dtmf(sid, "#"), *messages[100:]]
        n_in = sum(m["event"] == "media" for m in messages)
        url = await peer.stream_url("CA-agent")
        async with peer.open_stream(url) as ws:
            got = await peer.play(ws, messages, linger_s=0.3)
        for _ in range(100):
            if "CA-agent" in service.finished and sessions[0].record is not None:
                break
            await asyncio.sleep(0.05)
        call = service.finished["CA-agent"]
        assert agent.free_slots == agent.max_calls  # the slot is free again
        context = sessions[0].context
    assert got.close_code == 1000 and call.end_reason == "stop"
    # each 80 ms frame of the model's audio came back as four 20 ms mu-law chunks (bar the few still queued
    # when `stop` came); how many frames the engine makes in real time on a loaded machine is not checked here
    record = json.loads((tmp_path / "CA-agent.json").read_text())
    frames = record["summary"]["frames"]
    payloads = got.media_bytes()
    assert all(len(p) == CHUNK_BYTES for p in payloads)
    assert 10 <= frames <= n_in / 4 + 15
    # a loaded machine's catch-up ticks can leave a few more frames queued at `stop` (the runner runs at most
    # 3 catch-up ticks after an overrun, plus the one in flight)
    assert 4 * frames - 24 <= len(payloads) <= 4 * frames, (len(payloads), frames)
    # paced at real time: never ahead of the clock by more than the 40 ms lead (+ scheduling slack)
    times = got.media_times()
    ahead = max((i * 0.02) - (t - times[0]) for i, t in enumerate(times))
    assert ahead <= 0.04 + 0.03
    marks = got.of("mark")
    assert len(marks) in (len(payloads) // 50, len(payloads) // 50 - 1)  # one playout mark per second
    assert call.stats.marks_played == len(marks)  # each echoed by the peer, acknowledged by the server
    assert context.dtmf == "1#"
    assert call.dtmf_digits == ["1", "#"]
    # artifacts complete
    assert record["complete"] is True
    assert record["meta"] == {"caller": "+15550001111", "called": "+15552223333", "transport": "twilio"}
    with wave.open(str(tmp_path / "CA-agent.wav")) as w:
        seconds = w.getnframes() / w.getframerate()
    assert seconds == pytest.approx(n_in * 0.02, abs=1.0)
    assert fake.requests == []  # nobody asked to hang up


async def test_end_call_tool_action_hangs_up_through_rest(tmp_path):
    fake = FakeTwilioRest()
    async with (
        fake.running() as rest_url,
        agent_server(tmp_path, rest_url) as (peer, service, _agent, sessions),
    ):
        # the longest fixture (5.6 s): the hang-up comes ACTION_GRACE_S after the tool asks, well before `stop`
        messages = renumber(load_twilio_stream("self_correction"), "CA-bye")
        url = await peer.stream_url("CA-bye")
        async with peer.open_stream(url) as ws:
            play = asyncio.create_task(peer.play(ws, messages))
            # the call is up: its session exists and the Twilio bridge has bound its call-control actions
            bound = lambda: bool(sessions) and sessions[0].context.on_action is not None  # noqa: E731
            await wait_until(lambda: bound() or play.done(), what="the call's actions to be bound")
            assert bound(), "the call never reached the agent"
            sessions[0].context.request_action("end_call", reason="caller said goodbye")  # as the tool does
            got = await play
        await wait_until(lambda: "CA-bye" in service.finished, what="the call to finish")
        call = service.finished["CA-bye"]
    assert call.end_reason == "end_call: caller said goodbye"
    assert got.close_code == 1000
    assert [r["form"] for r in fake.requests] == [{"Status": "completed"}]
    assert fake.requests[0]["path"] == f"/2010-04-01/Accounts/{ACCOUNT_SID}/Calls/CA-bye.json"
    assert len(got.of("media")) < 0.8 * sum(m["event"] == "media" for m in messages)
    assert json.loads((tmp_path / "CA-bye.json").read_text())["complete"] is True


async def test_bot_speaking_frames_and_one_clear_per_barge_in(tmp_path):
    """The scripted engine speaks 8 frames and is silent for 8 while the caller talks: the transport reports
    each stretch of agent speech as BotStarted/StoppedSpeakingFrame (to the service, upstream), and each time
    the model stops for the caller the service's InterruptionFrame becomes exactly one Twilio `clear`."""
    from pipecat.frames.frames import BotStartedSpeakingFrame, BotStoppedSpeakingFrame

    from tests.pipeline.scripted_engine import ScriptedEngine

    agent = Agent(
        engine=ScriptedEngine(max_slots=1, speak=(8, 8)), router=False, record_dir=tmp_path, max_calls=1
    )
    sessions, seen = [], []
    create = agent.create_session

    def capture(*args, **kwargs):
        session = create(*args, **kwargs)
        sessions.append(session)

        @session.service.event_handler("on_before_process_frame")
        async def _seen(_service, frame):
            if isinstance(frame, BotStartedSpeakingFrame | BotStoppedSpeakingFrame):
                seen.append(type(frame))

        return session

    agent.create_session = capture
    async with agent, serve_agent_on_twilio(agent) as (peer, _service):
        url = await peer.stream_url("CA-speak")
        async with peer.open_stream(url) as ws:
            # book_table: the caller talks from 0.5 s to 4 s almost without a pause
            got = await peer.play(ws, renumber(load_twilio_stream("book_table"), "CA-speak"), linger_s=0.3)
        for _ in range(100):
            if sessions and sessions[0].record is not None:
                break
            await asyncio.sleep(0.05)
    barge_ins = sessions[0].service.stats["barge_ins"]
    assert barge_ins >= 1 and len(got.of("clear")) == barge_ins
    assert seen.count(BotStartedSpeakingFrame) >= 2
    assert seen[0] is BotStartedSpeakingFrame
    assert all(a is not b for a, b in itertools.pairwise(seen))  # started, stopped, started, ...
