"""`agent.service(call)`: the duplex model for a user's own Pipecat pipeline, and what it emits there.

The end-to-end check on Pipecat's own Twilio stack (transport, serializer, aggregators) is
examples/pipecat_twilio/test_pipecat_twilio.py; here: the contract of `agent.service`, the pipeline's
output rate, the frames around agent speech, and the log bridge.
"""

from __future__ import annotations

import datetime as dt
import logging

import numpy as np
import pytest
from loguru import logger as loguru_logger
from pipecat.frames.frames import (
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    SpeechOutputAudioRawFrame,
    TranscriptionFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
)

from duetaspan import Agent, CallInfo
from duetaspan.agent import AgentNotStarted
from duetaspan.logs import bridge_logging, call_context
from duetaspan.pipeline.artifacts import load_call_record
from duetaspan.pipeline.service import DuetaSpanService
from tests.fakes.asr_server import ScriptedASRServer
from tests.fakes.llm_server import ScriptedLLMServer
from tests.pipeline.harness import chunks_at, run_call
from tests.pipeline.scripted_engine import ScriptedEngine
from tests.support import load_wav

TURN_FRAMES = (LLMFullResponseStartFrame, TTSStartedFrame, TTSStoppedFrame, LLMFullResponseEndFrame)


async def test_agent_service_contract(tmp_path):
    engine = ScriptedEngine(max_slots=2)
    llm, asr = ScriptedLLMServer({}), ScriptedASRServer({"default": ""})
    async with llm.serve() as llm_url, asr.serve() as asr_url:
        agent = Agent(
            persona="You are Ada.",
            engine=engine,
            router={"base_url": f"{llm_url}/v1", "model": "scripted", "api_key_env": None},
            asr={"kind": "transcribe", "url": f"{asr_url}/transcribe"},
            record_dir=tmp_path,
        )
        with pytest.raises(AgentNotStarted):
            agent.service("CA-early")
        async with agent:
            by_info = agent.service(CallInfo("CA-info", caller="+15550001111"))
            by_id = agent.service("CA-id")
            for service, call_id in ((by_info, "CA-info"), (by_id, "CA-id")):
                assert isinstance(service, DuetaSpanService) and service.call_id == call_id
                assert service.runner is agent.runner and service.slot is None  # the slot comes at StartFrame
                assert (
                    service.retrieval.manager.router is agent.shared["router"]
                )  # the agent's router + tools
                assert service._persona.text == "You are Ada."
                assert service.context.call_id == call_id
            assert by_info.caller.user_id == "+15550001111" and by_id.caller.user_id == "CA-id"
            silence = chunks_at(np.zeros(24000, np.float32), 8000)
            await run_call(by_info, silence, 8000, end="end")
            await run_call(by_id, silence, 8000, end="cancel")
            assert agent.free_slots == 2 and sorted(engine.closed) == sorted(engine.opened) == [0, 0]
    for call_id, how in (("CA-info", "end"), ("CA-id", "cancel")):
        record = load_call_record(tmp_path, call_id)
        assert record["complete"] and record["summary"]["ended_by"] == how and record["frames"]


async def test_output_follows_the_pipeline_rate_and_agent_speech_is_bracketed():
    pcm, _ = load_wav("greeting")
    engine = ScriptedEngine(speak=(8, 8), word_every=2)
    async with Agent(engine=engine, router=False) as agent:
        service = agent.service("CA-rate")
        result = await run_call(service, chunks_at(pcm, 8000), 8000, out_rate=8000)
    audio = result.of(SpeechOutputAudioRawFrame)
    # 80 ms at 8 kHz per tick, resampled once by the service (no transport or serializer resampling after it)
    assert audio and all(f.sample_rate == 8000 for f in audio)
    assert sum(len(f.audio) == 1280 for f in audio) >= len(audio) - 2
    kinds = [type(f) for f in result.down if isinstance(f, (*TURN_FRAMES, LLMTextFrame, TTSTextFrame))]
    starts, ends = kinds.count(LLMFullResponseStartFrame), kinds.count(LLMFullResponseEndFrame)
    assert starts >= 2 and starts == ends == kinds.count(TTSStartedFrame) == kinds.count(TTSStoppedFrame)
    turn = [k for k in kinds if k in TURN_FRAMES]
    assert turn == list(TURN_FRAMES[:2] + TURN_FRAMES[2:]) * starts  # start, started, stopped, end, ...
    words = [f for f in result.down if isinstance(f, LLMTextFrame | TTSTextFrame)]
    assert words and all(f.text == " hi" for f in words)
    assert all(not f.append_to_context for f in words if isinstance(f, LLMTextFrame))  # TTSText is recorded
    assert all(f.includes_inter_frame_spaces for f in words if isinstance(f, TTSTextFrame))


async def test_caller_turns_and_transcripts_with_an_asr_and_no_router():
    pcm, _ = load_wav("greeting")
    caller = np.concatenate([pcm, np.zeros(24000, np.float32)])  # then a second of silence: the turn ends
    asr = ScriptedASRServer({"default": "Hello? Hi, who am I speaking with?"})
    async with asr.serve() as asr_url:
        agent = Agent(
            engine=ScriptedEngine(), router=False, asr={"kind": "transcribe", "url": f"{asr_url}/transcribe"}
        )
        async with agent:
            service = agent.service(CallInfo("CA-asr", caller="+15550001111"))
            result = await run_call(service, chunks_at(caller, 8000), 8000, tail_s=0.5)
    # the VAD's turns, broadcast: the downstream copies reach the end of the pipeline, the upstream ones its start
    for frames in (result.down, result.up):
        kinds = [
            type(f) for f in frames if isinstance(f, UserStartedSpeakingFrame | UserStoppedSpeakingFrame)
        ]
        assert kinds[:2] == [UserStartedSpeakingFrame, UserStoppedSpeakingFrame]
    (said,) = [f for f in result.up if isinstance(f, TranscriptionFrame)]  # upstream, to the user aggregator
    assert (
        said.text == "Hello? Hi, who am I speaking with?"
        and said.user_id == "+15550001111"
        and said.finalized
    )
    assert dt.datetime.fromisoformat(said.timestamp).tzinfo is not None
    assert len(asr.requests) == 1


def test_log_bridge_puts_loguru_and_logging_in_one_stream_with_the_call_id():
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    bridge = bridge_logging(logging.DEBUG, handler=Keep())
    try:
        with call_context("CA-log"):
            loguru_logger.bind().info("from pipecat's side")
            logging.getLogger("duetaspan.test").info("from ours")
        logging.getLogger("duetaspan.test").info("outside a call")
    finally:
        bridge.close()
    mine = [(r.name, r.getMessage(), r.call_id) for r in records if "side" in r.getMessage() or "ours" in
            r.getMessage() or "outside" in r.getMessage()]  # fmt: skip
    assert mine == [
        (__name__, "from pipecat's side", "CA-log"),
        ("duetaspan.test", "from ours", "CA-log"),
        ("duetaspan.test", "outside a call", "-"),
    ]
