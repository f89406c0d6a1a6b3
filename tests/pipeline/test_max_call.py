"""`[server] max_call_s` in a plain Pipecat pipeline (`agent.service(call)` inside your own pipeline, the
"Pipecat" transport): the service ends its pipeline (`EndWorkerFrame` upstream) once the call is that old, and
the record says `ended_by: "max_duration"`; the same path ends SIP, Twilio and WebRTC calls."""

from __future__ import annotations

import json

import numpy as np
from pipecat.frames.frames import EndWorkerFrame

from duetaspan.agent import Agent
from duetaspan.config import AgentConfig
from duetaspan.pipeline.session import CallInfo
from tests.pipeline.harness import chunks_at, run_call
from tests.pipeline.scripted_engine import ScriptedEngine


async def test_a_pipecat_pipeline_is_ended_at_max_call_s(tmp_path):
    config = AgentConfig.model_validate({"server": {"max_call_s": 0.6}})
    agent = Agent(engine=ScriptedEngine(), router=False, record_dir=tmp_path, config=config)
    async with agent:
        service = agent.service(CallInfo("pc-long", transport="pipecat"))
        silence = np.zeros(8000 * 2, np.int16)  # 2 s of caller audio: the call would go on past the limit
        result = await run_call(service, chunks_at(silence, 8000), 8000)
    ends = [f for f in result.up if isinstance(f, EndWorkerFrame)]
    assert ends and "maximum call length" in (ends[0].reason or "")
    record = json.loads((tmp_path / "pc-long.json").read_text())
    assert record["summary"]["ended_by"] == "max_duration" and record["complete"] is True
    assert record["summary"]["frames"] < 20  # about 0.6 s of 80 ms frames, not the 2 s fed
