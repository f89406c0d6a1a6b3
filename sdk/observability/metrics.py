"""Prometheus metrics of one server: `ServeMetrics` owns its own `CollectorRegistry` (never the process-wide
default one), counts calls, `<ret>`s, spans, retrieval stage latencies, tool calls and webhook refusals as
they happen, and reads the engine's figures (free slots, active calls, tick and lateness histograms, skipped
ticks, concealed frames, crashes) only when `/metrics` is scraped, so the 80 ms clock pays for a few integer
additions and nothing else.

The metric names are a contract (dashboards and alerts rely on them); `METRIC_NAMES` lists them.

`add_metrics_route(app, metrics, role)` serves `GET /metrics` in Prometheus' text format, behind
`Authorization: Bearer <token>` (`$DUETASPAN_METRICS_TOKEN`, else `[server] metrics_token`); without a token
`duetaspan serve` refuses it unless it is the local demo (`duetaspan.access`).

Example:
    >>> metrics = ServeMetrics(engine=lambda: None, transports=("twilio",))
    >>> metrics.call_ended("twilio", "completed")
    >>> b'duetaspan_calls_total{outcome="completed",transport="twilio"} 1.0' in metrics.render()
    True
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from fastapi import Request, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from duetaspan.observability.outbound_metrics import METRIC_NAMES as OUTBOUND_METRIC_NAMES
from duetaspan.observability.outbound_metrics import OutboundMetrics
from duetaspan.observability.sip_metrics import METRIC_NAMES as SIP_METRIC_NAMES
from duetaspan.observability.sip_metrics import SipMetrics
from duetaspan.observability.timing import empty_snapshot

log = logging.getLogger("duetaspan.metrics")

METRICS_PATH = "/metrics"
TOKEN_ENV = "DUETASPAN_METRICS_TOKEN"
CALL_OUTCOMES = ("completed", "refused", "failed")
SPAN_OUTCOMES = ("landed", "late", "none")
RETRIEVAL_STAGES = ("capture", "asr", "router", "tool", "prefill", "total")
# refusals of the Twilio routes (webhook checks, then stream-upgrade checks), shown at zero from the start
TWILIO_REFUSALS = ("busy", "draining", "too_many_pending", "signature_invalid", "body_too_large", "not_utf8", "no_call_sid",
                   "replayed_webhook", "token_unknown", "token_expired", "token_reused",
                   "call_already_answered")  # fmt: skip
RETRIEVAL_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 5.0, 10.0)
METRIC_NAMES = (
    "duetaspan_calls_total",
    "duetaspan_calls_active",
    "duetaspan_engine_free_slots",
    "duetaspan_engine_tick_seconds",
    "duetaspan_clock_lateness_seconds",
    "duetaspan_ticks_skipped_total",
    "duetaspan_frames_concealed_total",
    "duetaspan_ret_total",
    "duetaspan_spans_total",
    "duetaspan_persona_pins_total",
    "duetaspan_retrieval_seconds",
    "duetaspan_tool_calls_total",
    "duetaspan_webhook_refusals_total",
    "duetaspan_engine_crashes_total",
    "duetaspan_engine_step_errors_total",
    "duetaspan_draining",
    "duetaspan_sip_refused_total",
    "duetaspan_sip_registrations_total",
    *SIP_METRIC_NAMES,
    *OUTBOUND_METRIC_NAMES,
)
# refusals of the SIP endpoint, shown at zero from the start (`busy` and `not_ready` also count a refused call)
SIP_REFUSALS = (
    "forbidden", "rate_limited", "oversize", "busy", "not_ready", "draining", "no_codec", "no_offer", "no_srtp",
    "unparsable", "replayed", "connections",
)  # fmt: skip


def refusal_reason(exc: BaseException) -> str:
    """`TokenExpired` -> `token_expired`: the `reason` label of a refused stream upgrade."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__).lower()


class ServeMetrics:
    """The metrics of one server (one process). See the module docstring.

    Args:
        engine: returns the engine runner now serving calls (`agent.runner`: an `EngineRunner` or an
            `EngineProcess`), or None before the agent has started. `engine=None`: this process has no
            engine (a Ray ingress), so the engine metrics are left out.
        transports: transports whose `calls_total` series are shown (at zero) before the first call.
    """

    def __init__(self, *, engine: Callable[[], Any] | None, transports: Iterable[str] = ()) -> None:
        transports = tuple(transports)
        self._tools: set[str] = set()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.calls = Counter(
            "duetaspan_calls", "Calls by transport and outcome.", ["transport", "outcome"], registry=r
        )
        self.rets = Counter("duetaspan_ret", "<ret> tokens the model sampled.", registry=r)
        self.spans = Counter(
            "duetaspan_spans",
            "Retrievals by outcome: landed (a span reached the model), late (deadline), none (no span).",
            ["outcome"],
            registry=r,
        )
        self.persona_pins = Counter(
            "duetaspan_persona_pins",
            "Persona re-pins on calls longer than the context window (not spans: no <ret> asked for them).",
            registry=r,
        )
        self.retrieval = Histogram(
            "duetaspan_retrieval_seconds",
            "Retrieval stage latency: capture (<ret> to question), asr, router (LLM), tool, prefill, total.",
            ["stage"],
            buckets=RETRIEVAL_BUCKETS,
            registry=r,
        )
        self.tool_calls = Counter(
            "duetaspan_tool_calls",
            "Tool calls by tool and outcome (ok, error).",
            ["tool", "outcome"],
            registry=r,
        )
        self.refusals = Counter(
            "duetaspan_webhook_refusals",
            "Refused webhooks and stream upgrades by reason.",
            ["reason"],
            registry=r,
        )
        self.draining = Gauge(
            "duetaspan_draining",
            "1 while the server drains (no new calls; live ones go on), else 0.",
            registry=r,
        )
        self.sip_refusals = Counter(
            "duetaspan_sip_refused", "Refused SIP requests by reason.", ["reason"], registry=r
        )
        self.sip_registrations = Counter(
            "duetaspan_sip_registrations",
            "SIP registration outcomes (registered, failed, expired).",
            ["outcome"],
            registry=r,
        )
        self.sip = SipMetrics(r)  # dial outcomes, RTP quality
        self.outbound = OutboundMetrics(r)  # Twilio dial outcomes, answer-detection verdicts
        for reason in SIP_REFUSALS:  # at zero on every server: the names are a contract
            self.sip_refusals.labels(reason)
        for outcome in ("registered", "failed", "expired"):
            self.sip_registrations.labels(outcome)
        for transport in transports:
            for outcome in CALL_OUTCOMES:
                self.calls.labels(transport, outcome)
        if "twilio" in transports:
            for reason in TWILIO_REFUSALS:
                self.refusals.labels(reason)
        for outcome in SPAN_OUTCOMES:
            self.spans.labels(outcome)
        for stage in RETRIEVAL_STAGES:
            self.retrieval.labels(stage)
        if engine is not None:
            r.register(EngineCollector(engine))

    def declare_tools(self, names: Iterable[str]) -> None:
        """Show `tool_calls_total` at zero for these tools (the agent's registry, once it has started)."""
        for name in names:
            self._tools.add(name)
            for outcome in ("ok", "error"):
                self.tool_calls.labels(name, outcome)

    def watch_registry(self, registry: Any) -> Callable[[], None]:
        """Count every call of `registry`'s tools (router, console, anything); returns the undo."""
        self.declare_tools(registry.names())
        registry.on_result.append(self.tool_result)

        def unwatch() -> None:
            with contextlib.suppress(ValueError):
                registry.on_result.remove(self.tool_result)

        return unwatch

    def tool_result(self, result: Any) -> None:
        """One finished tool call (a `duetaspan.registry.ToolResult`)."""
        name = str(result.name)
        if self._tools and name not in self._tools:
            name = "unknown"  # a name the LLM made up: one series for all of them, not one per guess
        self.tool_calls.labels(name, "ok" if result.ok else "error").inc()

    # events ------------------------------------------------------------------------------------------
    def call_ended(self, transport: str, outcome: str) -> None:
        """A call is over: `outcome` is `completed`, `refused` (no free slot) or `failed`."""
        self.calls.labels(transport or "unknown", outcome).inc()

    def webhook_refused(self, reason: str) -> None:
        """A webhook or stream upgrade was refused; `busy` (no free slot) and `too_many_pending` (both answered
        with the busy TwiML) also count a refused Twilio call."""
        self.refusals.labels(reason).inc()
        if reason in ("busy", "too_many_pending", "draining"):
            self.call_ended("twilio", "refused")

    def drain_state(self, state: str) -> None:
        """The server's drain changed state (`duetaspan.drain`): `serving` is 0, anything after it 1."""
        self.draining.set(0 if state == "serving" else 1)
    def sip_refused(self, reason: str) -> None:
        """A SIP request was refused (`forbidden` source or credentials, `rate_limited`, `oversize`, ...);
        `busy` (486) and `not_ready` (503) also count a refused SIP call."""
        self.sip_refusals.labels(reason).inc()
        if reason in ("busy", "not_ready", "draining"):
            self.call_ended("sip", "refused")

    def sip_registration(self, outcome: str) -> None:
        """A REGISTER round ended: `registered` (also each refresh), `failed` or `expired`."""
        self.sip_registrations.labels(outcome).inc()

    def ret(self) -> None:
        self.rets.inc()

    def span_landed(self, prefill_ms: float, latency_ms: float | None) -> None:
        """A span reached the model: its prefill time and, when known, the time since its `<ret>`."""
        self.spans.labels("landed").inc()
        self.retrieval.labels("prefill").observe(max(0.0, prefill_ms) / 1000.0)
        if latency_ms is not None:
            self.retrieval.labels("total").observe(max(0.0, latency_ms) / 1000.0)

    def persona_pinned(self, prefill_ms: float) -> None:
        """A persona re-pin landed (counted apart from spans and retrieval latencies)."""
        self.persona_pins.inc()

    def retrieval_event(self, event: Mapping[str, Any]) -> None:
        """One event of `duetaspan.router.events` (as a dict): stage latencies, late and none outcomes (tool
        calls are counted from the registry, `watch_registry`, so those outside a retrieval count too)."""
        kind = event.get("kind")
        if kind == "question":
            self.retrieval.labels("capture").observe(float(event.get("at_ms") or 0.0) / 1000.0)
            if event.get("asr_ms"):
                self.retrieval.labels("asr").observe(float(event["asr_ms"]) / 1000.0)
        elif kind == "router":
            self.retrieval.labels("router").observe(float(event.get("llm_ms") or 0.0) / 1000.0)
        elif kind == "tool":
            self.retrieval.labels("tool").observe(float(event.get("tool_ms") or 0.0) / 1000.0)
        elif kind == "late":
            self.spans.labels("late").inc()
        elif kind in ("no_span", "error"):
            self.spans.labels("none").inc()

    # exposition --------------------------------------------------------------------------------------
    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class EngineCollector(Collector):
    """Reads the engine runner's figures at scrape time (an engine process reports its own every 0.5 s)."""

    def __init__(self, engine: Callable[[], Any]) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        runner = self._engine()
        clock = getattr(runner, "clock", None)
        timing = getattr(clock, "timing", None)
        snap = timing.snapshot() if hasattr(timing, "snapshot") else (timing or empty_snapshot())
        running = bool(getattr(runner, "running", False))
        yield GaugeMetricFamily(
            "duetaspan_calls_active",
            "Calls holding an engine slot.",
            value=getattr(runner, "active_calls", 0),
        )
        yield GaugeMetricFamily(
            "duetaspan_engine_free_slots",
            "Engine slots free for new calls (0 while the engine is down).",
            value=getattr(runner, "free_slots", 0) if running else 0,
        )
        yield _histogram(
            "duetaspan_engine_tick_seconds", "Duration of one batched engine step (all calls).", snap["step"]
        )
        yield _histogram(
            "duetaspan_clock_lateness_seconds",
            "How late each tick started against the clock's 80 ms grid.",
            snap["lateness"],
        )
        yield CounterMetricFamily(
            "duetaspan_ticks_skipped",
            "Ticks skipped after the clock fell too far behind.",
            value=snap["skipped"],
        )
        yield CounterMetricFamily(
            "duetaspan_frames_concealed",
            "Call frames fed with silence because the caller's audio had not arrived.",
            value=snap["concealed"],
        )
        yield CounterMetricFamily(
            "duetaspan_engine_crashes",
            "Times the engine went down and ended its calls: its process died, its steps failed "
            "[engine] max_failed_steps times in a row, or a step failed with a fatal device error.",
            value=int(getattr(runner, "crashes", 0)),
        )
        yield CounterMetricFamily(
            "duetaspan_engine_step_errors",
            "Engine steps that raised (each one costs every call on the engine one frame).",
            value=int(snap.get("step_errors", 0)),
        )


def _histogram(name: str, doc: str, snap: Mapping[str, Any]) -> HistogramMetricFamily:
    buckets, running = [], 0
    for bound, count in zip([*snap["bounds"], float("inf")], snap["counts"], strict=True):
        running += count
        buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=snap["sum"])


def metrics_token(configured: Any = None, env: Mapping[str, str] | None = None) -> str | None:
    """The bearer token guarding `/metrics`: `$DUETASPAN_METRICS_TOKEN`, else `[server] metrics_token`."""
    value = (env if env is not None else os.environ).get(TOKEN_ENV)
    if not value and configured is not None:
        value = configured.get_secret_value() if hasattr(configured, "get_secret_value") else str(configured)
    return value or None


def add_metrics_route(app: Any, metrics: ServeMetrics, role: Any) -> None:
    """`GET /metrics` on a FastAPI app, behind `role` (a `duetaspan.access.BearerRole`: refused without its
    token unless the server is the local demo). Every server passes one: there is no open variant."""

    async def scrape(request: Request) -> Response:
        refused = role.refusal(request)
        if refused is not None:
            return refused
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    app.add_api_route(METRICS_PATH, scrape, methods=["GET"], include_in_schema=False)
