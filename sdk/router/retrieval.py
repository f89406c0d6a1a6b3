"""The per-call retrieval lifecycle: `<ret>` -> question -> router -> reference -> `deliver`, or nothing.

One `RetrievalManager` per call. A side-effect call that ran (same tool, same real arguments) is never run
again in the call: a later `<ret>` that provokes it again gets no span (`repeat`). At most one retrieval is
in flight: a `<ret>` while one runs is dropped
(and reported as a deduplicated `ret` event). A deadline (default 2.5 s after `<ret>`) cancels whatever is
still running, ASR, LLM or tool, and the span is dropped as `late`. `close()` (hang-up) cancels everything
and guarantees that `deliver` is never called again, so no result can land in another call's slot. Every
step is reported to `on_event` as a JSON-serialisable `RetrievalEvent`.

Example:
    >>> async def run(capture, router, engine, slot):   # doctest: +SKIP
    ...     manager = RetrievalManager(
    ...         capture=capture, router=router,
    ...         deliver=lambda reference, meta: engine.inject(slot, reference),
    ...         on_event=lambda event: print(event.model_dump_json()))
    ...     manager.on_ret(frame_index=412, t=32.96)   # from the engine's <ret> report
    ...     await manager.close()                        # at hang-up
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import itertools
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from duetaspan.registry import CallContext
from duetaspan.registry.render import one_line
from duetaspan.router.capture import Question, QuestionCapture
from duetaspan.router.context_db import ContextDB
from duetaspan.router.events import (
    Delivered,
    LateSpan,
    NoSpan,
    QuestionCaptured,
    ReferenceReady,
    RetReceived,
    RetrievalCancelled,
    RetrievalEvent,
    RetrievalFailed,
    RouterDecided,
    ToolCalled,
)
from duetaspan.router.ports import TranscriptionError
from duetaspan.router.router import Router, RouteStep

log = logging.getLogger(__name__)

# Rough characters per SentencePiece token for English references; the span builder enforces exact counts.
CHARS_PER_TOKEN = 4
# (retrieval_id, frame_index, started) of the retrieval a task runs for: a side-effect tool that finishes
# after its retrieval ended is reported under it (its task, and so its done callback, inherit this context)
_RETRIEVAL: contextvars.ContextVar[tuple[int, int, float] | None] = contextvars.ContextVar(
    "duetaspan_retrieval", default=None
)


@dataclass(frozen=True)
class RetrievalMeta:
    """What `deliver` gets besides the reference."""

    call_id: str
    retrieval_id: int
    frame_index: int
    t: float | None
    question: str
    how: str
    source: str  # "tool:<name>" or "answer"
    elapsed_ms: float


Deliver = Callable[[str, RetrievalMeta], Any]


class RetrievalManager:
    """Runs the retrievals of one call.

    Args:
        router: the router (may be shared between calls).
        deliver: `deliver(reference, meta)`, sync or async; called at most once per retrieval, never after
            `close()`, never after the deadline.
        capture: the call's question capture (None when every `<ret>` comes with a `question=` text).
        on_event: receives every `RetrievalEvent` (exceptions in it are logged, never raised).
        db: the call's Context DB (tool turns are recorded there; created when None).
        ctx: the call's `CallContext` for tools (default: `db.ctx`).
        config: a `duetaspan.config.RetrievalConfig` (deadline_s, max_reference_tokens).
        call_id: stamped on events (default: `ctx.call_id` or a random id).
    """

    def __init__(
        self,
        *,
        router: Router,
        deliver: Deliver,
        capture: QuestionCapture | None = None,
        on_event: Callable[[RetrievalEvent], Any] | None = None,
        db: ContextDB | None = None,
        ctx: CallContext | None = None,
        config: Any = None,
        call_id: str | None = None,
    ) -> None:
        self.router = router
        self.deliver = deliver
        self.capture = capture
        self.on_event = on_event
        self.db = db if db is not None else ContextDB(ctx=ctx)
        self.ctx = ctx if ctx is not None else self.db.ctx
        if self.ctx is None:  # one context for all of the call's tool calls: side effects run once per call
            self.ctx = CallContext(call_id=call_id) if call_id else CallContext()
        # a side-effect tool that finishes after its retrieval's deadline is still recorded
        self.ctx.on_late_result = self._late_result
        self.deadline_s = float(getattr(config, "deadline_s", 2.5))
        self.max_reference_chars = CHARS_PER_TOKEN * int(getattr(config, "max_reference_tokens", 250))
        self.call_id = call_id or (self.ctx.call_id if self.ctx is not None else uuid.uuid4().hex)
        self._ids = itertools.count(1)
        self._task: asyncio.Task | None = None
        self._closed = False
        self._acted: set[str] = set()  # call keys of side effects that ran in this call

    @property
    def in_flight(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def closed(self) -> bool:
        return self._closed

    def on_ret(
        self,
        frame_index: int,
        t: float | None = None,
        *,
        question: str | None = None,
        heard_t: float | None = None,
    ) -> bool:
        """Start a retrieval for a `<ret>` at `frame_index` / stream time `t` (call it on the event loop).

        `question` skips capture (text-only front ends, tests). `heard_t`: where the `<ret>` falls on the
        capture's timeline (the caller's stream, which concealed ticks and dropped caller frames move away from
        the call's time), when it is not `t`. Returns False when deduplicated or closed.
        """
        if self._closed:
            return False
        loop = asyncio.get_running_loop()
        started = loop.time()
        if self.in_flight:
            log.info(
                "call %s: <ret> at frame %d ignored, a retrieval is in flight", self.call_id, frame_index
            )
            self._emit(
                RetReceived, 0, frame_index, started, t=t if t is not None else -1.0, deduplicated=True
            )
            return False
        retrieval_id = next(self._ids)
        self._emit(RetReceived, retrieval_id, frame_index, started, t=t if t is not None else -1.0)
        heard = heard_t if heard_t is not None else t
        self._task = loop.create_task(self._run(retrieval_id, frame_index, heard, question, started))
        return True

    async def wait(self) -> None:
        """Wait until no retrieval is in flight (tests, graceful shutdown)."""
        task = self._task
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)

    async def close(self) -> None:
        """Hang-up: cancel the retrieval in flight; `deliver` is never called again. Idempotent."""
        self._closed = True
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- one retrieval -----------------------------------------------------------------------------------
    async def _run(
        self, retrieval_id: int, frame_index: int, t: float | None, question_text: str | None, started: float
    ) -> None:
        loop = asyncio.get_running_loop()
        stage = "capture"
        _RETRIEVAL.set((retrieval_id, frame_index, started))

        def emit(cls: type[RetrievalEvent], **fields: Any) -> None:
            self._emit(cls, retrieval_id, frame_index, started, **fields)

        def failed(at: str, error: str) -> None:  # one log line per failed retrieval, then the event
            log.warning("call %s: retrieval %d failed at %s: %s", self.call_id, retrieval_id, at, error)
            emit(RetrievalFailed, stage=at, error=error)

        def on_step(step: RouteStep) -> None:
            if step.kind == "tool" and step.tool is not None:
                emit(
                    ToolCalled,
                    tool=step.tool,
                    arguments=step.arguments or {},
                    ok=step.ok,
                    tool_ms=step.ms,
                    error=step.error,
                )

        deadline = asyncio.timeout_at(started + self.deadline_s)
        reference: str | None = None
        try:
            async with deadline:
                if question_text is not None:
                    question = Question(" ".join(question_text.split()), "final")
                elif self.capture is not None:
                    question = await self.capture.question(t)
                else:
                    raise RuntimeError("no capture configured and no question text given")
                emit(
                    QuestionCaptured,
                    text=question.text,
                    how=question.how,
                    asr_ms=question.asr_ms,
                    wait_ms=question.wait_ms,
                    audio_s=question.audio_s,
                    words=[w.as_dict() for w in question.words],
                )
                if not question.text:
                    emit(NoSpan, reason="empty question")
                    return
                stage = "router"
                result = await self.router.route(
                    question.text, db=self.db, ctx=self.ctx, on_step=on_step, skip=self._acted
                )
                emit(
                    RouterDecided,
                    decision=result.decision,
                    llm_ms=result.llm_ms,
                    attempts=result.attempts,
                    tool=result.tool,
                    detail=result.detail,
                )
                for call in result.ran:  # every call of the reply, each with its own result
                    if call.tool_result is not None and call.tool_result.ok:
                        if call.tool_result.side_effect:  # a later <ret> never books the same thing again
                            self._acted.add(call.key)
                        if call.reference:
                            self.db.add_tool_turn(call.tool, call.arguments, call.reference)
                if result.decision == "error":
                    failed("router", result.detail or "router failed")
                    return
                if not result.reference:
                    emit(
                        NoSpan,
                        reason=f"{result.decision}: {result.detail}" if result.detail else result.decision,
                    )
                    return
                reference = one_line(result.reference, self.max_reference_chars)
                source = f"tool:{result.tool}" if result.decision == "tool" else result.decision
                emit(ReferenceReady, reference=reference, source=source)
                stage = "deliver"
                if self._closed:
                    return
                meta = RetrievalMeta(
                    self.call_id,
                    retrieval_id,
                    frame_index,
                    t,
                    question.text,
                    question.how,
                    source,
                    (loop.time() - started) * 1000.0,
                )
                delivered = self.deliver(reference, meta)
                if inspect.isawaitable(delivered):
                    delivered = await delivered
                if delivered is False:  # the call's engine slot refused it (the call is ending)
                    failed("deliver", "the engine refused the span: the call's slot has ended")
                    return
                emit(Delivered, reference=reference, total_ms=(loop.time() - started) * 1000.0)
        except TimeoutError as exc:
            if not deadline.expired():
                failed(stage, str(exc) or type(exc).__name__)
            else:
                log.warning(
                    "call %s: retrieval %d late: no span after %.1f s (stage %s)",
                    self.call_id, retrieval_id, self.deadline_s, stage,
                )  # fmt: skip
                emit(LateSpan, stage=stage, deadline_s=self.deadline_s, reference=reference)
        except asyncio.CancelledError:
            emit(RetrievalCancelled, stage=stage)
            raise
        except TranscriptionError as exc:
            failed(stage, str(exc))
        except Exception as exc:  # a bug must cost one span, never the call or later retrievals
            log.exception("call %s: retrieval %d failed at %s (a bug)", self.call_id, retrieval_id, stage)
            emit(RetrievalFailed, stage=stage, error=f"{type(exc).__name__}: {exc}")

    def _late_result(self, result: Any) -> None:
        """A side-effect tool call that finished after its retrieval ended: into the Context DB (the next
        `<ret>`'s router sees it) and the call record."""
        reference = result.reference if result.ok else None
        if reference:
            self.db.add_tool_turn(result.name, result.redacted_arguments(), reference)
        log.info(
            "call %s: %s finished after its retrieval ended (ok=%s)", self.call_id, result.name, result.ok
        )
        if self._closed:  # the call is over: its record is closed, the Context DB dies with it
            return
        retrieval_id, frame_index, started = _RETRIEVAL.get() or (0, -1, asyncio.get_running_loop().time())
        self._emit(
            ToolCalled, retrieval_id, frame_index, started, tool=result.name,
            arguments=result.redacted_arguments(), ok=result.ok, tool_ms=result.elapsed_ms,
            error=result.error, late=True, reference=reference,
        )  # fmt: skip

    def _emit(
        self, cls: type[RetrievalEvent], retrieval_id: int, frame_index: int, started: float, **fields: Any
    ) -> None:
        if self.on_event is None:
            return
        at_ms = (asyncio.get_running_loop().time() - started) * 1000.0
        try:
            event = cls(
                call_id=self.call_id,
                retrieval_id=retrieval_id,
                frame_index=frame_index,
                at_ms=at_ms,
                **fields,
            )
            self.on_event(event)
        except Exception:
            log.exception("call %s: on_event listener failed", self.call_id)
