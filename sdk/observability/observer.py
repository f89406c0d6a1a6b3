"""Watching calls for metrics and traces without touching the pipeline: `Observability` is what a server
hands its agent (`agent.observability`); for every call `Agent.create_session` asks it for a `CallObserver`,
which

- wraps the call's retrieval factory so that it sees every retrieval event (`<ret>`, question, router, tool,
  delivered, late, no span, error) on its way to the service,
- listens to the service's `on_ret` and `on_span` events (every `<ret>` the model samples, every span that
  lands, with its prefill time),
- is told by the session when the call is over and how it ended (`completed`, `refused`, `failed`).

Example:
    >>> obs = Observability(metrics=None, tracing=None)
    >>> observer = obs.call("CA1", transport="twilio")
    >>> observer.retrieval(None) is None
    True
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from duetaspan.observability.metrics import ServeMetrics
from duetaspan.observability.tracing import CallTrace, Tracing

log = logging.getLogger("duetaspan.observability")


@dataclasses.dataclass
class Observability:
    """A server's metrics (`ServeMetrics`) and traces (`Tracing`); either may be None (off)."""

    metrics: ServeMetrics | None = None
    tracing: Tracing | None = None

    def call(self, call_id: str, *, transport: str = "unknown") -> CallObserver:
        """The observer of one new call."""
        trace = self.tracing.call(call_id, transport=transport) if self.tracing is not None else None
        return CallObserver(self.metrics, trace, transport)

    def close(self) -> None:
        """Flush and stop the trace exporter (idempotent)."""
        tracing, self.tracing = self.tracing, None
        if tracing is not None:
            tracing.shutdown()


class CallObserver:
    """Feeds one call's events to the server's metrics and to the call's trace (see the module docstring).

    Listeners never raise into the call: a failing one is logged once per event.
    """

    def __init__(self, metrics: ServeMetrics | None, trace: CallTrace | None, transport: str) -> None:
        self.metrics = metrics
        self.trace = trace
        self.transport = transport
        self.ended = False

    def retrieval(self, factory: Any) -> Any:
        """Wrap a `RetrievalFactory` so that its events pass through here first (None stays None)."""
        if factory is None:
            return None

        def build(deliver: Any, on_event: Callable[[Any], Any]) -> Any:
            def observed(event: Any) -> Any:
                self._guard(self._event, event)
                return on_event(event)

            return factory(deliver, observed)

        return build

    def bind(self, service: Any) -> None:
        """Listen to the call's `DuetaSpanService` events (`on_ret`, `on_span`)."""
        service.add_event_handler("on_ret", self._on_ret)
        service.add_event_handler("on_span", self._on_span)
        service.add_event_handler("on_persona_pin", self._on_persona_pin)
        service.add_event_handler("on_answer", self._on_answer)

    def closed(self, session: Any) -> None:
        """The session's `on_close`: count the call and end its trace (once)."""
        if self.ended:
            return
        self.ended = True
        outcome = getattr(session, "outcome", None) or "failed"
        if self.metrics is not None:
            self._guard(self.metrics.call_ended, self.transport, outcome)
        if self.trace is not None:
            self._guard(self.trace.end, outcome)

    # listeners -------------------------------------------------------------------------------------------
    def _event(self, event: Any) -> None:
        ev = _as_dict(event)
        if self.metrics is not None:
            self.metrics.retrieval_event(ev)
        if self.trace is not None:
            self.trace.event(ev)

    def _on_ret(self, _service: Any, _frame: Any) -> None:
        if self.metrics is not None:
            self._guard(self.metrics.ret)

    def _on_span(self, _service: Any, frame: Any) -> None:
        prefill_ms = float(getattr(frame, "prefill_ms", 0.0) or 0.0)
        if self.metrics is not None:
            self._guard(self.metrics.span_landed, prefill_ms, getattr(frame, "latency_ms", None))
        if self.trace is not None:
            self._guard(
                self.trace.span_landed,
                str(getattr(frame, "reference", "")),
                prefill_ms,
                int(getattr(frame, "n_frames", 0) or 0),
                getattr(frame, "retrieval_id", None),
            )

    def _on_persona_pin(self, _service: Any, frame: Any) -> None:
        prefill_ms = float(getattr(frame, "prefill_ms", 0.0) or 0.0)
        if self.metrics is not None:
            self._guard(self.metrics.persona_pinned, prefill_ms)
        if self.trace is not None:
            self._guard(self.trace.persona_pinned, prefill_ms, int(getattr(frame, "n_frames", 0) or 0))

    def _on_answer(self, _service: Any, verdict: Any) -> None:
        """Who answered (`duetaspan.outbound`): counted with its decision time, and an event on the trace."""
        if self.metrics is not None and hasattr(self.metrics, "outbound"):
            self._guard(self.metrics.outbound.verdict, verdict.verdict, float(verdict.decided_at_s))
        if self.trace is not None:
            attrs = {"answer.verdict": verdict.verdict, "answer.confidence": float(verdict.confidence),
                     "answer.decided_at_s": float(verdict.decided_at_s), "answer.source": verdict.source}  # fmt: skip
            self._guard(self.trace.root.add_event, "answer.verdict", attrs)

    @staticmethod
    def _guard(fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:  # observing must never cost the call anything
            log.exception("observability listener %s failed", getattr(fn, "__qualname__", fn))


def _as_dict(event: Any) -> dict[str, Any]:
    if isinstance(event, dict):
        return event
    if hasattr(event, "model_dump"):
        return event.model_dump(mode="json")
    return {}
