"""The engine runner: one per engine, whatever hosts it. It owns admission (a call gets a slot or `EngineFull`
at once), the call handles (`CallSlot`: push caller frames, inject references, close) and the bookkeeping when
the engine goes down (every call ended with the reason, crashes counted for /metrics).

Where the engine runs and ticks is its `EngineHost` (`duetaspan.pipeline.host`): `ThreadHost` (an engine
thread with the absolute-deadline 80 ms clock, the default: `EngineRunner(engine)`) or `ProcessHost` (a child
process per GPU: `duetaspan.pipeline.engine_process.EngineProcess`). Each tick's `TickOutput` reaches the call
on its own event loop.

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
import contextlib
import itertools
import logging
import threading
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import numpy as np

from duetaspan.model.convention import FRAME_MS
from duetaspan.pipeline.host import EngineHost
from duetaspan.pipeline.thread_host import ThreadHost
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


class CallSlot:
    """One call's handle on its runner: push caller frames, inject references, close.

    `push`, `inject`, `force_ret` and `hold_agent` may be called from any thread. Created by
    `EngineRunner.attach`.
    """

    def __init__(
        self,
        runner: EngineRunner,
        key: int,
        call_id: str,
        on_output: Callable[[TickOutput], None],
        loop: asyncio.AbstractEventLoop,
        on_error: Callable[[BaseException], None] | None,
    ) -> None:
        self.call_id = call_id
        self.slot: int = -1  # the engine slot, known once the host has opened it
        self.stats = SlotStats()  # replaced by the host's live figures once the slot is open
        self.closed = False
        self._key = key
        self._runner = runner
        self._host = runner.host
        self._on_output = on_output
        self._on_error = on_error
        self._loop = loop
        self._opened = False

    async def close(self) -> None:
        """Detach from the runner and free the slot (idempotent)."""
        await self._runner.detach(self)

    def push(self, pcm: np.ndarray) -> None:
        """Queue one caller frame (float32[1920] at 24 kHz) for the engine's next free tick."""
        check_caller_frame(pcm)
        if not self.closed:
            self._host.push(self._key, pcm)

    @property
    def backlog(self) -> int:
        """Caller frames queued in this process (0 where the queue lives in an engine process)."""
        return self._host.backlog(self._key)

    def inject(self, reference: str, span_id: int | None = None) -> bool:
        """Queue a Context Span with this reference; it lands before the slot's next step, its `SpanLanded`
        carrying `span_id`."""
        if self.closed:
            log.warning("call %s: reference dropped, the call has ended", self.call_id)
            return False
        return bool(self._host.inject(self._key, reference, span_id))

    def force_ret(self) -> None:
        """Make the model sample `<ret>` on its next frame (tests, scripted demos)."""
        if not self.closed:
            self._host.force_ret(self._key)

    def hold_agent(self, on: bool = True) -> None:
        """From the engine's next tick, hold the model's own agent stream at silence while it listens (`on`:
        answer detection, `DuplexEngine.hold_agent`), or let it speak."""
        if not self.closed:
            self._host.hold_agent(self._key, on)

    # from the host (any thread) -----------------------------------------------------------------
    def _deliver(self, out: TickOutput) -> None:
        self._call_soon(self._on_output, out)

    def _fail(self, exc: BaseException) -> None:
        if self._on_error is not None:
            self._call_soon(self._on_error, exc)

    def _call_soon(self, fn: Callable[..., Any], arg: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, arg)
        except RuntimeError:  # the call's loop is closed: the call is gone, nothing to tell
            pass


CallHandle = CallSlot  # the name both runners' handles shared before there was one runner


class _Started:
    """What `EngineRunner.start()` returns for a host that starts at once: awaiting it is a no-op, and not
    awaiting it is fine too (the in-thread engine is running when `start()` returns)."""

    def __await__(self) -> Generator[Any, None, None]:
        yield from ()


class EngineRunner:
    """Admission, call handles and crash bookkeeping for one engine on its host; calls attach for a slot.

    Args:
        engine: a `DuplexEngine` (or anything with its `open_slot/close_slot/step/inject/force_ret`) to run
            on a `ThreadHost`; leave it out when passing `host`.
        host: where the engine runs (`ThreadHost`, `ProcessHost`, ...), instead of `engine`.
        max_calls: admission limit; defaults to the host's `max_slots`.
        frame_ms, max_backlog_frames, max_catchup_ticks: the `ThreadHost` clock settings (with `engine`).
        max_failed_steps: failed engine steps in a row after which a `ThreadHost` goes down (with `engine`).
    """

    def __init__(
        self,
        engine: StepEngine | None = None,
        *,
        host: EngineHost | None = None,
        max_calls: int | None = None,
        frame_ms: float = FRAME_MS,
        max_backlog_frames: int = 4,
        max_catchup_ticks: int = 3,
        max_failed_steps: int = 3,
        name: str = "duetaspan-engine",
    ) -> None:
        if (engine is None) == (host is None):
            raise TypeError("EngineRunner: pass either an engine (run in a thread here) or a host")
        if host is None:
            host = ThreadHost(
                engine,  # type: ignore[arg-type]
                frame_ms=frame_ms,
                max_backlog_frames=max_backlog_frames,
                max_catchup_ticks=max_catchup_ticks,
                max_failed_steps=max_failed_steps,
                name=name,
            )
        self.engine = engine
        self.host = host
        self.name = name
        self.max_calls = int(max_calls if max_calls is not None else host.max_slots)
        self.crashes = 0  # times the host went down on its own (not stopped): /metrics reports it
        # called (from any thread) when the host went down on its own, after its calls were ended
        self.on_crash: Callable[[BaseException], None] | None = None
        self._calls: dict[int, CallSlot] = {}
        self._reserved = 0
        self._keys = itertools.count(1)
        self._admission = threading.Lock()
        host.bind(self)

    # lifecycle ----------------------------------------------------------------------------------
    @property
    def clock(self) -> Any:
        """The host's clock figures (`ClockStats`, or the engine process's `RemoteClock`)."""
        return self.host.clock

    @property
    def running(self) -> bool:
        return bool(self.host.running)

    @property
    def error(self) -> BaseException | None:
        """Why the engine went down on its own (None while it runs, or after a plain stop)."""
        return self.host.error

    @property
    def engine_down(self) -> bool:
        """True while the engine is down after a failure (steps kept failing, its process died, a restart
        under way): `/health` is unhealthy and admission refuses every call until it is back."""
        return self.host.error is not None

    @property
    def engine_lost(self) -> bool:
        """True when the engine is down and will not come back by itself (an in-thread engine after a
        failure, an engine process out of restarts): only a restart of the server brings it back, so a
        liveness probe may fail on it."""
        return self.engine_down and not bool(getattr(self.host, "recovering", False))

    def start(self) -> Awaitable[None]:
        """Start the host (idempotent). An in-thread engine is running when this returns; a host that loads
        (an engine process) is running once the returned awaitable is done: `await runner.start()` covers both.
        """
        pending = self.host.start()
        return pending if pending is not None else _Started()

    async def stop(self, **kwargs: Any) -> None:
        """Stop the host: every slot closed, the clock stopped."""
        await self.host.stop(**kwargs)

    async def __aenter__(self) -> EngineRunner:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # calls --------------------------------------------------------------------------------------
    @property
    def active_calls(self) -> int:
        return self._reserved

    @property
    def free_slots(self) -> int:
        """Calls `attach` would admit now: 0 while the host is down after a crash (it refuses every call)."""
        return max(0, self.max_calls - self._reserved) if self.error is None else 0

    async def attach(
        self,
        call_id: str,
        on_output: Callable[[TickOutput], None],
        *,
        persona: Any = None,
        sampling: Any = None,
        seed: int | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        hold_agent: bool = False,
    ) -> CallSlot:
        """Open a slot for a call (its prompt prefill runs next to the engine) and start feeding it.

        `on_output` is called on the CALLER's event loop once per tick with a `TickOutput`. `hold_agent`: the
        slot opens with the agent held at silence from its first step (`CallSlot.hold_agent`).
        Raises `EngineFull` at once when every slot is taken, `RunnerStopped` (or the host's crash, e.g.
        `EngineCrashed`) when the engine is not running.
        """
        if not self.running:
            raise self.error or RunnerStopped(
                f"{self.name}: start() the runner (or use `async with`) before attaching calls"
            )
        key = next(self._keys)
        # registered before the slot opens: the host may report the call's first tick before open returns
        call = CallSlot(self, key, call_id, on_output, asyncio.get_running_loop(), on_error)
        with self._admission:
            if self._reserved >= self.max_calls:
                raise engine_full(self.name, self.max_calls)
            self._reserved += 1
            self._calls[key] = call
        try:
            held = {"hold_agent": True} if hold_agent else {}  # hosts without the switch never see it
            call.slot, call.stats = await self.host.open_slot(
                key, call_id, persona=persona, sampling=sampling, seed=seed, **held
            )
        except BaseException:
            self._release(key)
            raise
        call._opened = True
        return call

    async def detach(self, call: CallSlot) -> None:
        """Stop feeding a call and close its slot (idempotent; safe after a crash or `stop()`)."""
        if call.closed:
            return
        call.closed = True
        if call._key not in self._calls:
            return  # already released by the host going down
        try:
            if self.running:
                with contextlib.suppress(RunnerStopped):
                    await self.host.close_slot(call._key)
        finally:
            self._release(call._key)

    def _release(self, key: int) -> None:
        with self._admission:
            if self._calls.pop(key, None) is not None:
                self._reserved -= 1

    # host events (`HostEvents`) -----------------------------------------------------------------
    def tick(self, key: int, out: TickOutput) -> None:
        call = self._calls.get(key)
        if call is not None:
            call._deliver(out)

    def call_failed(self, key: int, exc: BaseException) -> None:
        call = self._calls.get(key)
        if call is not None:
            call._fail(exc)

    def host_down(self, exc: BaseException, *, crashed: bool) -> None:
        with self._admission:
            calls, self._calls = list(self._calls.values()), {}
            self._reserved = 0
        opened = [call for call in calls if call._opened]  # a pending attach gets `exc` from open_slot
        if crashed:
            self.crashes += 1
            if opened:
                log.error("%s; ending %d call(s): %s", exc, len(opened), sorted(c.call_id for c in opened))
            else:
                log.error("%s", exc)
        for call in opened:
            call.closed = True
            call._fail(exc)
        if crashed and self.on_crash is not None:
            self.on_crash(exc)
