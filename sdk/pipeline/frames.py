"""Our own Pipecat frames: `<ret>`, spans, no-span and late-span events, barge-in, router events.

They travel DOWNSTREAM from `DuetaSpanService`, in order with the agent's audio (data frames that no
interruption drops), except `AgentBargedInFrame`, a system frame so that it overtakes queued audio and a
transport can flush what the caller would otherwise still hear (Twilio: `clear`).

Example:
    >>> f = SpanFrame(reference="(tool result) It is 3 PM in Tokyo.", frame_index=40, t=3.2, n_frames=14)
    >>> f.interruptible
    False
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipecat.frames.frames import DataFrame, SystemFrame


@dataclass
class RetFrame(DataFrame):
    """The model sampled `<ret>` (asked for a Context Span) at this frame."""

    frame_index: int = 0
    t: float = 0.0  # call time in seconds
    interruptible: bool = field(default=False, init=False)


@dataclass
class SpanFrame(DataFrame):
    """A Context Span landed in the model's streams (one prefill pass before `frame_index`)."""

    reference: str = ""
    frame_index: int = 0
    t: float = 0.0
    n_frames: int = 0
    prefill_ms: float = 0.0
    question: str | None = None
    tool: str | None = None
    arguments: dict[str, Any] | None = None  # redacted
    latency_ms: float | None = None  # `<ret>` to span landed
    span_id: int | None = None  # given at delivery; matches the span to its retrieval whatever its text
    retrieval_id: int | None = None  # the retrieval that delivered it (None: delivered by hand)
    truncated: bool = False  # the reference was cut to the span's size cap
    interruptible: bool = field(default=False, init=False)


@dataclass
class PersonaPinFrame(DataFrame):
    """The persona was written into the model's streams again (a re-pin on a call longer than the context
    window). Not a Context Span: no `<ret>` asked for it, so it counts in no span or retrieval figure."""

    frame_index: int = 0
    t: float = 0.0
    n_frames: int = 0
    prefill_ms: float = 0.0
    interruptible: bool = field(default=False, init=False)


@dataclass
class NoSpanFrame(DataFrame):
    """A `<ret>` ended without a reference (nothing to say, router error, no question)."""

    question: str | None = None
    reason: str = ""
    t: float = 0.0
    interruptible: bool = field(default=False, init=False)


@dataclass
class LateSpanFrame(DataFrame):
    """A reference came too late (after the retrieval deadline) and was dropped."""

    question: str | None = None
    reference: str | None = None
    seconds: float = 0.0
    t: float = 0.0
    stage: str | None = None  # where the deadline caught the work: capture, router, deliver
    interruptible: bool = field(default=False, init=False)


@dataclass
class RetrievalEventFrame(DataFrame):
    """Any other event of the call's retrieval (question captured, router, tool...), as a JSON-ready dict."""

    event: dict[str, Any] = field(default_factory=dict)
    interruptible: bool = field(default=False, init=False)


@dataclass
class CallEndedByFrame(SystemFrame):
    """A transport says why its call is ending (the record's `ended_by`, e.g. `media_timeout`), just before it
    ends the pipeline; a system frame, so it reaches the service before the `EndFrame`."""

    ended_by: str = ""


@dataclass
class AgentBargedInFrame(SystemFrame):
    """The agent stopped speaking abruptly while the caller was speaking: the caller barged in.

    The model handles the barge-in itself (it simply stops talking); this frame tells a transport to drop
    agent audio it has already buffered towards the caller.
    """

    frame_index: int = 0
    t: float = 0.0
    spoke_frames: int = 0  # how long the agent had been speaking
