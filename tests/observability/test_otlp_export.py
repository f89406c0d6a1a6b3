"""Traces leave the process over OTLP/HTTP when configured: `Tracing.from_config` against a loopback HTTP
receiver that decodes the protobuf export request; off by default; the standard `OTEL_*` variables turn it on
(and `OTEL_SDK_DISABLED` off); a missing exporter package is a clear log line, not a failed server. And the
retrieval outcomes of a call's trace (landed, late, ended with the call) with `include_text`."""

from __future__ import annotations

import logging
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from duetaspan.config import AgentConfig, TracingConfig
from duetaspan.observability.tracing import Tracing, tracing_wanted


class _Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP collector stand-in: keeps every request (path, content type, body) on its server."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append((self.path, self.headers["Content-Type"], body))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()
        self.wfile.write(b"")

    def log_message(self, *args: object) -> None:
        pass


def test_spans_are_exported_over_otlp_http_to_the_configured_endpoint():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    server.received = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/v1/traces"
        config = TracingConfig(enabled=True, endpoint=url, service_name="front-desk")
        tracing = Tracing.from_config(config, router_model="gpt-test", env={})
        assert tracing is not None
        trace = tracing.call("CA-otlp", transport="twilio")
        trace.event({"kind": "ret", "retrieval_id": 1, "frame_index": 40, "at_ms": 0.0, "t": 3.2})
        trace.event(
            {"kind": "no_span", "retrieval_id": 1, "frame_index": 40, "at_ms": 900.0, "reason": "abstain"}
        )
        trace.end("completed")
        tracing.shutdown()  # flushes the batch
    finally:
        server.shutdown()
    [(path, content_type, body)] = server.received  # type: ignore[attr-defined]
    assert path == "/v1/traces" and content_type == "application/x-protobuf"
    request = ExportTraceServiceRequest.FromString(body)
    [resource_spans] = request.resource_spans
    resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert resource["service.name"] == "front-desk"
    spans = {s.name: s for scope in resource_spans.scope_spans for s in scope.spans}
    assert set(spans) == {"conversation", "retrieval"}
    assert spans["retrieval"].parent_span_id == spans["conversation"].span_id
    outcome = {a.key: a.value.string_value for a in spans["retrieval"].attributes}["retrieval.outcome"]
    assert outcome == "none"


def test_tracing_is_off_by_default_and_follows_the_otel_variables():
    assert AgentConfig().tracing.enabled is False
    assert not tracing_wanted(TracingConfig(), env={})
    assert Tracing.from_config(TracingConfig(), env={}) is None
    assert tracing_wanted(TracingConfig(), env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert tracing_wanted(
        TracingConfig(), env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}
    )
    assert tracing_wanted(TracingConfig(), env={"OTEL_TRACES_EXPORTER": "otlp"})
    assert tracing_wanted(TracingConfig(enabled=True), env={})
    assert not tracing_wanted(TracingConfig(enabled=True), env={"OTEL_SDK_DISABLED": "true"})


def test_a_missing_otlp_exporter_is_a_clear_log_line(monkeypatch, caplog):
    # None in sys.modules makes the import fail as if the package were not installed
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with caplog.at_level(logging.INFO, logger="duetaspan.tracing"):
        assert Tracing.from_config(TracingConfig(enabled=True), env={}) is None
    assert "pip install 'duetaspan[tracing]'" in caplog.text and "without traces" in caplog.text
    # the server goes on without traces: a warning, not an error
    assert [r.levelname for r in caplog.records] == ["WARNING"]


def _memory_tracing(**kw) -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider, **kw), exporter


def _ev(kind: str, rid: int, at_ms: float, **fields) -> dict:
    return {
        "kind": kind,
        "call_id": "CA1",
        "retrieval_id": rid,
        "frame_index": 10 * rid,
        "at_ms": at_ms,
        **fields,
    }


def test_retrieval_outcomes_and_include_text():
    tracing, exporter = _memory_tracing(include_text=True)
    trace = tracing.call("CA1", transport="webrtc")
    # 1: answered directly, lands
    trace.event(_ev("ret", 1, 0.0, t=0.8))
    trace.event(_ev("question", 1, 300.0, text="is the shop open", how="final", asr_ms=120.0))
    trace.event(_ev("ret", 0, 10.0, t=0.9, deduplicated=True))
    trace.event(_ev("router", 1, 700.0, decision="answer", llm_ms=400.0))
    trace.event(_ev("reference", 1, 701.0, reference="Open until 9 pm.", source="answer"))
    trace.event(_ev("delivered", 1, 702.0, reference="Open until 9 pm.", total_ms=702.0))
    trace.span_landed("Open until 9 pm.", prefill_ms=12.0, n_frames=5)
    # 2: the deadline passes inside the router; 3: still in flight when the call ends
    trace.event(_ev("ret", 2, 0.0, t=5.0))
    trace.event(_ev("question", 2, 100.0, text="and tomorrow", how="wait"))
    trace.event(_ev("late", 2, 2500.0, stage="router", deadline_s=2.5))
    trace.event(_ev("ret", 3, 0.0, t=9.0))
    trace.end("completed")
    spans = exporter.get_finished_spans()
    retrievals = sorted(
        (s for s in spans if s.name == "retrieval"), key=lambda s: s.attributes["retrieval.id"]
    )
    assert [r.attributes["retrieval.outcome"] for r in retrievals] == ["landed", "late", "call_ended"]
    assert retrievals[1].attributes["retrieval.stage"] == "router"
    [root] = [s for s in spans if s.name == "conversation"]
    assert [e.name for e in root.events] == ["ret.deduplicated"]
    transcripts = sorted(s.attributes["transcript"] for s in spans if s.name == "stt")
    assert transcripts == ["and tomorrow", "is the shop open"]
    [prefill] = [s for s in spans if s.name == "prefill"]
    assert prefill.attributes["span.reference"] == "Open until 9 pm."
    assert prefill.parent.span_id == retrievals[0].context.span_id
    # the late retrieval's router span was closed at the deadline, not left open
    llm_late = [s for s in spans if s.name == "llm" and s.parent.span_id == retrievals[1].context.span_id]
    assert len(llm_late) == 1 and llm_late[0].end_time == retrievals[1].end_time
    # the stt span of retrieval 1 lasted the 300 ms from <ret> to question
    [stt1] = [s for s in spans if s.name == "stt" and s.parent.span_id == retrievals[0].context.span_id]
    assert abs((stt1.end_time - stt1.start_time) / 1e6 - 300.0) < 1.0
