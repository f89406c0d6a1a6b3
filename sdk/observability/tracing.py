"""OpenTelemetry traces: one trace per call, one child span per retrieval, exported over OTLP when configured.

Span names follow Pipecat's tracing (`pipecat.utils.tracing`) where it has one: the call is a `conversation`
span (`conversation.id`, `conversation.type = "voice"`), question capture an `stt` span, the router LLM an
`llm` span (`gen_ai.operation.name = "chat"`, `gen_ai.request.model`), its tool call a `tool` span inside it
(`tool.function_name`, `tool.arguments`: the registry's redacted arguments, never the raw ones). Ours:
`retrieval` (one per `<ret>`: `retrieval.id`, `retrieval.outcome` = landed, late, none, error, cancelled or
call_ended) and `prefill` (the span entering the model). What the caller said and the reference text are left
out unless `[tracing] include_text = true`.

Tracing is off unless `[tracing] enabled = true`, or the standard `OTEL_EXPORTER_OTLP_ENDPOINT` /
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_TRACES_EXPORTER=otlp` variables are set (`OTEL_SDK_DISABLED=true`
turns it off again). The OTLP/HTTP exporter reads the other `OTEL_*` variables (headers, timeout,
`OTEL_SERVICE_NAME`) itself. Each server owns its `TracerProvider`; the global one is never replaced.

Example (tests use the SDK's in-memory exporter):
    >>> from opentelemetry.sdk.trace import TracerProvider
    >>> from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    >>> from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    >>> exporter = InMemorySpanExporter()
    >>> provider = TracerProvider()
    >>> provider.add_span_processor(SimpleSpanProcessor(exporter))
    >>> tracing = Tracing(provider)
    >>> trace = tracing.call("CA1", transport="twilio")
    >>> trace.end("completed")
    >>> [s.name for s in exporter.get_finished_spans()]
    ['conversation']
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("duetaspan.tracing")

TRACER_NAME = "duetaspan"
_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def tracing_wanted(config: Any, env: Mapping[str, str] | None = None) -> bool:
    """Whether traces should be exported: `[tracing] enabled`, or OTLP configured through `OTEL_*` variables."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    if getattr(config, "enabled", False):
        return True
    return any(env.get(v) for v in _ENDPOINT_VARS) or env.get("OTEL_TRACES_EXPORTER", "") == "otlp"


class Tracing:
    """A server's tracer: `call(call_id)` starts a call's trace. Built by `Tracing.from_config` (OTLP) or
    around any `TracerProvider` (tests: the in-memory exporter)."""

    def __init__(self, provider: Any, *, include_text: bool = False, router_model: str | None = None) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer(TRACER_NAME)
        self.include_text = include_text
        self.router_model = router_model
        # what text goes through before it is put on a span (`[privacy] redact`: the server sets a redactor's)
        self.redact: Callable[[str], str] = str

    @classmethod
    def from_config(
        cls, config: Any, *, router_model: str | None = None, env: Mapping[str, str] | None = None
    ) -> Tracing | None:
        """An OTLP/HTTP-exporting `Tracing` when tracing is wanted (see the module docstring), else None.

        When the OpenTelemetry SDK or its OTLP exporter is not installed, says how to install it and
        returns None: the server runs, without traces.
        """
        if not tracing_wanted(config, env):
            return None
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            log.warning(  # the server runs, without traces: a warning, not an error
                "tracing is configured but OpenTelemetry's OTLP exporter is missing (%s): "
                "pip install 'duetaspan[tracing]'; serving without traces",
                exc,
            )
            return None
        env = os.environ if env is None else env
        attributes = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": config.service_name}
        provider = TracerProvider(resource=Resource.create(attributes))
        exporter = OTLPSpanExporter(endpoint=config.endpoint) if config.endpoint else OTLPSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter))
        log.info("tracing: exporting calls over OTLP/HTTP to %s", config.endpoint or _env_endpoint(env))
        return cls(provider, include_text=config.include_text, router_model=router_model)

    def call(self, call_id: str, *, transport: str = "unknown") -> CallTrace:
        """Start the trace of one call (its `conversation` span)."""
        root = self.tracer.start_span(
            "conversation",
            attributes={
                "conversation.id": call_id,
                "conversation.type": "voice",
                "duetaspan.transport": transport,
            },
        )
        return CallTrace(self, root)

    def shutdown(self) -> None:
        """Flush and stop the exporter (at server shutdown)."""
        shutdown = getattr(self.provider, "shutdown", None)
        if shutdown is not None:
            shutdown()


def _env_endpoint(env: Mapping[str, str]) -> str:
    for var in _ENDPOINT_VARS:
        if env.get(var):
            return env[var]
    return "http://localhost:4318/v1/traces (the exporter's default)"


@dataclass
class _Retrieval:
    span: Any
    ret_ns: int  # wall time of the <ret>, in ns: the events' `at_ms` count from it
    llm: Any = None
    llm_start_ns: int | None = None
    reference: str | None = None


@dataclass
class CallTrace:
    """One call's trace; fed the call's retrieval events and landed spans by `CallObserver`."""

    tracing: Tracing
    root: Any
    retrievals: dict[int, _Retrieval] = field(default_factory=dict)

    def _ctx(self, span: Any) -> Any:
        from opentelemetry import trace

        return trace.set_span_in_context(span)

    def event(self, event: Mapping[str, Any]) -> None:
        """One `duetaspan.router.events` event (as a dict)."""
        kind, rid = event.get("kind"), int(event.get("retrieval_id") or 0)
        now = time.time_ns()
        at_ns = int(float(event.get("at_ms") or 0.0) * 1e6)
        if kind == "ret":
            if event.get("deduplicated"):
                self.root.add_event("ret.deduplicated", {"retrieval.frame_index": int(event["frame_index"])})
                return
            ret_ns = now - at_ns
            span = self.tracing.tracer.start_span(
                "retrieval",
                context=self._ctx(self.root),
                start_time=ret_ns,
                attributes={
                    "retrieval.id": rid,
                    "retrieval.frame_index": int(event.get("frame_index") or 0),
                    "retrieval.t": float(event.get("t") or 0.0),
                },
            )
            self.retrievals[rid] = _Retrieval(span, ret_ns)
            return
        r = self.retrievals.get(rid)
        if r is None:
            return
        at = r.ret_ns + at_ns
        if kind == "question":
            attrs = {
                "gen_ai.operation.name": "transcription",
                "stt.how": str(event.get("how")),
                "metrics.asr_ms": float(event.get("asr_ms") or 0.0),
                "metrics.wait_ms": float(event.get("wait_ms") or 0.0),
                "audio.duration_s": float(event.get("audio_s") or 0.0),
            }
            if self.tracing.include_text:
                attrs["transcript"] = self.tracing.redact(str(event.get("text") or ""))
            stt = self.tracing.tracer.start_span(
                "stt", context=self._ctx(r.span), start_time=r.ret_ns, attributes=attrs
            )
            stt.end(end_time=at)
            # the router starts now; its tool calls become children of its span
            r.llm = self.tracing.tracer.start_span(
                "llm",
                context=self._ctx(r.span),
                start_time=at,
                attributes={"gen_ai.operation.name": "chat", "gen_ai.output.type": "text"},
            )
            if self.tracing.router_model:
                r.llm.set_attribute("gen_ai.request.model", self.tracing.router_model)
        elif kind == "tool":
            tool_ns = int(float(event.get("tool_ms") or 0.0) * 1e6)
            ok = bool(event.get("ok"))
            attrs = {
                "tool.function_name": str(event.get("tool")),
                "tool.arguments": self.tracing.redact(
                    json.dumps(event.get("arguments") or {}, sort_keys=True, default=str)
                ),
                "tool.outcome": "ok" if ok else "error",
                "metrics.tool_ms": float(event.get("tool_ms") or 0.0),
            }
            if event.get("error"):
                attrs["tool.error"] = str(event["error"])
            span = self.tracing.tracer.start_span(
                "tool",
                context=self._ctx(r.llm or r.span),
                start_time=max(r.ret_ns, at - tool_ns),
                attributes=attrs,
            )
            if not ok:
                _error(span, str(event.get("error") or "tool failed"))
            span.end(end_time=at)
        elif kind == "router":
            if r.llm is not None:
                r.llm.set_attributes({
                    "router.decision": str(event.get("decision")),
                    "router.attempts": int(event.get("attempts") or 1),
                    "metrics.llm_ms": float(event.get("llm_ms") or 0.0),
                })  # fmt: skip
                if event.get("tool"):
                    r.llm.set_attribute("tool.function_name", str(event["tool"]))
                r.llm.end(end_time=at)
                r.llm = None
        elif kind == "reference":
            r.span.set_attribute("retrieval.source", str(event.get("source")))
        elif kind == "delivered":
            r.reference = str(event.get("reference") or "")
            r.span.add_event("delivered", timestamp=at)
        elif kind == "late":
            self._finish(rid, "late", at, stage=str(event.get("stage")))
        elif kind == "no_span":
            self._finish(rid, "none", at, reason=str(event.get("reason")))
        elif kind == "error":
            _error(r.span, str(event.get("error")))
            self._finish(rid, "error", at, stage=str(event.get("stage")))
        elif kind == "cancelled":
            self._finish(rid, "cancelled", at, stage=str(event.get("stage")))

    def span_landed(
        self, reference: str, prefill_ms: float, n_frames: int, retrieval_id: int | None = None
    ) -> None:
        """A span entered the model: the `prefill` child of the retrieval that delivered it (`retrieval_id`,
        which the service carries from delivery to landing; the landed text may be normalised or capped)."""
        if retrieval_id is not None:
            rid = retrieval_id if retrieval_id in self.retrievals else None
        else:
            rid = next((k for k, r in self.retrievals.items() if r.reference == reference), None)
        if rid is None:
            return  # a span no retrieval of this call delivered (e.g. injected by hand)
        r = self.retrievals[rid]
        now = time.time_ns()
        attrs: dict[str, Any] = {"span.n_frames": int(n_frames), "metrics.prefill_ms": float(prefill_ms)}
        if self.tracing.include_text:
            attrs["span.reference"] = self.tracing.redact(reference)
        prefill = self.tracing.tracer.start_span(
            "prefill", context=self._ctx(r.span), start_time=now - int(prefill_ms * 1e6), attributes=attrs
        )
        prefill.end(end_time=now)
        self._finish(rid, "landed", now)

    def _finish(self, rid: int, outcome: str, at: int, **attrs: str) -> None:
        r = self.retrievals.pop(rid, None)
        if r is None:
            return
        if r.llm is not None:
            r.llm.end(end_time=at)
        r.span.set_attribute("retrieval.outcome", outcome)
        for key, value in attrs.items():
            r.span.set_attribute(f"retrieval.{key}", value)
        r.span.end(end_time=max(at, r.ret_ns))

    def persona_pinned(self, prefill_ms: float, n_frames: int) -> None:
        """The persona was re-pinned: an event on the call's span, never a retrieval."""
        self.root.add_event(
            "persona_pin", {"span.n_frames": int(n_frames), "metrics.prefill_ms": float(prefill_ms)}
        )

    def end(self, outcome: str) -> None:
        """The call is over: close what is still open and end the `conversation` span."""
        now = time.time_ns()
        for rid in list(self.retrievals):
            self._finish(rid, "call_ended", now)
        self.root.set_attribute("duetaspan.call.outcome", outcome)
        if outcome == "failed":
            _error(self.root, "the call failed")
        self.root.end(end_time=now)


def _error(span: Any, message: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, message))
