"""The engine-process host: the engine in a child process (one per GPU), reached over a Unix socket pair.

`ProcessHost` starts `python -m duetaspan.pipeline.engine_process` with one end of the socket, sends it an
`EngineProcessSpec`, and relays the runner's slot requests, caller frames and references in, and each call's
`TickOutput`s and the child's clock figures out. The web server's event loop and the GPU loop thus never share
a process, and a crashed engine (CUDA error, OOM kill) cannot take the server down: the host notices the
closed socket and reports `host_down(EngineCrashed(...), crashed=True)`, so the runner ends every call with
it (the pipeline service hangs up) and refuses new ones. An engine whose steps keep failing (or fail with a
fatal device error) in the child says so (`("fatal", why)`), half-closes the socket and exits once the host
has read it and closed its side, which is the same crash. After a crash of a process that had come up, the
host starts a fresh one (`max_restarts`, `restart_delay_s`): the calls it had are not resumed, new calls are
admitted once it is loaded. Use it through `EngineProcess`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import pickle
import signal
import socket
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from duetaspan.observability.timing import empty_snapshot
from duetaspan.pipeline.host import HostEvents
from duetaspan.pipeline.process_wire import EngineCrashed, EngineProcessSpec, frame, recv
from duetaspan.pipeline.ticks import SlotStats

log = logging.getLogger(__name__)


@dataclass
class RemoteClock:
    """The engine process's clock figures (`ClockStats.summary()`), refreshed every half second."""

    figures: dict[str, float] = field(default_factory=dict)
    last_step_ms: float = 0.0
    timing: dict[str, Any] = field(default_factory=empty_snapshot)  # the child's `TickTiming.snapshot()`

    def summary(self) -> dict[str, float]:
        return dict(self.figures)


class ProcessHost:
    """An engine in a child process (the `EngineHost` for one GPU).

    Args:
        spec: what the child loads (preset or files, device, slots) and its clock settings.
        start_timeout_s: how long model loading (and graph capture) may take.
        env: extra environment for the child (e.g. `{"CUDA_VISIBLE_DEVICES": "1"}` for an engine per GPU).
        max_restarts: fresh engine processes started after crashes, over the host's life (0: stay down).
        restart_delay_s: the wait before a restart (a crash loop cannot spin).
    """

    def __init__(
        self,
        spec: EngineProcessSpec | None = None,
        *,
        start_timeout_s: float = 900.0,
        env: dict[str, str] | None = None,
        name: str = "duetaspan-engine-process",
        max_restarts: int = 3,
        restart_delay_s: float = 1.0,
    ) -> None:
        self.spec = spec or EngineProcessSpec()
        self.start_timeout_s = start_timeout_s
        self.max_restarts = max_restarts
        self.restart_delay_s = restart_delay_s
        self.restarts = 0  # engine processes started after a crash
        self.name = name
        self.clock = RemoteClock()
        self.info: dict[str, Any] = {}
        self.error: EngineCrashed | None = None
        self._env = env
        self._events: HostEvents | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stats: dict[int, SlotStats] = {}  # open calls' figures, as the child last reported them
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self._stopping = False
        self._ready: asyncio.Future | None = None
        self._fatal: EngineCrashed | None = None  # what this process said before it went away
        self._restart_task: asyncio.Task | None = None

    @property
    def max_slots(self) -> int:
        return self.spec.max_slots

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None and self.error is None

    @property
    def recovering(self) -> bool:
        """True while a fresh engine process is on its way after a crash (the host is down until it loads)."""
        return self._restart_task is not None and not self._restart_task.done()

    def bind(self, events: HostEvents) -> None:
        self._events = events

    # lifecycle ----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the engine process and wait until its model is loaded (idempotent)."""
        if self.running:
            return
        self._loop = asyncio.get_running_loop()
        self._stopping, self._fatal = False, None  # `error` (a crash's) stays until this one is ready
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = {**os.environ, **(self._env or {})}
        try:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "duetaspan.pipeline.engine_process", "--fd", str(child.fileno()),
                pass_fds=(child.fileno(),), env=env,
            )  # fmt: skip
        finally:
            child.close()
        reader, self._writer = await asyncio.open_unix_connection(sock=parent)
        self._ready = self._loop.create_future()
        self._reader_task = self._loop.create_task(self._read(reader), name=f"{self.name}-reader")
        self._send(("spec", self.spec.model_dump(mode="json")))
        try:
            self.info = await asyncio.wait_for(asyncio.shield(self._ready), self.start_timeout_s)
        except BaseException:
            await self._terminate()
            raise
        self.error = None  # running (again): calls are admitted
        log.info("%s: engine process %d ready: %s", self.name, self.pid, self.info)

    async def stop(self, timeout_s: float = 10.0) -> None:
        """End every call and stop the engine process (politely, then by signal)."""
        if self._restart_task is not None and self._restart_task is not asyncio.current_task():
            self._restart_task.cancel()
            await asyncio.gather(self._restart_task, return_exceptions=True)
        if self._proc is None:
            return
        self._stopping = True
        if self._proc.returncode is None and self._writer is not None:
            with contextlib.suppress(Exception):
                self._send(("stop",))
                await self._writer.drain()
        try:
            await asyncio.wait_for(self._proc.wait(), timeout_s)
        except TimeoutError:
            log.warning(
                "%s: engine process %d did not stop in %.0f s; killing it", self.name, self.pid, timeout_s
            )
        await self._terminate()

    async def _terminate(self) -> None:
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader_task
        self._down(
            EngineCrashed(f"{self.name}: the engine process was stopped", crashed=False), crashed=False
        )

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
        stats = self._stats[key] = SlotStats()  # before the request: a tick may come before the reply
        try:
            slot = await self._request(("attach", key, call_id, persona, sampling, seed, hold_agent))
        except BaseException:
            self._stats.pop(key, None)
            raise
        return slot, stats

    async def close_slot(self, key: int) -> None:
        if self._stats.pop(key, None) is not None:
            await self._request(("detach", key))

    def push(self, key: int, pcm: np.ndarray) -> None:
        stats = self._stats.get(key)
        if stats is not None:
            stats.frames_in += 1
            self._send(("push", key, np.asarray(pcm, dtype=np.float32).tobytes()))

    def backlog(self, key: int) -> int:
        """Always 0 here: the frame queue lives in the engine process (see the call's `stats.max_backlog`)."""
        return 0

    def inject(self, key: int, reference: str, span_id: int | None = None) -> bool:
        """True once the reference is on its way (the engine still drops it if the call ends first)."""
        if key not in self._stats or not reference.strip():
            return False
        self._send(("inject", key, reference, span_id))
        return True

    def force_ret(self, key: int) -> None:
        if key in self._stats:
            self._send(("force_ret", key))

    def hold_agent(self, key: int, on: bool) -> None:
        if key in self._stats:
            self._send(("hold", key, bool(on)))

    # channel ------------------------------------------------------------------------------------
    def _send(self, message: tuple) -> None:
        writer, loop = self._writer, self._loop
        if writer is None or loop is None or writer.is_closing():
            return
        data = frame(message)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            writer.write(data)
        else:
            loop.call_soon_threadsafe(writer.write, data)

    async def _request(self, message: tuple) -> Any:
        assert self._loop is not None
        rid = next(self._ids)
        fut = self._loop.create_future()
        self._pending[rid] = fut
        self._send(("req", rid, message))
        try:
            return await fut
        finally:
            self._pending.pop(rid, None)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                msg = await recv(reader)
                kind = msg[0]
                if kind == "tick":
                    self._tick(msg[1], msg[2], msg[3])
                elif kind == "reply":
                    fut = self._pending.get(msg[1])
                    if fut is not None and not fut.done():
                        fut.set_result(msg[3]) if msg[2] else fut.set_exception(msg[3])
                elif kind == "clock":
                    self.clock.figures = msg[1]
                    self.clock.last_step_ms = float(msg[1].get("last_step_ms", 0.0))
                    if len(msg) > 2:
                        self.clock.timing = msg[2]
                elif kind == "call_error":
                    if msg[1] in self._stats and self._events is not None:
                        self._events.call_failed(msg[1], msg[2])
                elif kind == "ready":
                    if self._ready is not None and not self._ready.done():
                        self._ready.set_result(msg[1])
                elif kind == "fatal":
                    self._fatal = EngineCrashed(f"{self.name}: {msg[1]}")
        except (asyncio.IncompleteReadError, ConnectionError, OSError, pickle.UnpicklingError, EOFError):
            pass
        await self._died()

    def _tick(self, key: int, out: Any, remote: SlotStats) -> None:
        stats = self._stats.get(key)
        if stats is None or self._events is None:
            return
        frames_in = stats.frames_in  # counted here as sent; the child counts them as they arrive
        for f in dataclasses.fields(SlotStats):
            setattr(stats, f.name, getattr(remote, f.name))
        stats.frames_in = max(frames_in, remote.frames_in)
        self._events.tick(key, out)

    async def _died(self) -> None:
        proc = self._proc
        code: int | None = None
        if self._writer is not None:
            self._writer.close()  # a child that said "fatal" waits for this before it exits
        if proc is not None:
            with contextlib.suppress(TimeoutError):
                code = await asyncio.wait_for(proc.wait(), 5.0)
        if self._stopping and self._fatal is None:
            self._down(
                EngineCrashed(f"{self.name}: the engine process was stopped", crashed=False), crashed=False
            )
            return
        reason = self._fatal or EngineCrashed(
            f"{self.name}: the engine process (pid {self.pid}) {_exit_text(code)}"
        )
        self.error = reason
        ready = self._ready
        came_up = ready is not None and ready.done() and not ready.cancelled() and ready.exception() is None
        self._down(reason, crashed=True)
        if came_up and not self._stopping and self._loop is not None:
            if self.restarts < self.max_restarts:
                self._restart_task = self._loop.create_task(self._restart(), name=f"{self.name}-restart")
            else:
                log.error(
                    "%s: not restarting the engine process (%d restarts already)", self.name, self.restarts
                )

    async def _restart(self) -> None:
        """A fresh engine process after a crash; until it is loaded, calls are refused with the crash."""
        await asyncio.sleep(self.restart_delay_s)
        self.restarts += 1
        log.warning("%s: starting a fresh engine process (restart %d of %d)", self.name, self.restarts,
                    self.max_restarts)  # fmt: skip
        try:
            await self.start()
        except Exception as exc:
            log.error("%s: the restarted engine process did not come up: %s", self.name, exc)

    def _down(self, exc: EngineCrashed, *, crashed: bool) -> None:
        if self.error is None and not self._stopping:
            self.error = exc
        reason = self.error or exc
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(reason)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(reason)
        self._stats.clear()
        if self._events is not None:
            self._events.host_down(reason, crashed=crashed)


def _exit_text(code: int | None) -> str:
    if code is None:
        return "closed its channel"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"
