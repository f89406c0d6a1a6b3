"""The glue between a call's `DuetaSpanService` and the router: question capture fed with the levelled caller
audio, the `RetrievalManager` told about each `<ret>`, references delivered as spans, every event recorded.

`RouterRetrieval.factory(router, asr, ...)` returns what `DuetaSpanService(retrieval=...)` expects: a callable
taking the service's `deliver` and `on_event` and returning the call's backend.

Example:
    >>> def build(agent, ctx):                                           # doctest: +SKIP
    ...     return RouterRetrieval.factory(agent.shared["router"], agent.shared["asr"], ctx=ctx,
    ...                                    capture=agent.config.capture, retrieval=agent.config.retrieval)
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from duetaspan.model.convention import SAMPLE_RATE
from duetaspan.registry import CallContext
from duetaspan.router.capture import QuestionCapture, Utterance
from duetaspan.router.context_db import ContextDB
from duetaspan.router.retrieval import RetrievalManager, RetrievalMeta
from duetaspan.router.router import Router


class RouterRetrieval:
    """One call's `<ret>` backend on top of `duetaspan.router` (see the module docstring)."""

    def __init__(
        self,
        router: Router,
        asr: Any,
        deliver: Any,
        on_event: Any,
        *,
        ctx: CallContext | None = None,
        capture: Any = None,
        retrieval: Any = None,
        vad: Any = None,
    ) -> None:
        self._deliver = deliver
        self._on_event = on_event
        self._arguments: dict[int, dict[str, Any]] = {}
        self.db = ContextDB(ctx=ctx)
        self.capture = (
            QuestionCapture(asr, capture, on_utterance=self._on_utterance, on_speech=self._on_speech, vad=vad)
            if asr is not None
            else None
        )
        self.manager = RetrievalManager(
            router=router,
            deliver=self._deliver_span,
            capture=self.capture,
            on_event=self._event,
            db=self.db,
            ctx=ctx,
            config=retrieval,
        )

    @classmethod
    def factory(cls, router: Router, asr: Any, **kwargs: Any):
        """A `RetrievalFactory` for `DuetaSpanService(retrieval=...)`."""
        return lambda deliver, on_event: cls(router, asr, deliver, on_event, **kwargs)

    # the service's side --------------------------------------------------------------------------
    async def feed(self, pcm: np.ndarray, t: float) -> None:
        if self.capture is not None:
            await self.capture.feed(pcm, SAMPLE_RATE, t)

    def on_ret(self, frame_index: int, t: float, caller_t: float | None = None) -> None:
        """A `<ret>` at call time `t`, the model having heard the caller's stream up to `caller_t` (None: a
        concealed tick, it heard all that had arrived): the question is taken on the caller's stream."""
        heard = caller_t if caller_t is not None or self.capture is None else self.capture.now
        self.manager.on_ret(frame_index, t, heard_t=heard)

    def on_agent_text(self, text: str, t: float) -> None:
        self.db.add_agent_text(text)

    async def close(self) -> None:
        await self.manager.close()
        if self.capture is not None:
            with contextlib.suppress(Exception):
                await self.capture.aclose()

    # the router's side ---------------------------------------------------------------------------
    def _event(self, event: Any) -> None:
        if getattr(event, "kind", None) == "tool":
            # the span's tool is the reply's first call that ran: keep its arguments (already redacted)
            self._arguments.setdefault(event.retrieval_id, dict(event.arguments))
        self._on_event(event)

    def _deliver_span(self, reference: str, meta: RetrievalMeta) -> Any:
        tool = meta.source.removeprefix("tool:") if meta.source.startswith("tool:") else None
        return self._deliver(
            reference,
            {
                "question": meta.question,
                "how": meta.how,
                "tool": tool,
                "arguments": self._arguments.pop(meta.retrieval_id, None),
                "retrieval_id": meta.retrieval_id,
                "ret_frame": meta.frame_index,
                "elapsed_ms": meta.elapsed_ms,
            },
        )

    def _on_speech(self, state: str, t: float) -> None:
        self._on_event(speech_event(state, t))

    def _on_utterance(self, utterance: Utterance) -> None:
        if not utterance.text:
            return
        self.db.add_utterance(utterance.text, utterance.end)
        self._on_event(utterance_event(utterance))


class CallerListener:
    """The caller's side without a router: voice detection and a transcript of each utterance, reported as
    the same events `RouterRetrieval` reports (so the service emits the caller's turn frames and
    `TranscriptionFrame`s); a `<ret>` gets no span. What `Agent(router=False, asr=...)` gives each call."""

    def __init__(
        self, asr: Any, deliver: Any, on_event: Any, *, capture: Any = None, vad: Any = None
    ) -> None:
        self._on_event = on_event
        self.capture = QuestionCapture(
            asr,
            capture,
            on_utterance=self._on_utterance,
            on_speech=lambda state, t: on_event(speech_event(state, t)),
            vad=vad,
        )

    @classmethod
    def factory(cls, asr: Any, **kwargs: Any):
        """A `RetrievalFactory` for `DuetaSpanService(retrieval=...)`."""
        return lambda deliver, on_event: cls(asr, deliver, on_event, **kwargs)

    async def feed(self, pcm: np.ndarray, t: float) -> None:
        await self.capture.feed(pcm, SAMPLE_RATE, t)

    def on_ret(self, frame_index: int, t: float, caller_t: float | None = None) -> None:
        """No router to ask: the `<ret>` is recorded by the service and lands no span."""

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.capture.aclose()

    def _on_utterance(self, utterance: Utterance) -> None:
        if utterance.text:
            self._on_event(utterance_event(utterance))


def speech_event(state: str, t: float) -> dict[str, Any]:
    """The capture's voice detection as a retrieval event (`state`: "started" or "stopped")."""
    return {"kind": "caller_speech", "state": state, "t": round(t, 3)}


def utterance_event(utterance: Utterance) -> dict[str, Any]:
    """A transcribed utterance as a retrieval event."""
    return {
        "kind": "caller_utterance",
        "text": utterance.text,
        "start": round(utterance.start, 3),
        "end": round(utterance.end, 3),
        "asr_ms": round(utterance.asr_ms, 1),
        "t": round(utterance.start, 3),
        "words": [w.as_dict() for w in utterance.words],
    }
