"""The in-thread engine host: one OS thread per engine that runs its 80 ms clock and steps every open call
slot in one batched step.

Model compute never runs on an event loop. A `ThreadHost` owns one thread which

- runs slot commands (`open_slot` on attach, `close_slot` on detach) between ticks; a new call's persona
  prompt is not written in one go there but queued (`open_slot(defer_prefill=True)`) and written in chunks
  that fit the time left before the next tick (`engine.prefill_pending(budget_ms)`), so a burst of callers
  never delays the live calls (the new caller hears a few frames of silence meanwhile); when ticks leave no
  room for `starved_ticks` ticks in a row, a chunk of at least 4 frames runs anyway so a new call always
  gets going,
- ticks on absolute deadlines `t0 + k * 80 ms` (never `sleep(80 ms)`, so error does not accumulate), and
  measures how late each tick starts (`ClockStats`),
- takes one caller frame per slot from that slot's bounded input queue; a slot whose audio has not arrived
  (packet loss, jitter) gets a frame of silence ("concealed"), audio that arrives late is still used on the
  following ticks ("catches up"), and a backlog beyond `max_backlog_frames` drops its oldest frames so a
  burst cannot add latency for the rest of the call,
- calls `engine.step({slot: pcm, ...})` once for all slots and reports each result to its runner
  (`HostEvents.tick`), which hands it to the call's event loop.

If a tick overruns (a long span prefill, a slow machine) the next ticks run back to back to catch up; beyond
`max_catchup_ticks` missed deadlines the missed ticks are skipped (counted) and the clock stays on its grid.

A step that raises is reported to each call on it (`HostEvents.call_failed`) and the clock goes on; after
`max_failed_steps` failed steps in a row, or at once for an error the engine marks fatal
(`duetaspan.model.faults.is_fatal`: a sticky CUDA error), the host goes down: `error` is set to an
`EngineFailed`, the thread ends, and `HostEvents.host_down(error, crashed=True)` ends every call on it.
The engine process runs this same host in its child (`duetaspan.pipeline.process_child`).

Example:
    >>> async def main(engine):                              # doctest: +SKIP
    ...     async with EngineRunner(host=ThreadHost(engine)) as runner:   # = EngineRunner(engine)
    ...         call = await runner.attach("CA1", on_output=print)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from duetaspan.model.convention import FRAME_MS, FRAME_SIZE
from duetaspan.model.faults import TestFault, is_fatal
from duetaspan.pipeline.host import HostEvents
from duetaspan.pipeline.ticks import ClockStats, EngineFailed, SlotStats, StepEngine, TickOutput

log = logging.getLogger(__name__)


class SlotQueue:
    """One call's bounded input queue and its figures. `push` is thread-safe; `take` runs on the engine thread."""

    def __init__(self, key: int, slot: int, max_backlog_frames: int) -> None:
        self.key = key
        self.slot = slot
        self.stats = SlotStats()
        self._max_backlog = max_backlog_frames
        self._queue: deque[tuple[int, np.ndarray]] = deque()  # (caller stream frame number, pcm)
        self._lock = threading.Lock()
        self._frames = 0

    def push(self, pcm: np.ndarray) -> None:
        with self._lock:
            self._queue.append((self.stats.frames_in, pcm.astype(np.float32, copy=False)))
            self.stats.frames_in += 1
            while len(self._queue) > self._max_backlog:
                self._queue.popleft()
                self.stats.dropped += 1
            self.stats.max_backlog = max(self.stats.max_backlog, len(self._queue))

    @property
    def backlog(self) -> int:
        with self._lock:
            return len(self._queue)

    def take(self) -> tuple[np.ndarray, bool, int, int | None]:
        """(pcm, concealed, the call's tick number, the caller stream frame it holds: None when concealed)."""
        with self._lock:
            frame_no = self._frames
            self._frames += 1
            if self._queue:
                self.stats.frames_used += 1
                caller_no, pcm = self._queue.popleft()
                return pcm, False, frame_no, caller_no
            self.stats.concealed += 1
        return np.zeros(FRAME_SIZE, np.float32), True, frame_no, None


class ThreadHost:
    """An engine stepped by its own thread on an absolute-deadline clock (the `EngineHost` for one process).

    Args:
        engine: a `DuplexEngine` (or anything with its `open_slot/close_slot/step/inject/force_ret`).
        frame_ms: the clock period.
        max_backlog_frames: caller frames a slot may queue before the oldest are dropped.
        max_catchup_ticks: overdue ticks run back to back before the rest are skipped.
        max_failed_steps: failed engine steps in a row after which the host goes down (fatal errors: at once).
        bounded_opening: queue persona prefills into the ticks' spare time (engines with `prefill_pending`);
            False writes each in one go when its call opens (the old behaviour; benchmarks/burst.py).
        prefill_margin_ms: time kept free before each deadline.
        prefill_slack_ms: how late a gap's chunks may let the next tick start when the gap itself is too short
            for one pass (a pass has a fixed cost: reading the weights once). Bounded lateness, never a skip;
            0 keeps every tick on time and leaves tight engines to the starved-ticks rule.
    """

    def __init__(
        self,
        engine: StepEngine,
        *,
        frame_ms: float = FRAME_MS,
        max_backlog_frames: int = 4,
        max_catchup_ticks: int = 3,
        max_failed_steps: int = 3,
        name: str = "duetaspan-engine",
        bounded_opening: bool = True,
        prefill_margin_ms: float = 3.0,
        prefill_slack_ms: float = 15.0,
        starved_ticks: int = 8,
    ) -> None:
        if max_failed_steps < 1:
            raise ValueError(f"max_failed_steps must be >= 1, got {max_failed_steps}")
        self.engine = engine
        self.period = frame_ms / 1000.0
        self.max_backlog_frames = max_backlog_frames
        self.max_catchup_ticks = max_catchup_ticks
        self.max_failed_steps = max_failed_steps
        self.name = name
        self.bounded_opening = bounded_opening and hasattr(engine, "prefill_pending")
        self.prefill_margin_ms = prefill_margin_ms
        self.prefill_slack_ms = prefill_slack_ms
        self.starved_ticks = starved_ticks
        self._starved = 0  # ticks in a row that left no room for a queued prefill
        self.clock = ClockStats()
        self.error: BaseException | None = None  # set when the engine went down (its steps kept failing)
        self._failed_steps = 0  # consecutive
        self._fault = TestFault.from_env()  # DUETASPAN_TEST_ENGINE_FAULT only (tests); None otherwise
        self._events: HostEvents | None = None
        self._slots: dict[int, SlotQueue] = {}  # engine-thread owned; read (get) from any thread
        self._commands: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future]] = (
            queue.SimpleQueue()
        )
        self._wake = threading.Event()
        self._submitting = threading.Lock()  # a command is queued before a failed host drains, or refused
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def max_slots(self) -> int:
        return int(getattr(self.engine, "max_slots", 1))

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    def bind(self, events: HostEvents) -> None:
        self._events = events

    # lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine thread (idempotent); it is running when this returns."""
        if self.running:
            return
        if self.error is not None:
            raise self.error  # a failed engine's device state is lost: a new host (or process) is needed
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Close every slot and stop the thread."""
        if self._thread is None:
            return
        self._stop.set()
        self._wake.set()
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
        self._thread = None

    # slots --------------------------------------------------------------------------------------
    async def open_slot(
        self,
        key: int,
        call_id: str,
        *,
        persona: Any = None,
        sampling: Any = None,
        seed: int | None = None,
        hold_agent: bool = False,
    ) -> tuple[int, SlotStats]:
        def open_() -> tuple[int, SlotStats]:
            defer = {"defer_prefill": True} if self.bounded_opening and persona is not None else {}
            if hold_agent and hasattr(self.engine, "hold_agent"):  # held from its first step
                defer["hold_agent"] = True
            slot = self.engine.open_slot(persona=persona, sampling=sampling, seed=seed, **defer)
            slot_queue = SlotQueue(key, slot, self.max_backlog_frames)
            self._slots[key] = slot_queue
            return slot, slot_queue.stats

        return await asyncio.wrap_future(self._submit(open_))

    async def close_slot(self, key: int) -> None:
        def close_() -> None:
            slot_queue = self._slots.pop(key, None)
            if slot_queue is not None:
                self.engine.close_slot(slot_queue.slot)

        if self.running:
            await asyncio.wrap_future(self._submit(close_))

    def push(self, key: int, pcm: np.ndarray) -> None:
        slot_queue = self._slots.get(key)
        if slot_queue is not None:
            slot_queue.push(pcm)

    def backlog(self, key: int) -> int:
        slot_queue = self._slots.get(key)
        return slot_queue.backlog if slot_queue is not None else 0

    def inject(self, key: int, reference: str, span_id: int | None = None) -> bool:
        slot_queue = self._slots.get(key)
        return slot_queue is not None and bool(self.engine.inject(slot_queue.slot, reference, span_id))

    def force_ret(self, key: int) -> None:
        slot_queue = self._slots.get(key)
        if slot_queue is not None:
            self.engine.force_ret(slot_queue.slot)

    def hold_agent(self, key: int, on: bool) -> None:
        slot_queue = self._slots.get(key)
        hold = getattr(self.engine, "hold_agent", None)  # an engine without it: only the gate's silencing
        if slot_queue is not None and hold is not None:
            hold(slot_queue.slot, on)

    def _submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._submitting:
            if self.error is not None:
                fut.set_exception(self.error)
                return fut
            self._commands.put((fn, fut))
        self._wake.set()
        return fut

    # engine thread ------------------------------------------------------------------------------
    def _run_commands(self) -> None:
        while True:
            try:
                fn, fut = self._commands.get_nowait()
            except queue.Empty:
                return
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the awaiting coroutine
                fut.set_exception(exc)

    def _run(self) -> None:
        t0: float | None = None
        k = 0
        try:
            while not self._stop.is_set():
                self._wake.clear()
                self._run_commands()
                if not self._slots:
                    t0 = None  # idle: the grid restarts with the next call
                    self._wake.wait(0.5)
                    continue
                now = time.perf_counter()
                if t0 is None:
                    t0, k = now, 0
                deadline = t0 + k * self.period
                if now < deadline:
                    if self._prefill((deadline - now) * 1e3 - self.prefill_margin_ms + self.prefill_slack_ms):
                        continue  # some prompt written: look at commands and the clock again
                    # wake early for commands; the tick itself waits for its deadline
                    self._wake.wait(deadline - now)
                    continue
                lateness = now - deadline
                if lateness > self.max_catchup_ticks * self.period:
                    skip = int(lateness / self.period)
                    k += skip
                    self.clock.skipped_ticks += skip
                    self.clock.timing.skipped += skip
                    deadline = t0 + k * self.period
                    lateness = now - deadline
                if self._starved >= self.starved_ticks:
                    self._prefill(self.period * 1e3 / 4, forced=True)  # no room for too long: a chunk anyway
                self._tick(lateness)
                k += 1
        finally:
            self._finish()

    def _finish(self) -> None:
        if self.error is None:
            self._run_commands()
        else:  # opening more calls on a failed engine: refused with the reason
            with self._submitting:
                while True:
                    try:
                        _, fut = self._commands.get_nowait()
                    except queue.Empty:
                        break
                    if fut.set_running_or_notify_cancel():
                        fut.set_exception(self.error)
        for slot_queue in list(self._slots.values()):
            with contextlib.suppress(Exception):
                self.engine.close_slot(slot_queue.slot)
        self._slots.clear()
        if self.error is not None and self._events is not None:
            self._events.host_down(self.error, crashed=True)

    def _prefill(self, budget_ms: float, forced: bool = False) -> bool:
        """Write queued persona prompts for up to `budget_ms`; True when any was written."""
        if not self.bounded_opening or not getattr(self.engine, "openings", None):
            self._starved = 0
            return False
        if budget_ms <= 0:
            return False
        before = len(self.engine.openings.chunk_sizes)  # type: ignore[attr-defined]
        try:
            self.engine.prefill_pending(budget_ms, 4 if forced else 0)  # type: ignore[attr-defined]
        except Exception as exc:  # that call ends; the live ones go on
            log.exception("%s: persona prefill failed", self.name)
            slot = getattr(exc, "slot", None)
            for q in list(self._slots.values()):
                if q.slot == slot and self._events is not None:
                    self._events.call_failed(q.key, exc)
            return True
        wrote = len(self.engine.openings.chunk_sizes) > before  # type: ignore[attr-defined]
        if wrote or forced:
            self._starved = 0
        return wrote

    def _tick(self, lateness_s: float) -> None:
        c = self.clock
        c.ticks += 1
        if self.bounded_opening and getattr(self.engine, "openings", None):
            self._starved += 1
        c.last_lateness_ms = lateness_s * 1000.0
        c.max_lateness_ms = max(c.max_lateness_ms, c.last_lateness_ms)
        c.recent_lateness_ms.append(c.last_lateness_ms)
        if lateness_s > self.period / 2:
            c.late_ticks += 1
        events = self._events
        slots = list(self._slots.values())
        taken = {q.slot: q.take() for q in slots}
        started = time.perf_counter()
        try:
            if self._fault is not None:
                self._fault.before_step()
            results = self.engine.step({slot: pcm for slot, (pcm, *_) in taken.items()})
        except Exception as exc:
            self._step_failed(exc, slots, sorted(taken))
            return
        self._failed_steps = 0
        step_s = time.perf_counter() - started
        c.last_step_ms = step_s * 1000.0
        c.timing.observe(step_s, lateness_s, sum(took[1] for took in taken.values()))
        if events is None:
            return
        for q in slots:
            result = results.get(q.slot)
            if result is None:
                continue
            pcm, concealed, frame_no, caller_no = taken[q.slot]
            events.tick(q.key, TickOutput(result, pcm, frame_no, concealed, c.last_lateness_ms, caller_no))

    def _step_failed(self, exc: Exception, slots: list[SlotQueue], taken: list[int]) -> None:
        """One failed step: the calls hear of it; the host goes down after too many in a row, or a fatal one."""
        self.clock.timing.step_errors += 1
        self._failed_steps += 1
        fatal = is_fatal(exc)
        n, most = self._failed_steps, self.max_failed_steps
        log.error(
            "%s: engine step failed for slots %s (%d in a row, %s): %s: %s",
            self.name, taken, n, "fatal" if fatal else f"down at {most}", type(exc).__name__, exc,
            exc_info=exc if n == 1 or fatal or n >= most else None,
        )  # fmt: skip
        if fatal or n >= most:
            why = "a fatal error" if fatal else f"{n} engine steps in a row failed"
            error = EngineFailed(f"{self.name}: the engine is down after {why}: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            self.error = error  # `running` is False from here: new calls are refused with it
            self._stop.set()  # the thread ends; `_finish` closes the slots and reports `host_down`
            return
        if self._events is not None:
            for q in slots:
                self._events.call_failed(q.key, exc)
