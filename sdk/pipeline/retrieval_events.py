"""The retrieval side of a `DuetaSpanService`: `<ret>`s, references delivered as spans, and the events the
call's retrieval (router, question capture) reports, each recorded and turned into frames.

Events, by `kind` (a dict, a pydantic model or a dataclass):

    caller_speech (state=started|stopped, t)   the capture's voice detection -> the service's caller side
    caller_utterance (text, start/t)           a transcribed utterance -> `TranscriptionFrame` (upstream)
    ...late...                                 `LateSpanFrame` (+ `on_late_span`)
    ...no_span...                              `NoSpanFrame` (+ `on_no_span`)
    anything else                              `RetrievalEventFrame`

Example:
    >>> # service.on_retrieval_event({"kind": "caller_utterance", "text": "what time is it", "t": 1.2})
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from duetaspan.model.convention import FRAME_MS
from duetaspan.pipeline.frames import (
    LateSpanFrame,
    NoSpanFrame,
    PersonaPinFrame,
    RetFrame,
    RetrievalEventFrame,
    SpanFrame,
)

if TYPE_CHECKING:
    from pipecat.frames.frames import Frame

    from duetaspan.pipeline.artifacts import CallRecorder
    from duetaspan.pipeline.runner import CallSlot, TickOutput
    from duetaspan.pipeline.service_metrics import DuplexUsage

log = logging.getLogger(__name__)


class Retrieval(Protocol):
    """A call's `<ret>` backend (the router's retrieval manager, or anything with these methods).

    It receives the levelled caller audio, is told about each `<ret>`, and answers through the `deliver`
    and `on_event` callbacks it was built with (see `RetrievalFactory`).
    """

    def feed(self, pcm: np.ndarray, t: float) -> Any: ...
    def on_ret(self, frame_index: int, t: float, caller_t: float | None = None) -> Any: ...
    def close(self) -> Any: ...


# deliver(reference, meta) queues a span; on_event(event) records/forwards a retrieval event.
Deliver = Callable[[str, dict[str, Any] | None], Any]
OnEvent = Callable[[Any], Any]
RetrievalFactory = Callable[[Deliver, OnEvent], Retrieval]


def event_dict(event: Any) -> dict[str, Any]:
    """Any retrieval event as a plain dict."""
    if isinstance(event, dict):
        return dict(event)
    if hasattr(event, "model_dump"):
        return event.model_dump(mode="json")
    if dataclasses.is_dataclass(event) and not isinstance(event, type):
        return dataclasses.asdict(event)
    return {"kind": type(event).__name__, "repr": repr(event)}


def event_kind(ev: dict[str, Any]) -> str:
    return str(ev.get("kind") or ev.get("type") or ev.get("event") or "").lower()


class EventHost(Protocol):
    """What `RetrievalEvents` uses of its service (`DuetaSpanService`): a protocol, so that this module does
    not import the service that owns it."""

    call_id: str
    slot: CallSlot | None
    recorder: CallRecorder | None
    retrieval: Retrieval | None
    stats: dict[str, Any]
    usage: DuplexUsage

    @property
    def closed(self) -> bool: ...
    def spawn(self, maybe: Any) -> None: ...
    def emit(self, frame: Frame, handler: str | None = None) -> None: ...
    def call_handler(self, name: str, *args: Any) -> Any: ...
    def caller_started(self) -> None: ...
    def caller_stopped(self, t: float) -> None: ...
    def caller_said(self, text: str, t: float) -> None: ...


@dataclasses.dataclass
class _SpanMeta:
    meta: dict[str, Any]
    delivered_at: float
    reference: str


class RetrievalEvents:
    """Spans, `<ret>`s and retrieval events of one service's call (see the module docstring)."""

    def __init__(self, service: EventHost) -> None:
        self.service = service
        self._ret_times: list[float] = []
        # by span id: the engine normalises and caps a reference, so its text is no key
        self._span_meta: dict[int, _SpanMeta] = {}
        self._next_span_id = 1

    # spans and <ret> -----------------------------------------------------------------------------
    def deliver(self, reference: str, meta: dict[str, Any] | None = None) -> bool:
        s = self.service
        if s.slot is None or s.closed:
            log.warning("call %s: reference dropped, no active slot", s.call_id)
            return False
        span_id, self._next_span_id = self._next_span_id, self._next_span_id + 1
        self._span_meta[span_id] = _SpanMeta(meta or {}, time.monotonic(), reference)
        if s.slot.inject(reference, span_id):
            return True
        self._span_meta.pop(span_id, None)
        return False

    def call_ended(self) -> None:
        """The call ended (its slot closed): each span queued for the engine that has not landed in the
        model's streams is recorded as `span_dropped` (a `delivered` retrieval whose span the call never had)."""
        s = self.service
        left, self._span_meta = self._span_meta, {}
        for span_id, info in sorted(left.items()):
            queued_ms = round((time.monotonic() - info.delivered_at) * 1000.0, 1)
            retrieval_id = info.meta.get("retrieval_id")
            log.warning(
                "call %s: span %d (retrieval %s) dropped: the call ended %.0f ms after it was queued, before it "
                "landed", s.call_id, span_id, retrieval_id, queued_ms,
            )  # fmt: skip
            if s.recorder is not None:
                s.recorder.event(
                    "span_dropped",
                    span_id=span_id,
                    retrieval_id=retrieval_id,
                    reference=info.reference,
                    queued_ms=queued_ms,
                    reason="the call ended before the span landed",
                )

    def ret_frame(self, out: TickOutput) -> RetFrame:
        s = self.service
        s.stats["rets"] += 1
        s.usage.rets += 1
        frame = RetFrame(frame_index=out.call_frame, t=out.t)
        self._ret_times.append(time.monotonic())
        if s.recorder is not None:
            s.recorder.event("ret", frame_index=out.call_frame, t=round(out.t, 3))
        if s.retrieval is not None:
            # the caller's stream time of the frame the model heard with it: the capture's timeline (concealed
            # ticks and dropped caller frames under load move the call's time away from it, a second and more)
            heard = None if out.caller_frame is None else out.caller_frame * FRAME_MS / 1000.0
            s.spawn(s.retrieval.on_ret(out.call_frame, out.t, heard))
        s.spawn(s.call_handler("on_ret", frame))
        return frame

    def span_frame(self, span: Any, out: TickOutput) -> SpanFrame | PersonaPinFrame:
        """The frame of something that landed in the model's streams: a Context Span, or a persona re-pin."""
        if getattr(span, "kind", "reference") == "persona":
            return self._persona_frame(span, out)
        s = self.service
        s.stats["spans"] += 1
        reference = str(getattr(span, "reference", ""))
        span_id = getattr(span, "span_id", None)
        info = self._span_meta.pop(span_id, None) if span_id is not None else None
        meta = info.meta if info else {}
        latency = None
        if self._ret_times:
            latency = (time.monotonic() - self._ret_times[-1]) * 1000.0
        frame = SpanFrame(
            reference=reference,
            frame_index=out.call_frame,
            t=out.t,
            n_frames=int(getattr(span, "n_frames", 0)),
            prefill_ms=float(getattr(span, "prefill_ms", 0.0)),
            question=meta.get("question"),
            tool=meta.get("tool"),
            arguments=meta.get("arguments"),
            latency_ms=None if latency is None else round(latency, 1),
            span_id=span_id,
            retrieval_id=meta.get("retrieval_id"),
            truncated=bool(getattr(span, "truncated", False)),
        )
        s.usage.spans += 1
        s.usage.span_frames += frame.n_frames
        if s.recorder is not None:
            s.recorder.event(
                "span",
                reference=frame.reference,
                frame_index=frame.frame_index,
                t=round(frame.t, 3),
                n_frames=frame.n_frames,
                prefill_ms=round(frame.prefill_ms, 2),
                question=frame.question,
                tool=frame.tool,
                arguments=frame.arguments,
                latency_ms=frame.latency_ms,
                span_id=frame.span_id,
                retrieval_id=frame.retrieval_id,
                truncated=frame.truncated,
            )
        s.spawn(s.call_handler("on_span", frame))
        return frame

    def _persona_frame(self, span: Any, out: TickOutput) -> PersonaPinFrame:
        s = self.service
        s.stats["persona_pins"] = s.stats.get("persona_pins", 0) + 1
        frame = PersonaPinFrame(
            frame_index=out.call_frame,
            t=out.t,
            n_frames=int(getattr(span, "n_frames", 0)),
            prefill_ms=float(getattr(span, "prefill_ms", 0.0)),
        )
        if s.recorder is not None:
            s.recorder.event(
                "persona_pin",
                frame_index=frame.frame_index,
                t=round(frame.t, 3),
                n_frames=frame.n_frames,
                prefill_ms=round(frame.prefill_ms, 2),
            )
        s.spawn(s.call_handler("on_persona_pin", frame))
        return frame

    # retrieval events ----------------------------------------------------------------------------
    def handle(self, event: Any) -> None:
        s = self.service
        ev = event_dict(event)
        kind = event_kind(ev)
        if kind == "caller_speech":
            if s.recorder is not None:
                s.recorder.event(
                    "caller_speech", **{k: v for k, v in ev.items() if k not in ("type", "kind")}
                )
            if ev.get("state") == "started":
                s.caller_started()
            else:
                s.caller_stopped(float(ev.get("t") or 0.0))
            return
        frame: Any = None
        handler = None
        record_as = "retrieval"
        if "late" in kind:
            frame = LateSpanFrame(
                question=ev.get("question"),
                reference=ev.get("reference"),
                seconds=float(ev.get("seconds") or ev.get("deadline_s") or 0.0),
                t=float(ev.get("t") or 0.0),
                stage=ev.get("stage"),
            )
            handler, record_as = "on_late_span", "late_span"
        elif "no_span" in kind or "nospan" in kind:
            frame = NoSpanFrame(
                question=ev.get("question"), reason=str(ev.get("reason") or ""), t=float(ev.get("t") or 0.0)
            )
            handler, record_as = "on_no_span", "no_span"
        elif "utterance" in kind:
            record_as = "caller_utterance"
        else:
            frame = RetrievalEventFrame(event=ev)
        if s.recorder is not None:
            s.recorder.event(record_as, **{k: v for k, v in ev.items() if k != "type"})
        if s.closed:  # hung up: still recorded (the retrieval's cancellation), but no frames or handlers
            return
        if record_as == "caller_utterance":
            if ev.get("text"):
                s.caller_said(str(ev["text"]), float(ev.get("start", ev.get("t")) or 0.0))
        elif frame is not None:
            s.emit(frame, handler)


__all__ = [
    "Deliver",
    "EventHost",
    "OnEvent",
    "Retrieval",
    "RetrievalEvents",
    "RetrievalFactory",
    "event_dict",
    "event_kind",
]
