"""A real agent (`tiny-random`, in process) on SIP calls that never end by themselves: a caller gone silent
without BYE is hung up by the media timeout, one that streams for ever by `[server] max_call_s`; each with
BYE (SIPp waits for it) and its record's `ended_by` (`media_timeout`, `max_duration`). SIPp is the caller."""

from __future__ import annotations

import json

import pytest

from duetaspan.adapters.sip.bridge import agent_call_handler
from duetaspan.agent import Agent
from duetaspan.config import AgentConfig
from duetaspan.testing.sessions import capture_sessions
from tests.adapters.sip.leaks import checked_endpoint
from tests.adapters.sip.peer import needs_sipp, run_sipp, scenario, sip_e2e, wait_for

pytestmark = [needs_sipp, sip_e2e, pytest.mark.slow]


def record_of(tmp_path, call) -> dict:
    return json.loads((tmp_path / f"{call.call_sid.replace('@', '_')}.json").read_text())


async def test_silent_and_endless_callers_are_hung_up_with_their_reason(tmp_path):
    config = AgentConfig.model_validate({"server": {"max_call_s": 3.0}})
    agent = Agent(model="tiny-random", device="cpu", router=False, record_dir=tmp_path, seed=0, max_calls=2,
                  config=config)  # fmt: skip
    sessions = capture_sessions(agent)
    silence = tmp_path / "silence.raw"
    silence.write_bytes(b"\xff" * 8000)
    async with agent, checked_endpoint(agent_call_handler(agent), max_calls=2, media_timeout_s=1.0) as ep:
        silent = scenario("bye_from_agent", tmp_path, USER="agent", BYE_TIMEOUT_MS=20000)
        got_silent = await run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf", str(silent), "-m", "1", name="silent")
        await wait_for(lambda: len(ep.finished) == 1 and sessions and sessions[0].record is not None,
                       timeout_s=60, what="the silent call's record")  # fmt: skip
        endless = scenario("caller_streams", tmp_path, USER="agent", AUDIO=silence, PT=0, BYE_TIMEOUT_MS=30000)
        got_endless = await run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf", str(endless), "-m", "1",
                                     name="endless")  # fmt: skip
        await wait_for(lambda: len(ep.finished) == 2 and len(sessions) == 2 and sessions[1].record is not None,
                       timeout_s=60, what="the endless call's record")  # fmt: skip
        assert agent.free_slots == agent.max_calls
    first, second = ep.finished.values()
    assert got_silent.rc == 0, got_silent.output + got_silent.errors  # our BYE came and was answered
    assert got_endless.rc == 0, got_endless.output + got_endless.errors
    assert first.end_reason == "media_timeout"
    assert record_of(tmp_path, first)["summary"]["ended_by"] == "media_timeout"
    assert record_of(tmp_path, second)["summary"]["ended_by"] == "max_duration"
    assert second.ended_at is not None and 3.0 <= second.ended_at - second.media.started_at < 15.0
    assert record_of(tmp_path, second)["rtp"]["packets_received"] > 50  # it was talking all along
