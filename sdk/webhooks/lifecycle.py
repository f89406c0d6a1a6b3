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
sends it), and none that was not: each call's index row says what it is still owed (`owed`: `end` from
`call.started` until `call.ended` commits, then `analysis` until `call.analyzed` does, where analysis is on).
A server killed after writing a call's record and before committing its `call.ended`, or during its analysis,
leaves the row owed; `resume` (at the start, `IDLE_S` later, then every `RESUME_EVERY_S`: a store that was
down meanwhile is caught up too) finishes every owed call whose record is in this server's folder and
untouched for `IDLE_S` (another server's call, or one closing now, is not taken): its `call.ended` from the
record, and its analysis (kept where the killed process had written it into the record) and `call.analyzed`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from duetaspan.pipeline.abandoned import IDLE_S, finish_abandoned
from duetaspan.pipeline.artifacts import CallRecorder, load_call_record, record_json_path, update_record
from duetaspan.store import CallEntry, Store, entry_from_record
from duetaspan.tools.call_control import transfer_target
from duetaspan.webhooks.delivery import Deliverer
from duetaspan.webhooks.events import call_ended_data
from duetaspan.webhooks.redact import Redactor

if TYPE_CHECKING:  # the router's port and the analysis load only where analysis is configured (served.py)
    from duetaspan.router.ports import ChatModel
    from duetaspan.webhooks.analysis import Analyzer

log = logging.getLogger(__name__)
STOP_WAIT_S = 30.0
RESUME_EVERY_S = 300.0  # after the start's two passes: owed calls (a store that was down when they ended)


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
        self._following: set[str] = set()  # calls this process is still doing after-call work for

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

    def _spawn(self, work: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("after-call work %s failed", task.get_name(), exc_info=task.exception())

    def _wanted(self, type_: str) -> bool:
        return self.deliverer is not None and self.webhooks.wants(type_)

    async def _write(
        self, entry: CallEntry | None, type_: str, call_id: str, data: dict[str, Any], *, owed: Any = ...
    ) -> None:
        """The index row (`entry`), what the call is still owed (`owed`, where given) and the event: one
        transaction."""
        async with self.store.transaction() as tx:
            if entry is not None:
                await tx.index_call(entry)
            if owed is not ...:
                await tx.set_owed(call_id, owed)
            if self._wanted(type_):
                await tx.emit(type_, call_id=call_id, data=data)
        if self.deliverer is not None:
            self.deliverer.wake()

    async def _write_after(self, first: asyncio.Task[Any], type_: str, call_id: str, data: dict[str, Any]) -> None:
        """The event `type_` once `first` (the call's start: its row and `call.started`) is written: on
        PostgreSQL each write runs on a connection of its own, and the start's, with more to write, could
        commit after a `call.answered` spawned just after it."""
        await asyncio.gather(first, return_exceptions=True)
        await self._write(None, type_, call_id, data)

    @property
    def _analyses(self) -> bool:
        return self.analyzer is not None and self.llm is not None

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
        self._following.add(call_id)
        start = self._spawn(self._write(entry, "call.started", call_id, data, owed="end"), f"call.started {call_id}")
        answered: dict[str, Any] = {}  # the transport's answer, then the verdict (`decided`), then `sent`

        def answer_news() -> None:  # call.answered once both are known (the verdict only where detection ran)
            if "answered_at" not in answered or "sent" in answered or (detect and "decided" not in answered):
                return
            answered["sent"] = True
            data = {"answered_at": answered["answered_at"], "direction": answered.get("direction"),
                    "verdict": answered.get("verdict"), "detected": detect}  # fmt: skip
            self._spawn(self._write_after(start, "call.answered", call_id, data), f"call.answered {call_id}")

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
                    work = self._write_after(start, "call.transferred", call_id, data)
                    self._spawn(work, f"call.transferred {call_id}")

        def after_close(record: dict[str, Any]) -> None:
            # once the start's write is in (on PostgreSQL it may run on another connection, and land later)
            self._spawn(self._ended(record, recorder.dir, after=start), f"call.ended {call_id}")

        recorder.on_event.append(on_event)
        recorder.after_close.append(after_close)

    def _transferred(self, arguments: Any, t: float) -> dict[str, Any]:
        """`call.transferred`'s data from the tool call's (redacted) arguments: `to` is where the tool sent the
        call (`transfer_target`: a named destination's number), `destination` what the agent asked for."""
        arguments = arguments if isinstance(arguments, dict) else {}
        asked = str(arguments.get("destination") or arguments.get("target") or arguments.get("to") or "")
        data = {"to": transfer_target(asked, self.transfer_targets) or asked, "destination": asked, "t": t}
        return self.redactor.redact_value(data) if self.redactor is not None else data

    def finish_abandoned(
        self, folder: Path, idle_s: float = IDLE_S, *, resume_every_s: float | None = RESUME_EVERY_S
    ) -> None:
        """Finish what an earlier process left undone in `folder` now and once more `idle_s` later (a server
        restarted at once finds its files still fresh): the calls it left open (`duetaspan.pipeline.abandoned`),
        each indexed and given its `call.ended` (and analysis) like a call that closed, and the calls still owed
        their after-call work (`resume`, also every `resume_every_s` after that; None: not)."""

        async def passes() -> None:
            delays = [0.0, idle_s]  # the open calls only then: they come from a process that ended before
            while delays or resume_every_s is not None:
                start_passes = bool(delays)
                await asyncio.sleep(delays.pop(0) if delays else resume_every_s or 0.0)
                if start_passes:
                    records = await asyncio.to_thread(finish_abandoned, folder, self.redactor, idle_s=idle_s)
                    for record in records:
                        call_id = str(record.get("call_id"))
                        self._following.add(call_id)
                        self._spawn(self._ended(record, folder), f"call.ended {call_id} (abandoned)")
                await self.resume(folder, idle_s=idle_s)

        self._finishing = asyncio.get_running_loop().create_task(passes(), name="finishing abandoned calls")
        self._finishing.add_done_callback(self._done)

    async def resume(self, folder: Path, *, idle_s: float = IDLE_S) -> list[str]:
        """Finish the after-call work of the calls the store says are owed it (the module docstring) whose
        record is in `folder`, untouched for `idle_s`, and not followed by this process; their ids."""
        async with self.store.transaction() as tx:
            owed = await tx.owed_calls()
        now, taken = time.time(), []
        for call_id, what in owed:
            if call_id in self._following or (what == "analysis" and not self._analyses):
                continue  # this process's own call, or an analysis only a server with `[analysis]` makes
            path = record_json_path(folder, call_id)
            try:
                if now - path.stat().st_mtime < idle_s:
                    continue  # closing now, maybe on another server on this folder
                record = await asyncio.to_thread(load_call_record, folder, call_id)
            except (OSError, ValueError) as exc:  # not in this folder (another server's), or unreadable
                if not isinstance(exc, FileNotFoundError):
                    log.warning("call %s: owed its %s, but its record %s is unreadable: %s", call_id, what, path, exc)
                continue
            if not isinstance(record, dict):
                continue
            record.setdefault("call_id", call_id)
            log.warning("call %s: its %s was not sent by the process that ran it; sending it now", call_id,
                        "call.ended" if what == "end" else "analysis")  # fmt: skip
            self._following.add(call_id)
            work = self._ended(record, folder) if what == "end" else self._analyse(record, folder)
            self._spawn(work, f"{'call.ended' if what == 'end' else 'call.analyzed'} {call_id} (resumed)")
            taken.append(call_id)
        return taken

    async def _ended(self, record: dict[str, Any], folder: Path, *, after: asyncio.Task[Any] | None = None) -> None:
        call_id = str(record.get("call_id"))
        try:
            if after is not None:  # the start's row and `owed`, which must not land over the end's
                await asyncio.gather(after, return_exceptions=True)
            owed = "analysis" if self._analyses else None
            entry = entry_from_record(record, folder)
            await self._write(entry, "call.ended", call_id, call_ended_data(record), owed=owed)
            if owed:
                await self._analyse(record, folder)
        finally:
            self._following.discard(call_id)

    async def _analyse(self, record: dict[str, Any], folder: Path) -> None:
        """The call's analysis into its record, then `call.analyzed` (the record's own analysis where a killed
        process had written it before its event)."""
        assert self.analyzer is not None and self.llm is not None
        call_id = str(record.get("call_id"))
        try:
            result = record.get("analysis")
            if not isinstance(result, dict):
                result = await self.analyzer.run(self.llm, record)
                if self.redactor is not None:  # what the LLM wrote may quote what was said
                    result = self.redactor.redact_value(result)
                await asyncio.to_thread(update_record, folder, call_id, analysis=result)
            await self._write(None, "call.analyzed", call_id, result, owed=None)
        finally:
            self._following.discard(call_id)


__all__ = ["AfterCall"]
