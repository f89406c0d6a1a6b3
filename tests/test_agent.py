"""The Agent API: the documented two-tool phone agent, sessions over a transport, admission, config, errors."""

from __future__ import annotations

import asyncio
import textwrap

import numpy as np
import pytest
from pipecat.frames.frames import InputAudioRawFrame, SpeechOutputAudioRawFrame

import duetaspan.agent as agent_module
from duetaspan.agent import Agent, AgentNotStarted
from duetaspan.pipeline.artifacts import RecordDirError, load_call_record
from duetaspan.pipeline.resample import float_to_int16_bytes
from duetaspan.pipeline.runner import EngineFull
from duetaspan.pipeline.session import CallInfo
from tests.pipeline.loopback import LoopbackTransport
from tests.pipeline.scripted_engine import ScriptedEngine


def _example_code() -> str:
    doc = agent_module.__doc__
    block = doc.split("answering a Twilio number):", 1)[1].split("`agent.run(...)` is", 1)[0]
    return textwrap.dedent(block)


async def _talk(session, seconds: float, rate: int = 8000) -> None:
    """Feed a tone as 20 ms caller chunks at real-time pace once the pipeline runs, then end the call."""
    await asyncio.wait_for(session.service.started.wait(), 10)
    tone = (0.1 * np.sin(np.arange(int(rate * seconds)) * 0.2)).astype(np.float32)
    n = rate // 50
    for i in range(0, tone.size - n + 1, n):
        await session.worker.queue_frame(InputAudioRawFrame(float_to_int16_bytes(tone[i : i + n]), rate, 1))
        await asyncio.sleep(0.02)
    await session.end()


async def test_documented_two_tool_agent_runs_a_call(tmp_path, monkeypatch):
    code = _example_code()
    lines = [ln for ln in code.splitlines() if ln.strip()]
    assert len(lines) < 30, len(lines)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "agent-example", "exec"), namespace)  # the user's code, as written
    agent: Agent = namespace["agent"]
    agent.engine = ScriptedEngine(max_slots=4)  # the 7B model is not available here
    async with agent:
        names = agent.registry.names()
        assert {"opening_hours", "book_table", "get_time", "calculate"} <= set(names)
        booking = agent.registry.get("book_table")
        assert booking.spec.side_effect and "people" in booking.spec.parameters["properties"]
        transport = LoopbackTransport()
        session = agent.create_session(
            CallInfo("call-1", caller="+15550001"), transport, audio_in_sample_rate=8000
        )
        record, _ = await asyncio.gather(session.run(), _talk(session, 1.5))
    assert agent.runner.active_calls == 0
    audio = [f for f in transport.received if isinstance(f, SpeechOutputAudioRawFrame)]
    assert len(audio) >= 15
    assert record["complete"] and record["meta"]["caller"] == "+15550001"
    assert (tmp_path / "calls" / "call-1.wav").exists()
    assert load_call_record(tmp_path / "calls", "call-1")["summary"]["input"]["frames_in"] >= 15


async def test_engine_full_refuses_the_extra_call():
    agent = Agent(persona="Hi", engine=ScriptedEngine(max_slots=2), max_calls=1, builtins=[])
    with pytest.raises(AgentNotStarted):
        agent.create_session("too-early")
    async with agent:
        first = agent.create_session("A", LoopbackTransport())
        await first.open()
        second = agent.create_session("B", LoopbackTransport())
        with pytest.raises(EngineFull, match="busy"):
            await second.open()
        assert agent.free_slots == 0
        await first.service.close()
        await second.open()  # the slot is free again
        await second.service.close()


async def test_from_config_and_record_dir_checked_at_start(tmp_path):
    (tmp_path / "agent.toml").write_text(
        textwrap.dedent(
            """
            [persona]
            name = "Ada"
            prompt = "You are Ada."
            [tools]
            builtins = ["calculate"]
            [recording]
            enabled = true
            dir = "file/calls"
            """
        )
    )
    (tmp_path / "file").write_text("a file where the record dir should be")
    agent = Agent.from_config(tmp_path / "agent.toml", engine=ScriptedEngine())
    assert agent.config.persona.prompt == "You are Ada." and agent.persona().text == "You are Ada."
    with pytest.raises(RecordDirError, match="not writable"):
        await agent.start()
    ok = Agent.from_config(tmp_path / "agent.toml", engine=ScriptedEngine(), record_dir=tmp_path / "rec")
    async with ok:
        assert ok.registry.names() == ["calculate"] and ok.record_dir == tmp_path / "rec"


async def test_from_config_loads_explicit_checkpoint_files(tmp_path):
    """`[model]` with checkpoint + lm_config + mimi + tokenizer (the layout of a local download) starts."""
    import json
    import shutil

    import torch

    from duetaspan.model.checkpoint import save_lm
    from duetaspan.model.lm import LMModel
    from duetaspan.model.lm_config import LMConfig
    from duetaspan.model.mimi import random_mimi, save_mimi
    from duetaspan.model.tokenizer import tiny_tokenizer_path

    cfg = LMConfig.from_lm_kwargs({**LMConfig.preset("tiny-random").to_lm_kwargs(), "context": 64})
    torch.manual_seed(0)
    (tmp_path / "weights").mkdir()
    save_lm(LMModel(cfg), tmp_path / "weights" / "lm.pt")
    (tmp_path / "lm_kwargs.json").write_text(json.dumps(cfg.to_lm_kwargs()))  # not beside the weights
    save_mimi(random_mimi("tiny", seed=0), tmp_path / "mimi.safetensors")
    shutil.copy(tiny_tokenizer_path(tmp_path / "cache"), tmp_path / "tokenizer.model")
    (tmp_path / "agent.toml").write_text(
        textwrap.dedent(
            """
            [model]
            checkpoint = "weights/lm.pt"
            lm_config = "lm_kwargs.json"
            mimi = "mimi.safetensors"
            tokenizer = "tokenizer.model"
            device = "cpu"
            """
        )
    )
    agent = Agent.from_config(tmp_path / "agent.toml", router=False, max_calls=1)
    async with agent:
        assert agent.engine.lm.config.context == 64
