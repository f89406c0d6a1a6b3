"""Events of one retrieval, `<ret>` to delivered span: pydantic models that serialize to JSON for artifacts.

Every event carries `kind`, the call's `call_id`, the `retrieval_id` (counter per call), the `<ret>`
`frame_index` and `at_ms` (milliseconds since `<ret>` was reported).

Example:
    >>> e = QuestionCaptured(call_id="c1", retrieval_id=1, frame_index=40, at_ms=12.5,
    ...                      text="what time is it", how="final", asr_ms=0.0)
    >>> e.model_dump()["kind"]
    'question'
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class RetrievalEvent(BaseModel):
    """Fields common to every retrieval event."""

    model_config = ConfigDict(frozen=True)

    kind: str
    call_id: str
    retrieval_id: int
    frame_index: int
    at_ms: float


class RetReceived(RetrievalEvent):
    """The model sampled `<ret>`; `deduplicated` when a retrieval was already in flight (nothing started)."""

    kind: Literal["ret"] = "ret"
    t: float
    deduplicated: bool = False


class QuestionCaptured(RetrievalEvent):
    """The question: a fresh `final` utterance, one awaited (`wait`), or a transcribed `window`."""

    kind: Literal["question"] = "question"
    text: str
    how: Literal["final", "wait", "window"]
    asr_ms: float = 0.0
    wait_ms: float = 0.0
    audio_s: float = 0.0
    # the question's words with their stream times (`{"word", "start", "end"}`), where the ASR gives them
    words: list[dict[str, Any]] = Field(default_factory=list)


class RouterDecided(RetrievalEvent):
    """The router LLM's decision: a tool call, a direct answer, an abstain, nothing, or a refusal."""

    kind: Literal["router"] = "router"
    decision: Literal["tool", "answer", "abstain", "none", "refused", "invalid", "error"]
    llm_ms: float
    attempts: int = 1
    tool: str | None = None
    detail: str | None = None


class ToolCalled(RetrievalEvent):
    """One tool call; `arguments` are redacted (the tool's `redact` fields masked)."""

    kind: Literal["tool"] = "tool"
    tool: str
    arguments: dict[str, Any]
    ok: bool
    tool_ms: float
    error: str | None = None
    late: bool = False  # a side-effect call that finished after its retrieval had ended (deadline)
    reference: str | None = None  # with `late`: what it produced (now in the Context DB)


class ReferenceReady(RetrievalEvent):
    """The reference line chosen for the span and where it came from (`tool:<name>` or `answer`)."""

    kind: Literal["reference"] = "reference"
    reference: str
    source: str


class Delivered(RetrievalEvent):
    """The reference was handed to `deliver` within the deadline."""

    kind: Literal["delivered"] = "delivered"
    reference: str
    total_ms: float


class LateSpan(RetrievalEvent):
    """The deadline expired; the work was cancelled (`stage` says where) and no span lands."""

    kind: Literal["late"] = "late"
    stage: str
    deadline_s: float
    reference: str | None = None


class NoSpan(RetrievalEvent):
    """The retrieval ended without a span (empty question, small talk, router abstain...)."""

    kind: Literal["no_span"] = "no_span"
    reason: str


class RetrievalFailed(RetrievalEvent):
    """Something failed (ASR down, LLM down, a bug); no span. `stage`: capture, router, tool, deliver."""

    kind: Literal["error"] = "error"
    stage: str
    error: str


class RetrievalCancelled(RetrievalEvent):
    """The call ended (`close()`) while this retrieval was in flight; nothing was or will be delivered."""

    kind: Literal["cancelled"] = "cancelled"
    stage: str
