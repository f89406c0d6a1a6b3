"""`[server] max_call_s` on a Twilio call: a real agent (`tiny-random`) ends a stream that would go on past
the limit, closes it (Twilio then ends the call) and its record says `ended_by: "max_duration"`."""

from __future__ import annotations

import asyncio
import json

from duetaspan.agent import Agent
from duetaspan.config import AgentConfig
from duetaspan.testing.sessions import capture_sessions
from tests.adapters.twilio.peer import renumber, serve_agent_on_twilio
from tests.support import load_twilio_stream


async def test_a_call_past_max_call_s_is_ended_by_the_agent(tmp_path):
    config = AgentConfig.model_validate({"server": {"max_call_s": 1.5}})
    agent = Agent(model="tiny-random", device="cpu", router=False, record_dir=tmp_path, seed=0, max_calls=2,
                  config=config)  # fmt: skip
    sessions = capture_sessions(agent)
    async with agent, serve_agent_on_twilio(agent) as (peer, service):
        messages = renumber(load_twilio_stream("self_correction"), "CA-long")  # 5.6 s of caller audio
        n_in = sum(m["event"] == "media" for m in messages)
        url = await peer.stream_url("CA-long")
        async with peer.open_stream(url) as ws:
            got = await peer.play(ws, messages)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not ("CA-long" in service.finished and sessions and sessions[0].record is not None):
            assert loop.time() < deadline, "the call never ended"
            await asyncio.sleep(0.05)
        assert agent.free_slots == agent.max_calls
    record = json.loads((tmp_path / "CA-long.json").read_text())
    assert service.finished["CA-long"].end_reason == "agent ended the call"
    assert got.close_code == 1000  # the server closed the stream
    assert record["summary"]["ended_by"] == "max_duration" and record["complete"] is True
    assert record["summary"]["frames"] < n_in / 4 * 0.7  # it ended well before the caller's audio did
