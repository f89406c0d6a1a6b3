"""A served agent's after-call work: lifecycle events into the store's outbox (each in the transaction of the
state change it reports), the deliverer that sends them, end-of-call analysis, and redaction of each call's
record.

Per call (`attach`, from the agent when the call's recorder exists):

    call.started      the call's index row created (not complete) + the event, one transaction
    call.answered     the transport's `meta` says the call was answered; with answer detection on the call, once
                      the gate's first verdict (`answer` event) came too (at the close: the verdict null)
    call.transferred  a `transfer_call` tool call succeeded (the record's `retrieval` event of kind `tool`,
                      `ok`): where it sent the call
    call.ended        the record closed: the index row completed + the event, one transaction
    call.analyzed     the analysis written into the record (`update_record`) + the event

Events are only written when `[webhooks] urls` is set (nobody else reads the outbox); the index rows always.
Work that outlives the call (the store writes, the analysis) runs in tasks that `stop()` waits for, so a
drained server finishes them; a killed one loses no event that was committed (the deliverer of the next start
sends it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

from duetaspan.pipeline.abandoned import IDLE_S, finish_abandoned
from duetaspan.pipeline.artifacts import CallRecorder, update_record
from duetaspan.router.ports import ChatModel
from duetaspan.store import CallEntry, Store, entry_from_record
from duetaspan.tools.call_control import transfer_target
from duetaspan.webhooks.analysis import Analyzer
from duetaspan.webhooks.delivery import Deliverer
from duetaspan.webhooks.events import call_ended_data
from duetaspan.webhooks.redact import Redactor

log = logging.getLogger(__name__)
STOP_WAIT_S = 30.0


class AfterCall:
    """One server's lifecycle events, delivery and analysis."""

    def __init__(
        self,
        store: Store,
        *,
        webhooks: Any,
        secrets: Sequence[str] = (),
        analyzer: Analyzer | None = None,
        llm: ChatModel | None = None,
        redactor: Redactor | None = None,
        poll_s: float = 1.0,
        transfer_targets: Mapping[str, str] | None = None,
    ) -> None:
        self.store = store
        self.transfer_targets = dict(transfer_targets or {})  # `[tools.settings] transfer_targets`
        self.webhooks = webhooks
        self.analyzer = analyzer
        self.llm = llm
        self.redactor = redactor if redactor else None
        self.deliverer: Deliverer | None = None
        if webhooks.urls:
            self.deliverer = Deliverer(
                store,
                webhooks.urls,
                secrets,
                retry_for_s=webhooks.retry_for_s,
                timeout_s=webhooks.timeout_s,
                max_backoff_s=webhooks.max_backoff_s,
                poll_s=poll_s,
                wants=webhooks.wants,
            )
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stop = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._finishing: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the deliverer (it first sends what an earlier process left in the outbox)."""
        if self.deliverer is not None and self._worker is None:
            self._worker = asyncio.create_task(self.deliverer.run(self._stop), name="webhooks-deliverer")

    async def stop(self) -> None:
        """Finish the calls' pending store writes and analyses (up to `STOP_WAIT_S`), then the deliverer."""
        if self._finishing is not None:  # its second pass waits `IDLE_S`: no reason to hold a shutdown
            self._finishing.cancel()
            await asyncio.gather(self._finishing, return_exceptions=True)
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=STOP_WAIT_S)
            for task in late:
                log.warning("after-call work still running at shutdown: cancelled (%s)", task.get_name())
                task.cancel()
        self._stop.set()
        if self._worker is not None:
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None
        if self.llm is not None:
            await self.llm.aclose()

    def _spawn(self, work: Coroutine[Any, Any, Any], name: str) -> None:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("after-call work %s failed", task.get_name(), exc_info=task.exception())

    def _wanted(self, type_: str) -> bool:
        return self.deliverer is not None and self.webhooks.wants(type_)

    async def _write(self, entry: CallEntry | None, type_: str, call_id: str, data: dict[str, Any]) -> None:
        async with self.store.transaction() as tx:
            if entry is not None:
                await tx.index_call(entry)
            if self._wanted(type_):
                await tx.emit(type_, call_id=call_id, data=data)
        if self.deliverer is not None:
            self.deliverer.wake()

    def attach(
        self, recorder: CallRecorder, *, caller: str | None, called: str | None, transport: str, detect: bool = False
    ) -> None:
        """Follow one call: its start now, what its recorder writes, its end. `detect`: the call has an answer
        gate (`duetaspan.agent.answer`), so `call.answered` waits for its verdict."""
        if self.redactor is not None:
            recorder.redactor = self.redactor
        call_id, started = recorder.call_id, time.time()
        entry = CallEntry(call_id, transport=transport, from_number=caller, to_number=called, started_at=started)
        data = {"caller": caller, "called": called, "transport": transport, "started_at": started}
        self._spawn(self._write(entry, "call.started", call_id, data), f"call.started {call_id}")
        answered: dict[str, Any] = {}  # the transport's answer, then the verdict (`decided`), then `sent`

        def answer_news() -> None:  # call.answered once both are known (the verdict only where detection ran)
            if "answered_at" not in answered or "sent" in answered or (detect and "decided" not in answered):
                return
            answered["sent"] = True
            data = {"answered_at": answered["answered_at"], "direction": answered.get("direction"),
                    "verdict": answered.get("verdict"), "detected": detect}  # fmt: skip
            self._spawn(self._write(None, "call.answered", call_id, data), f"call.answered {call_id}")

        def on_event(kind: str, fields: dict[str, Any]) -> None:
            if kind == "meta" and fields.get("outcome") == "answered" and "answered_at" not in answered:
                answered.update(answered_at=time.time(), direction=fields.get("direction"))
                if verdict := fields.get("verdict") or fields.get("answered_by"):  # a transport's own verdict
                    answered.setdefault("verdict", verdict)
                answer_news()
            elif kind == "answer" and "decided" not in answered:  # the gate's first verdict
                answered.update(decided=True, verdict=fields.get("verdict"))
                answer_news()
            elif kind == "meta" and isinstance(fields.get("answer"), dict):  # closing, maybe before a verdict
                answered.setdefault("verdict", fields["answer"].get("verdict"))
                answered["decided"] = True
                answer_news()
            elif kind == "retrieval" and fields.get("kind") == "tool" and fields.get("tool") == "transfer_call":
                if fields.get("ok"):  # a refused destination (or a failing tool) hands nothing on
                    data = self._transferred(fields.get("arguments"), round(time.time() - started, 3))
                    self._spawn(self._write(None, "call.transferred", call_id, data), f"call.transferred {call_id}")

        def after_close(record: dict[str, Any]) -> None:
            self._spawn(self._ended(record, recorder.dir), f"call.ended {call_id}")

        recorder.on_event.append(on_event)
        recorder.after_close.append(after_close)

    def _transferred(self, arguments: Any, t: float) -> dict[str, Any]:
        """`call.transferred`'s data from the tool call's (redacted) arguments: `to` is where the tool sent the
        call (`transfer_target`: a named destination's number), `destination` what the agent asked for."""
        arguments = arguments if isinstance(arguments, dict) else {}
        asked = str(arguments.get("destination") or arguments.get("target") or arguments.get("to") or "")
        data = {"to": transfer_target(asked, self.transfer_targets) or asked, "destination": asked, "t": t}
        return self.redactor.redact_value(data) if self.redactor is not None else data

    def finish_abandoned(self, folder: Path, idle_s: float = IDLE_S) -> None:
        """Finish the calls an earlier process left open in `folder` (`duetaspan.pipeline.abandoned`) now and
        once more `idle_s` later (a server restarted at once finds their journals still fresh); each is
        indexed and gets its `call.ended` (and analysis) like a call that closed."""

        async def twice() -> None:
            for delay in (0.0, idle_s):
                await asyncio.sleep(delay)
                records = await asyncio.to_thread(finish_abandoned, folder, self.redactor, idle_s=idle_s)
                for record in records:
                    call_id = record.get("call_id")
                    self._spawn(self._ended(record, folder), f"call.ended {call_id} (abandoned)")

        self._finishing = asyncio.get_running_loop().create_task(twice(), name="finishing abandoned calls")
        self._finishing.add_done_callback(self._done)

    async def _ended(self, record: dict[str, Any], folder: Path) -> None:
        call_id = str(record.get("call_id"))
        await self._write(entry_from_record(record, folder), "call.ended", call_id, call_ended_data(record))
        if self.analyzer is None or self.llm is None:
            return
        result = await self.analyzer.run(self.llm, record)
        if self.redactor is not None:  # what the LLM wrote may quote what was said
            result = self.redactor.redact_value(result)
        update_record(folder, call_id, analysis=result)
        await self._write(None, "call.analyzed", call_id, result)


__all__ = ["AfterCall"]
