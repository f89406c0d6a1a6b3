"""Spans through the whole pipeline: an Agent on the tiny-random engine, the real router against the scripted
OpenAI-compatible server, real question capture (Silero VAD + the scripted ASR server), a forced `<ret>`."""

from __future__ import annotations

import asyncio

import numpy as np
from pipecat.frames.frames import InputAudioRawFrame, SpeechOutputAudioRawFrame

from duetaspan.agent import Agent
from duetaspan.model.engine import SamplingParams
from duetaspan.pipeline.frames import RetFrame, SpanFrame
from duetaspan.pipeline.session import CallInfo
from tests.fakes.asr_server import ScriptedASRServer
from tests.fakes.llm_server import ScriptedLLMServer
from tests.pipeline.harness import chunks_at
from tests.pipeline.loopback import LoopbackTransport
from tests.support import load_wav


async def test_forced_ret_is_routed_to_a_tool_and_lands_as_a_span(tmp_path):
    llm = ScriptedLLMServer(
        {
            "rules": [
                {
                    "match": "tokyo",
                    "reply": {"tool_call": {"name": "get_time", "arguments": {"place": "Tokyo"}}},
                }
            ]
        }
    )
    asr = ScriptedASRServer({"default": "What time is it in Tokyo at the moment?"})
    pcm, _ = load_wav("time_tokyo")
    audio = np.concatenate([pcm, np.zeros(int(24000 * 1.2), np.float32)])  # the caller then waits
    async with llm.serve() as llm_url, asr.serve() as asr_url:
        agent = Agent(
            persona="You are Ada.",
            builtins=["get_time"],
            router={"base_url": f"{llm_url}/v1", "model": "scripted", "api_key_env": None},
            asr={"kind": "transcribe", "url": f"{asr_url}/transcribe"},
            model="tiny-random",
            device="cpu",
            max_calls=1,
            seed=0,
            sampling=SamplingParams(allow_ret=False),  # only the forced <ret> below asks
            record_dir=tmp_path,
        )
        async with agent:
            transport = LoopbackTransport()
            session = agent.create_session(CallInfo("CA-route", caller="+15550001"), transport)
            spans: list[SpanFrame] = []
            landed = asyncio.Event()

            @session.service.event_handler("on_span")
            async def _on_span(_service, frame):
                spans.append(frame)
                landed.set()

            async def caller():
                await asyncio.wait_for(session.service.started.wait(), 60)
                loop = asyncio.get_running_loop()
                t0 = loop.time()
                for i, chunk in enumerate(chunks_at(audio, 8000)):
                    frame = InputAudioRawFrame(chunk, 8000, 1)
                    await session.worker.queue_frame(frame)
                    await asyncio.sleep(max(0.0, t0 + (i + 1) * 0.02 - loop.time()))
                session.service.slot.force_ret()  # "the model asks" once the question is over
                await asyncio.wait_for(landed.wait(), 20)
                await asyncio.sleep(0.3)
                await session.end()

            record, _ = await asyncio.gather(session.run(), caller())
    span = spans[0]
    assert "Tokyo" in span.reference and span.reference.startswith("(tool result)")
    assert span.tool == "get_time" and span.arguments == {"place": "Tokyo"}
    assert "Tokyo" in (span.question or "") and span.n_frames > 0
    down = transport.received
    assert [f for f in down if isinstance(f, SpanFrame)] and [f for f in down if isinstance(f, RetFrame)]
    assert [f for f in down if isinstance(f, SpeechOutputAudioRawFrame)]
    assert asr.requests, "the caller's utterance was transcribed"
    # the artifact has the span, at the frame it landed, and the caller's utterance
    assert record["complete"]
    assert record["spans"][0]["reference"] == span.reference
    assert record["spans"][0]["frame_index"] == span.frame_index
    assert any(f["i"] == span.frame_index for f in record["frames"])
    assert record["rets"] and record["rets"][0]["frame_index"] < span.frame_index
    assert any("Tokyo" in u["text"] for u in record["caller_utterances"])
    kinds = {e.get("kind") for e in record["retrieval_events"]}
    assert {"question", "router", "tool", "delivered"} <= kinds, kinds
