"""A landed span keeps its identity whatever the engine does to its text, and a persona re-pin is not a span.

The engine normalises a reference (curly quotes, dashes, ellipses) and caps it at its token limit, so the
text that lands is not the text that was delivered: the service matches them by the id it gave at delivery.
A persona re-pin (calls longer than the context window) lands through the same path, but no `<ret>` asked
for it: it is its own frame, record list, metric and trace event.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from duetaspan.model.engine import Persona
from duetaspan.observability.metrics import ServeMetrics
from duetaspan.observability.observer import Observability
from duetaspan.observability.tracing import Tracing
from duetaspan.pipeline.artifacts import CallRecorder, load_call_record
from duetaspan.pipeline.frames import PersonaPinFrame, SpanFrame
from duetaspan.pipeline.runner import EngineRunner
from duetaspan.pipeline.service import DuetaSpanService
from duetaspan.spans.reference import DEFAULT_MAX_TOKENS
from tests.model.engine_support import GREEDY, caller_audio, engine, tiny_parts
from tests.pipeline.harness import chunks_at, run_call
from tests.support import load_wav

pytestmark = pytest.mark.usefixtures("one_thread")

CURLY = "(tool result) It\u2019s 22 \u00b0C \u2014 sunny\u2026 \u201cperfect\u201d beach weather."
LONG = "(tool result) " + " ".join(f"item{i} costs {i} euros;" for i in range(200))  # far past the cap


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return tiny_parts(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def small_context_parts(tmp_path_factory):
    return tiny_parts(tmp_path_factory.mktemp("tok48"), context=48)


def test_the_engine_returns_the_id_it_was_given_with_a_rewritten_text(parts):
    eng = engine(parts, max_slots=1, max_span=64)
    slot = eng.open_slot(Persona(text="You are Ada."), sampling=GREEDY, seed=1)
    assert eng.inject(slot, CURLY, span_id=7) and eng.inject(slot, LONG, span_id=8)
    assert len(eng.tokenizer.encode(LONG)) > 400
    landed = []
    for frame in caller_audio(4):
        landed += eng.step({slot: frame})[slot].spans
    [curly, long] = [s for s in landed if s.kind == "reference"]
    assert curly.span_id == 7 and curly.reference != CURLY  # normalised on the way in
    assert long.span_id == 8 and long.truncated and long.reference != LONG


class Deliver:
    """A retrieval that answers its first `<ret>` with the references it was given, as the router would (a
    `<ret>` the model samples on its own later gets nothing)."""

    references: tuple[str, ...] = ()

    def __init__(self, deliver, on_event) -> None:
        self.deliver = deliver
        self.answered = False

    def feed(self, pcm, t) -> None:
        pass

    async def on_ret(self, frame_index: int, t: float, caller_t: float | None = None) -> None:
        if self.answered:
            return
        self.answered = True
        for rid, reference in enumerate(self.references, start=1):
            meta = {"question": "weather?", "tool": f"tool{rid}", "arguments": {"n": rid}, "retrieval_id": rid}
            assert self.deliver(reference, meta)

    def close(self) -> None:
        pass


async def test_a_normalised_and_a_truncated_span_land_with_their_tool_and_retrieval(tmp_path):
    from duetaspan.model.engine import DuplexEngine

    eng = DuplexEngine.load("tiny-random", device="cpu", max_slots=1, seed=0)
    Deliver.references = (CURLY, LONG)
    pcm, _ = load_wav("weather_sydney")
    spans: list[SpanFrame] = []

    async def force(worker):
        await asyncio.wait_for(service.started.wait(), 60)
        await asyncio.sleep(0.5)
        service.slot.force_ret()

    async with EngineRunner(eng) as runner:
        service = DuetaSpanService(
            runner, call_id="CA-ids", persona=Persona(text="You are Ada."), retrieval=Deliver,
            recorder=CallRecorder(tmp_path, "CA-ids"),
        )  # fmt: skip
        service.add_event_handler("on_span", lambda _s, f: spans.append(f))
        await run_call(service, chunks_at(pcm[: 24000 * 2], 8000), 8000, tail_s=1.5, during=force)
    assert len(spans) == 2, spans
    curly, long = sorted(spans, key=lambda f: f.retrieval_id or 0)
    assert (curly.tool, curly.arguments, curly.retrieval_id, curly.span_id) == ("tool1", {"n": 1}, 1, 1)
    assert (long.tool, long.arguments, long.retrieval_id, long.truncated) == ("tool2", {"n": 2}, 2, True)
    assert curly.reference != CURLY and "22" in curly.reference
    assert curly.latency_ms is not None and curly.question == "weather?"
    record = load_call_record(tmp_path, "CA-ids")
    assert [s["tool"] for s in record["spans"]] == ["tool1", "tool2"]
    assert [s["retrieval_id"] for s in record["spans"]] == [1, 2]


def test_the_trace_links_a_span_whose_text_changed_to_its_retrieval():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace = Tracing(provider, router_model="scripted").call("CA-t", transport="webrtc")
    trace.event({"kind": "ret", "retrieval_id": 3, "frame_index": 10, "t": 0.8, "at_ms": 0})
    trace.event({"kind": "delivered", "retrieval_id": 3, "reference": CURLY, "at_ms": 900})
    trace.span_landed("(tool result) It's 22 C - sunny... \"perfect\" beach weather.", 4.0, 12, 3)
    trace.end("completed")
    [retrieval] = [s for s in exporter.get_finished_spans() if s.name == "retrieval"]
    assert retrieval.attributes["retrieval.outcome"] == "landed"
    assert [s for s in exporter.get_finished_spans() if s.name == "prefill"]


def _figures(text: str) -> dict:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_a_persona_re_pin_is_its_own_event_everywhere(small_context_parts, tmp_path):
    """On a 48-frame window the persona is re-pinned every few seconds: never an `on_span`, a span count,
    a retrieval latency or a record span, but a `PersonaPinFrame`, `persona_pins`, a metric and a trace event."""
    eng = engine(small_context_parts, max_slots=1, max_span=64)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    metrics = ServeMetrics(engine=None, transports=["webrtc"])
    observer = Observability(metrics, Tracing(provider, router_model="scripted")).call("CA-pin", transport="webrtc")
    spans, pins = [], []
    audio = np.concatenate([load_wav("greeting")[0], np.zeros(24000 * 3, np.float32)])
    async with EngineRunner(eng) as runner:
        service = DuetaSpanService(
            runner, call_id="CA-pin", persona=Persona(text="You are Ada."), sampling=GREEDY,
            recorder=CallRecorder(tmp_path, "CA-pin"),
        )  # fmt: skip
        observer.bind(service)
        service.add_event_handler("on_span", lambda _s, f: spans.append(f))
        service.add_event_handler("on_persona_pin", lambda _s, f: pins.append(f))
        result = await run_call(service, chunks_at(audio, 8000), 8000, tail_s=0.5)
    observer.trace.end("completed")
    assert pins and not spans, (pins, spans)
    assert result.of(PersonaPinFrame) and not result.of(SpanFrame)
    assert all(p.n_frames > 0 for p in pins)
    record = load_call_record(tmp_path, "CA-pin")
    assert len(record["persona_pins"]) == len(pins) and record["spans"] == []
    figures = _figures(metrics.render().decode())
    assert figures[("duetaspan_persona_pins_total", ())] == len(pins)
    assert figures[("duetaspan_spans_total", (("outcome", "landed"),))] == 0
    assert figures[("duetaspan_retrieval_seconds_count", (("stage", "prefill"),))] == 0
    [root] = [s for s in exporter.get_finished_spans() if s.name == "conversation"]
    assert [e.name for e in root.events].count("persona_pin") == len(pins)
    assert not [s for s in exporter.get_finished_spans() if s.name in ("retrieval", "prefill")]
    from duetaspan.view.timeline import build_view

    view = build_view(record)
    assert view["counts"]["persona_pins"] == len(pins) and view["counts"]["spans"] == 0


def test_default_cap_is_what_the_long_reference_exceeds():
    assert DEFAULT_MAX_TOKENS < 400


def test_the_viewer_links_a_span_to_its_retrieval_by_id_not_text(tmp_path):
    from duetaspan.view.timeline import build_view

    rec = CallRecorder(tmp_path, "CA-view", audio=False)

    def ev(kind, rid, at_ms, **fields):
        rec.event("retrieval", kind=kind, call_id="CA-view", retrieval_id=rid, frame_index=10, at_ms=at_ms,
                  **fields)  # fmt: skip

    rec.event("ret", frame_index=10, t=0.8)
    ev("ret", 1, 0.0, t=0.8, deduplicated=False)
    ev("reference", 1, 800.0, reference=CURLY, source="tool:get_weather")
    ev("delivered", 1, 810.0, reference=CURLY, total_ms=810.0)
    rec.event("span", reference="(tool result) It's 22 C - sunny...", frame_index=12, t=0.96, n_frames=9,
              prefill_ms=3.0, tool="get_weather", arguments={}, latency_ms=900.0, span_id=1, retrieval_id=1)  # fmt: skip
    view = build_view(rec.close())
    [span] = view["spans"]
    assert span["retrieval"] == 1 and view["retrievals"][0]["outcome"] == "landed"
