"""A trace per call, for real: an Agent on the tiny-random engine, the real router against the scripted
OpenAI-compatible server, real question capture (Silero VAD + the scripted ASR server), a forced `<ret>`, a
`@tool` with a redacted argument; spans exported to OpenTelemetry's in-memory exporter. The same call's
retrieval figures land in the server's Prometheus registry."""

from __future__ import annotations

import asyncio
import json

import numpy as np
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from pipecat.frames.frames import InputAudioRawFrame
from prometheus_client.parser import text_string_to_metric_families

from duetaspan import tool
from duetaspan.agent import Agent
from duetaspan.model.engine import SamplingParams
from duetaspan.observability.metrics import ServeMetrics
from duetaspan.observability.observer import Observability
from duetaspan.observability.tracing import Tracing
from duetaspan.pipeline.session import CallInfo
from tests.fakes.asr_server import ScriptedASRServer
from tests.fakes.llm_server import ScriptedLLMServer
from tests.pipeline.harness import chunks_at
from tests.pipeline.loopback import LoopbackTransport
from tests.support import load_wav

PHONE = "+15557654321"
QUESTION = "Please book a table for Ann, my number is five five five"


@tool(redact=["phone"])
def book_table(name: str, phone: str) -> str:
    """Book a table.

    Args:
        name: who the table is for.
        phone: the caller's phone number.
    """
    return f"Booked a table for {name}."


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_a_call_gets_a_trace_with_one_child_span_per_retrieval():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    llm = ScriptedLLMServer(
        {
            "rules": [
                {
                    "match": "book",
                    "reply": {
                        "tool_call": {"name": "book_table", "arguments": {"name": "Ann", "phone": PHONE}}
                    },
                }
            ]
        }
    )
    asr = ScriptedASRServer({"default": QUESTION})
    pcm, _ = load_wav("time_tokyo")
    audio = np.concatenate([pcm, np.zeros(int(24000 * 1.2), np.float32)])
    async with llm.serve() as llm_url, asr.serve() as asr_url:
        agent = Agent(
            persona="You are Ada.",
            tools=[book_table],
            builtins=[],
            router={"base_url": f"{llm_url}/v1", "model": "scripted", "api_key_env": None},
            asr={"kind": "transcribe", "url": f"{asr_url}/transcribe"},
            model="tiny-random",
            device="cpu",
            max_calls=1,
            seed=0,
            sampling=SamplingParams(allow_ret=False),  # only the forced <ret> below asks
        )
        metrics = ServeMetrics(engine=lambda: agent.runner, transports=["webrtc"])
        agent.observability = Observability(metrics, Tracing(provider, router_model="scripted"))
        async with agent:
            metrics.watch_registry(agent.registry)
            session = agent.create_session(CallInfo("CA-trace", transport="webrtc"), LoopbackTransport())
            landed = asyncio.Event()
            session.service.add_event_handler("on_span", lambda _s, _f: landed.set())

            async def caller():
                await asyncio.wait_for(session.service.started.wait(), 60)
                loop = asyncio.get_running_loop()
                t0 = loop.time()
                for i, chunk in enumerate(chunks_at(audio, 8000)):
                    await session.worker.queue_frame(InputAudioRawFrame(chunk, 8000, 1))
                    await asyncio.sleep(max(0.0, t0 + (i + 1) * 0.02 - loop.time()))
                session.service.slot.force_ret()  # "the model asks" once the question is over
                await asyncio.wait_for(landed.wait(), 30)
                await asyncio.sleep(0.3)
                await session.end()

            await asyncio.gather(session.run(), caller())
            scraped = metrics.render().decode()
    assert session.outcome == "completed"

    spans = exporter.get_finished_spans()
    by_name: dict[str, list] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    [root] = by_name["conversation"]
    [retrieval] = by_name["retrieval"]
    [stt], [llm_span], [tool_span], [prefill] = (
        by_name["stt"],
        by_name["llm"],
        by_name["tool"],
        by_name["prefill"],
    )
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}  # one trace for the call
    assert root.parent is None
    assert root.attributes["conversation.id"] == "CA-trace"
    assert root.attributes["conversation.type"] == "voice"
    assert root.attributes["duetaspan.transport"] == "webrtc"
    assert root.attributes["duetaspan.call.outcome"] == "completed"
    # <ret> -> capture/ASR -> router LLM -> tool -> span prefill
    assert retrieval.parent.span_id == root.context.span_id
    assert retrieval.attributes["retrieval.outcome"] == "landed"
    assert retrieval.attributes["retrieval.source"] == "tool:book_table"
    for child in (stt, llm_span, prefill):
        assert child.parent.span_id == retrieval.context.span_id
    assert tool_span.parent.span_id == llm_span.context.span_id  # the router called the tool
    assert stt.start_time <= stt.end_time <= llm_span.start_time + 1_000_000
    assert llm_span.start_time <= tool_span.start_time <= tool_span.end_time <= llm_span.end_time + 1_000_000
    assert llm_span.end_time <= prefill.end_time <= retrieval.end_time <= root.end_time
    assert llm_span.attributes["gen_ai.operation.name"] == "chat"
    assert llm_span.attributes["gen_ai.request.model"] == "scripted"
    assert llm_span.attributes["router.decision"] == "tool"
    assert tool_span.attributes["tool.function_name"] == "book_table"
    assert tool_span.attributes["tool.outcome"] == "ok"
    assert tool_span.status.status_code != StatusCode.ERROR
    assert json.loads(tool_span.attributes["tool.arguments"]) == {"name": "Ann", "phone": "[redacted]"}
    assert prefill.attributes["span.n_frames"] > 0
    # redacted arguments only, and no caller words or reference text unless include_text is set
    dumped = json.dumps(
        [dict(s.attributes) for s in spans] + [[dict(e.attributes or {}) for e in s.events] for s in spans]
    )
    assert PHONE not in dumped and "five five five" not in dumped and "Booked a table" not in dumped

    figures = samples(scraped)
    assert figures[("duetaspan_ret_total", ())] >= 1
    assert figures[("duetaspan_spans_total", (("outcome", "landed"),))] == 1
    assert figures[("duetaspan_tool_calls_total", (("outcome", "ok"), ("tool", "book_table")))] == 1
    for stage in ("capture", "router", "tool", "prefill", "total"):
        assert figures[("duetaspan_retrieval_seconds_count", (("stage", stage),))] == 1, stage
    assert figures[("duetaspan_calls_total", (("outcome", "completed"), ("transport", "webrtc")))] == 1
    assert figures[("duetaspan_engine_tick_seconds_count", ())] > 10
