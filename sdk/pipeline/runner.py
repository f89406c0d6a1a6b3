"""The engine thread: one 80 ms clock per engine that steps every attached call slot in one batched step.

Model compute never runs on an event loop. Each `EngineRunner` owns one OS thread which

- runs slot commands (`open_slot` on attach, `close_slot` on detach) between ticks,
- ticks on absolute deadlines `t0 + k * 80 ms` (never `sleep(80 ms)`, so error does not accumulate), and
  measures how late each tick starts (`ClockStats`),
- takes one caller frame per slot from that slot's bounded input queue; a slot whose audio has not arrived
  (packet loss, jitter) gets a frame of silence ("concealed"), audio that arrives late is still used on the
  following ticks ("catches up"), and a backlog beyond `max_backlog_frames` drops its oldest frames so a
  burst cannot add latency for the rest of the call,
- calls `engine.step({slot: pcm, ...})` once for all slots and hands each result to its call's asyncio loop
  with `call_soon_threadsafe`.

If a tick overruns (a long span prefill, a slow machine) the next ticks run back to back to catch up; beyond
`max_catchup_ticks` missed deadlines the missed ticks are skipped (counted) and the clock stays on its grid.

Example:
    >>> async def main(engine):                              # doctest: +SKIP
    ...     async with EngineRunner(engine) as runner:
    ...         call = await runner.attach("CA1", on_output=print)
    ...         call.push(np.zeros(1920, np.float32))        # caller audio, one 80 ms frame at 24 kHz
    ...         await asyncio.sleep(1.0)                     # ~12 TickOutputs printed
    ...         await call.close()
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
from duetaspan.pipeline.ticks import (
    ClockStats,
    EngineFull,
    RunnerStopped,
    SlotStats,
    StepEngine,
    TickOutput,
    check_caller_frame,
    engine_full,
)

log = logging.getLogger(__name__)

__all__ = [
    "CallHandle",
    "CallSlot",
    "ClockStats",
    "EngineFull",
    "EngineRunner",
    "RunnerStopped",
    "SlotStats",
    "StepEngine",
    "TickOutput",
    "check_caller_frame",
    "engine_full",
]


class CallHandle:
    """What `CallSlot` (engine thread) and `RemoteCallSlot` (engine process) share: identity, stats, closing
    through their runner's `detach`, and handing outputs and errors to the call's event loop."""

    def __init__(
        self,
        runner: Any,
        call_id: str,
        slot: int,
        on_output: Callable[[TickOutput], None],
        loop: asyncio.AbstractEventLoop,
        on_error: Callable[[BaseException], None] | None,
    ) -> None:
        self.call_id = call_id
        self.slot = slot
        self.stats = SlotStats()
        self.closed = False
        self._runner = runner
        self._on_output = on_output
        self._on_error = on_error
        self._loop = loop

    async def close(self) -> None:
        """Detach from the runner and free the slot (idempotent)."""
        await self._runner.detach(self)

    def _fail(self, exc: BaseException) -> None:
        if self._on_error is not None:
            self._call_soon(self._on_error, exc)

    def _call_soon(self, fn: Callable[..., Any], arg: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, arg)
        except RuntimeError:  # the call's loop is closed: the call is gone, nothing to tell
            pass


class CallSlot(CallHandle):
    """One call's handle on the runner: push caller frames, inject references, detach.

    `push` and `inject` are thread-safe. Created by `EngineRunner.attach`.
    """

    def __init__(
        self,
        runner: EngineRunner,
        call_id: str,
        slot: int,
        on_output: Callable[[TickOutput], None],
        loop: asyncio.AbstractEventLoop,
        on_error: Callable[[BaseException], None] | None,
        max_backlog_frames: int,
    ) -> None:
        super().__init__(runner, call_id, slot, on_output, loop, on_error)
        self._max_backlog = max_backlog_frames
        self._queue: deque[np.ndarray] = deque()
        self._lock = threading.Lock()
        self._frames = 0

    def push(self, pcm: np.ndarray) -> None:
        """Queue one caller frame (float32[1920] at 24 kHz) for the next free tick."""
        check_caller_frame(pcm)
        with self._lock:
            self._queue.append(pcm.astype(np.float32, copy=False))
            self.stats.frames_in += 1
            while len(self._queue) > self._max_backlog:
                self._queue.popleft()
                self.stats.dropped += 1
            self.stats.max_backlog = max(self.stats.max_backlog, len(self._queue))

    @property
    def backlog(self) -> int:
        with self._lock:
            return len(self._queue)

    def inject(self, reference: str) -> bool:
        """Queue a Context Span with this reference; it lands before the slot's next step."""
        if self.closed:
            log.warning("call %s: reference dropped, the call has ended", self.call_id)
            return False
        return bool(self._runner.engine.inject(self.slot, reference))

    def force_ret(self) -> None:
        """Make the model sample `<ret>` on its next frame (tests, scripted demos)."""
        self._runner.engine.force_ret(self.slot)

    # engine-thread side -------------------------------------------------------------------------
    def _take(self) -> tuple[np.ndarray, bool, int]:
        with self._lock:
            frame_no = self._frames
            self._frames += 1
            if self._queue:
                self.stats.frames_used += 1
                return self._queue.popleft(), False, frame_no
            self.stats.concealed += 1
        return np.zeros(FRAME_SIZE, np.float32), True, frame_no

    def _deliver(self, out: TickOutput) -> None:
        self._call_soon(self._on_output, out)


class EngineRunner:
    """Owns one engine's thread and 80 ms clock; calls attach to it for a slot.

    Args:
        engine: a `DuplexEngine` (or anything with its `open_slot/close_slot/step/inject/force_ret`).
        max_calls: admission limit; defaults to `engine.max_slots`.
        frame_ms: the clock period.
        max_backlog_frames: caller frames a slot may queue before the oldest are dropped.
        max_catchup_ticks: overdue ticks run back to back before the rest are skipped.
    """

    def __init__(
        self,
        engine: StepEngine,
        *,
        max_calls: int | None = None,
        frame_ms: float = FRAME_MS,
        max_backlog_frames: int = 4,
        max_catchup_ticks: int = 3,
        name: str = "duetaspan-engine",
    ) -> None:
        self.engine = engine
        self.max_calls = int(max_calls if max_calls is not None else getattr(engine, "max_slots", 1))
        self.period = frame_ms / 1000.0
        self.max_backlog_frames = max_backlog_frames
        self.max_catchup_ticks = max_catchup_ticks
        self.name = name
        self.clock = ClockStats()
        self._calls: dict[int, CallSlot] = {}  # engine-thread owned
        self._reserved = 0
        self._admission = threading.Lock()
        self._commands: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future]] = (
            queue.SimpleQueue()
        )
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # lifecycle ----------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the engine thread (idempotent)."""
        if self.running:
            return
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

    async def __aenter__(self) -> EngineRunner:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # calls --------------------------------------------------------------------------------------
    @property
    def active_calls(self) -> int:
        return self._reserved

    @property
    def free_slots(self) -> int:
        return max(0, self.max_calls - self._reserved)

    async def attach(
        self,
        call_id: str,
        on_output: Callable[[TickOutput], None],
        *,
        persona: Any = None,
        sampling: Any = None,
        seed: int | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> CallSlot:
        """Open a slot for a call (its prompt prefill runs on the engine thread) and start feeding it.

        `on_output` is called on the CALLER's event loop once per tick with a `TickOutput`.
        Raises `EngineFull` at once when every slot is taken.
        """
        if not self.running:
            raise RunnerStopped(f"{self.name}: call start() (or `async with`) before attaching calls")
        with self._admission:
            if self._reserved >= self.max_calls:
                raise engine_full(self.name, self.max_calls)
            self._reserved += 1
        loop = asyncio.get_running_loop()

        def open_() -> CallSlot:
            slot = self.engine.open_slot(persona=persona, sampling=sampling, seed=seed)
            call = CallSlot(self, call_id, slot, on_output, loop, on_error, self.max_backlog_frames)
            self._calls[slot] = call
            return call

        try:
            return await asyncio.wrap_future(self._submit(open_))
        except BaseException:
            with self._admission:
                self._reserved -= 1
            raise

    async def detach(self, call: CallSlot) -> None:
        """Stop feeding a call and close its slot (idempotent; safe after `stop()`)."""
        if call.closed:
            return
        call.closed = True

        def close_() -> None:
            if self._calls.get(call.slot) is call:
                del self._calls[call.slot]
                self.engine.close_slot(call.slot)

        try:
            if self.running:
                await asyncio.wrap_future(self._submit(close_))
        finally:
            with self._admission:
                self._reserved -= 1

    def _submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
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
                if not self._calls:
                    t0 = None  # idle: the grid restarts with the next call
                    self._wake.wait(0.5)
                    continue
                now = time.perf_counter()
                if t0 is None:
                    t0, k = now, 0
                deadline = t0 + k * self.period
                if now < deadline:
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
                self._tick(lateness)
                k += 1
        finally:
            self._run_commands()
            for call in list(self._calls.values()):
                with contextlib.suppress(Exception):
                    self.engine.close_slot(call.slot)
            self._calls.clear()

    def _tick(self, lateness_s: float) -> None:
        c = self.clock
        c.ticks += 1
        c.last_lateness_ms = lateness_s * 1000.0
        c.max_lateness_ms = max(c.max_lateness_ms, c.last_lateness_ms)
        c.recent_lateness_ms.append(c.last_lateness_ms)
        if lateness_s > self.period / 2:
            c.late_ticks += 1
        calls = list(self._calls.values())
        taken = {call.slot: call._take() for call in calls}
        started = time.perf_counter()
        try:
            results = self.engine.step({slot: pcm for slot, (pcm, _, _) in taken.items()})
        except Exception as exc:
            log.exception("%s: engine step failed for slots %s", self.name, sorted(taken))
            c.timing.step_errors += 1
            for call in calls:
                call._fail(exc)
            return
        step_s = time.perf_counter() - started
        c.last_step_ms = step_s * 1000.0
        c.timing.observe(step_s, lateness_s, sum(concealed for _, concealed, _ in taken.values()))
        for call in calls:
            result = results.get(call.slot)
            if result is None:
                continue
            pcm, concealed, frame_no = taken[call.slot]
            call._deliver(TickOutput(result, pcm, frame_no, concealed, c.last_lateness_ms))
