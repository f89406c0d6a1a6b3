"""Spans through the whole pipeline: an Agent on the tiny-random engine, the real router against the scripted
OpenAI-compatible server, real question capture (Silero VAD + the scripted ASR server), a forced `<ret>`;
driven with `duetaspan.testing` (the plugin's engine and servers, a scripted caller on the in-process
transport)."""

from __future__ import annotations

from pipecat.frames.frames import SpeechOutputAudioRawFrame

from duetaspan.agent import Agent
from duetaspan.pipeline.frames import RetFrame, SpanFrame
from duetaspan.testing import scripted_call, tool_call


async def test_forced_ret_is_routed_to_a_tool_and_lands_as_a_span(tmp_path, tiny_engine, scripted_llm,
                                                                  scripted_asr):  # fmt: skip
    scripted_llm.on("tokyo", tool_call("get_time", place="Tokyo"))
    agent = Agent(persona="You are Ada.", builtins=["get_time"], engine=tiny_engine, max_calls=1, seed=0,
                  record_dir=tmp_path)  # fmt: skip
    async with scripted_call(
        agent, "+15550001", llm=scripted_llm, asr=scripted_asr, call_id="CA-route"
    ) as call:
        await call.say("time_tokyo", silence_s=1.2)  # "What time is it in Tokyo at the moment?", then waits
        outcome = await call.ask()  # "the model asks" once the question is over
    outcome.expect_tool("get_time", place="Tokyo").expect_span(contains="Tokyo")
    span = outcome.frame
    assert span.reference.startswith("(tool result)")
    assert span.tool == "get_time" and span.arguments == {"place": "Tokyo"}
    assert "Tokyo" in (span.question or "") and span.n_frames > 0
    down = call.received
    assert [f for f in down if isinstance(f, SpanFrame)] and [f for f in down if isinstance(f, RetFrame)]
    assert [f for f in down if isinstance(f, SpeechOutputAudioRawFrame)]
    assert scripted_asr.requests, "the caller's utterance was transcribed"
    # the artifact has the span, at the frame it landed, and the caller's utterance
    record = call.record
    assert record is not None and record["complete"]
    assert record["spans"][0]["reference"] == span.reference
    assert record["spans"][0]["frame_index"] == span.frame_index
    assert any(f["i"] == span.frame_index for f in record["frames"])
    assert record["rets"] and record["rets"][0]["frame_index"] < span.frame_index
    assert any("Tokyo" in u["text"] for u in record["caller_utterances"])
    kinds = {e.get("kind") for e in record["retrieval_events"]}
    assert {"question", "router", "tool", "delivered"} <= kinds, kinds
