"""The engine in its own process: one per GPU, reached over a local socket, with the `EngineRunner` interface.

`EngineProcess` starts `python -m duetaspan.pipeline.engine_process` with one end of a Unix socket pair. The
child loads the engine from an `EngineProcessSpec`, runs the usual `EngineRunner` (its own thread and
absolute-deadline 80 ms clock) and relays calls over the socket: `attach`/`detach`/`inject` requests in,
each call's `TickOutput`s and the clock figures out. The web server's event loop and the GPU loop thus never
share a process, let alone a thread, and a crashed engine (CUDA error, OOM kill) cannot take the server down:
the parent notices the closed socket, ends every call attached to that engine with `EngineCrashed` (the
pipeline service cancels those calls) and refuses new ones with it.

Frames are length-prefixed pickles: both ends are this package on one machine, and 80 ms of audio is 7.5 KB.

Example:
    >>> async def main():                                         # doctest: +SKIP
    ...     spec = EngineProcessSpec(model="duetaspan-7b", device="cuda:0", max_slots=16)
    ...     async with EngineProcess(spec) as runner:               # returns once the model is loaded
    ...         call = await runner.attach("CA1", on_output=print)  # raises EngineFull when all slots are busy
    ...         call.push(np.zeros(1920, np.float32))
    ...         await asyncio.sleep(1.0)
    ...         await call.close()
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import os
import pickle
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from duetaspan.errors import DuetaspanError
from duetaspan.model.convention import FRAME_MS
from duetaspan.observability.timing import empty_snapshot
from duetaspan.pipeline.runner import (
    CallHandle,
    RunnerStopped,
    SlotStats,
    TickOutput,
    check_caller_frame,
    engine_full,
)

log = logging.getLogger(__name__)

_HEADER = struct.Struct("!I")
_CLOCK_EVERY_S = 0.5

__all__ = ["EngineCrashed", "EngineProcess", "EngineProcessSpec", "RemoteCallSlot", "RemoteClock"]


class EngineCrashed(RunnerStopped):
    """The engine process died (or never came up); its calls are over. `ends_call` tells services to hang up."""

    ends_call = True


class EngineProcessSpec(BaseModel):
    """What the engine process loads and how its clock runs (sent to the child as its first message).

    `checkpoint` (+ `mimi`, `tokenizer`, optional `lm_config`) loads explicit files; otherwise `model` is a
    preset. `capture_graphs` captures every batch bucket's CUDA graph before the first call arrives.
    """

    model_config = ConfigDict(extra="forbid")

    model: str = "tiny-random"
    device: str = "cpu"
    dtype: str | None = None
    max_slots: int = Field(4, ge=1)
    seed: int = 0
    random_weights: bool = False
    model_dir: str | None = None
    checkpoint: str | None = None
    lm_config: str | None = None
    mimi: str | None = None
    tokenizer: str | None = None
    threads: int | None = Field(None, ge=1, description="torch CPU threads in the engine process")
    capture_graphs: bool = True
    frame_ms: float = Field(FRAME_MS, gt=0)
    max_backlog_frames: int = Field(4, ge=1)
    max_catchup_ticks: int = Field(3, ge=0)
    engine_options: dict[str, Any] = Field(default_factory=dict)

    def build(self) -> Any:
        """Load the engine (in the engine process)."""
        import torch

        from duetaspan.model.engine import DuplexEngine

        if self.threads:
            torch.set_num_threads(self.threads)
        kw: dict[str, Any] = {"device": self.device, "max_slots": self.max_slots, "seed": self.seed}
        if self.dtype:
            kw["dtype"] = getattr(torch, self.dtype)
        kw.update(self.engine_options)
        if self.checkpoint:
            return DuplexEngine.from_files(self.checkpoint, self.lm_config, self.mimi, self.tokenizer, **kw)
        return DuplexEngine.load(
            self.model, model_dir=self.model_dir, random_weights=self.random_weights, **kw
        )


# -- framing ------------------------------------------------------------------------------------------------
def _frame(message: tuple) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


async def _recv(reader: asyncio.StreamReader) -> tuple:
    (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    return pickle.loads(await reader.readexactly(size))


def _portable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return DuetaspanError(f"{type(exc).__name__}: {exc}")


# -- parent side ----------------------------------------------------------------------------------------------
@dataclass
class RemoteClock:
    """The engine process's clock figures (`ClockStats.summary()`), refreshed every half second."""

    figures: dict[str, float] = field(default_factory=dict)
    last_step_ms: float = 0.0
    timing: dict[str, Any] = field(default_factory=empty_snapshot)  # the child's `TickTiming.snapshot()`

    def summary(self) -> dict[str, float]:
        return dict(self.figures)


class RemoteCallSlot(CallHandle):
    """One call's handle on an engine process (the `CallSlot` interface): push frames, inject, close.

    `push`, `inject` and `force_ret` may be called from any thread. `inject` returns True once the reference
    is on its way (an empty one, or one for an ended call, is refused at once); the engine still drops it if
    the call ends before the next tick.
    """

    def __init__(
        self,
        runner: EngineProcess,
        key: int,
        call_id: str,
        slot: int,
        on_output: Callable[[TickOutput], None],
        loop: asyncio.AbstractEventLoop,
        on_error: Callable[[BaseException], None] | None,
    ) -> None:
        super().__init__(runner, call_id, slot, on_output, loop, on_error)
        self._key = key

    def push(self, pcm: np.ndarray) -> None:
        """Queue one caller frame (float32[1920] at 24 kHz) for the engine's next free tick."""
        check_caller_frame(pcm)
        if self.closed:
            return
        self.stats.frames_in += 1
        self._runner._send(("push", self._key, np.asarray(pcm, dtype=np.float32).tobytes()))

    @property
    def backlog(self) -> int:
        """Always 0 here: the frame queue lives in the engine process (see `stats.max_backlog`)."""
        return 0

    def inject(self, reference: str) -> bool:
        """Send a Context Span's reference to the engine; it lands before the slot's next step."""
        if self.closed or not reference.strip():
            return False
        self._runner._send(("inject", self._key, reference))
        return True

    def force_ret(self) -> None:
        """Make the model sample `<ret>` on its next frame (tests, scripted demos)."""
        if not self.closed:
            self._runner._send(("force_ret", self._key))

    def _deliver(self, out: TickOutput, stats: SlotStats) -> None:
        frames_in = self.stats.frames_in
        self.stats = stats
        self.stats.frames_in = max(frames_in, stats.frames_in)
        self._call_soon(self._on_output, out)


class EngineProcess:
    """An engine in a child process, with the `EngineRunner` interface (`attach`, `detach`, `clock`, ...).

    Args:
        spec: what the child loads (preset or files, device, slots) and its clock settings.
        max_calls: admission limit (default `spec.max_slots`); a full engine raises `EngineFull` at once.
        start_timeout_s: how long model loading (and graph capture) may take.
        env: extra environment for the child (e.g. `{"CUDA_VISIBLE_DEVICES": "1"}` for an engine per GPU).
    """

    def __init__(
        self,
        spec: EngineProcessSpec | None = None,
        *,
        max_calls: int | None = None,
        start_timeout_s: float = 900.0,
        env: dict[str, str] | None = None,
        name: str = "duetaspan-engine-process",
    ) -> None:
        self.spec = spec or EngineProcessSpec()
        self.max_calls = int(max_calls if max_calls is not None else self.spec.max_slots)
        self.start_timeout_s = start_timeout_s
        self.name = name
        self.clock = RemoteClock()
        self.info: dict[str, Any] = {}
        self.error: EngineCrashed | None = None
        self.crashes = 0  # times the engine process died on its own (not stopped): /metrics reports it
        self._env = env
        self._proc: asyncio.subprocess.Process | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._calls: dict[int, RemoteCallSlot] = {}
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self._reserved = 0
        self._stopping = False
        self._ready: asyncio.Future | None = None

    # lifecycle ----------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None and self.error is None

    @property
    def active_calls(self) -> int:
        return self._reserved

    @property
    def free_slots(self) -> int:
        return max(0, self.max_calls - self._reserved) if self.running else 0

    async def start(self) -> None:
        """Start the engine process and wait until its model is loaded (idempotent)."""
        if self.running:
            return
        self._loop = asyncio.get_running_loop()
        self.error, self._stopping = None, False
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
        log.info("%s: engine process %d ready: %s", self.name, self.pid, self.info)

    async def stop(self, timeout_s: float = 10.0) -> None:
        """End every call and stop the engine process (politely, then by signal)."""
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

    async def __aenter__(self) -> EngineProcess:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

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
        self._fail_all(EngineCrashed(f"{self.name}: the engine process was stopped"))

    # calls --------------------------------------------------------------------------------------
    async def attach(
        self,
        call_id: str,
        on_output: Callable[[TickOutput], None],
        *,
        persona: Any = None,
        sampling: Any = None,
        seed: int | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> RemoteCallSlot:
        """Open a slot for a call in the engine process; `on_output` runs on the caller's loop each tick.

        Raises `EngineFull` at once when every slot is taken, `EngineCrashed` when the engine is gone.
        """
        if not self.running:
            raise self.error or RunnerStopped(
                f"{self.name}: start() the engine process before attaching calls"
            )
        if self._reserved >= self.max_calls:
            raise engine_full(self.name, self.max_calls)
        self._reserved += 1
        key = next(self._ids)
        try:
            slot = await self._request(("attach", key, call_id, persona, sampling, seed))
        except BaseException:
            self._reserved -= 1
            raise
        call = RemoteCallSlot(self, key, call_id, slot, on_output, asyncio.get_running_loop(), on_error)
        self._calls[key] = call
        return call

    async def detach(self, call: RemoteCallSlot) -> None:
        """Stop feeding a call and free its slot (idempotent; safe after a crash or `stop()`)."""
        if call.closed:
            return
        call.closed = True
        if self._calls.pop(call._key, None) is None:
            return  # already released by a crash
        self._reserved -= 1
        if self.running:
            with contextlib.suppress(RunnerStopped):
                await self._request(("detach", call._key))

    # channel ------------------------------------------------------------------------------------
    def _send(self, message: tuple) -> None:
        writer, loop = self._writer, self._loop
        if writer is None or loop is None or writer.is_closing():
            return
        data = _frame(message)
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
                msg = await _recv(reader)
                kind = msg[0]
                if kind == "tick":
                    call = self._calls.get(msg[1])
                    if call is not None:
                        call._deliver(msg[2], msg[3])
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
                    call = self._calls.get(msg[1])
                    if call is not None:
                        call._fail(msg[2])
                elif kind == "ready":
                    if self._ready is not None and not self._ready.done():
                        self._ready.set_result(msg[1])
                elif kind == "fatal":
                    self.error = EngineCrashed(f"{self.name}: {msg[1]}")
        except (asyncio.IncompleteReadError, ConnectionError, OSError, pickle.UnpicklingError, EOFError):
            pass
        await self._died()

    async def _died(self) -> None:
        proc = self._proc
        code: int | None = None
        if proc is not None:
            with contextlib.suppress(TimeoutError):
                code = await asyncio.wait_for(proc.wait(), 5.0)
        if self._stopping and self.error is None:
            self._fail_all(EngineCrashed(f"{self.name}: the engine process was stopped"))
            return
        self.crashes += 1
        how = _exit_text(code)
        reason = self.error or EngineCrashed(f"{self.name}: the engine process (pid {self.pid}) {how}")
        self.error = reason
        if self._calls:
            log.error(
                "%s; ending %d call(s): %s",
                reason,
                len(self._calls),
                sorted(c.call_id for c in self._calls.values()),
            )
        else:
            log.error("%s", reason)
        self._fail_all(reason)

    def _fail_all(self, exc: EngineCrashed) -> None:
        if self.error is None and not self._stopping:
            self.error = exc
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(self.error or exc)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(self.error or exc)
        calls, self._calls = list(self._calls.values()), {}
        self._reserved = 0
        for call in calls:
            call.closed = True
            call._fail(self.error or exc)


def _exit_text(code: int | None) -> str:
    if code is None:
        return "closed its channel"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


# -- child side -----------------------------------------------------------------------------------------------
class _Child:
    """The engine process: one `EngineRunner` and the calls relayed to it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.runner: Any = None
        self.calls: dict[int, Any] = {}

    def send(self, message: tuple) -> None:
        if not self.writer.is_closing():
            self.writer.write(_frame(message))

    async def serve(self) -> None:
        from duetaspan.pipeline.runner import EngineRunner

        kind, raw = await _recv(self.reader)
        if kind != "spec":
            raise DuetaspanError(f"engine process: expected the spec first, got {kind!r}")
        spec = EngineProcessSpec.model_validate(raw)
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        try:
            engine = await loop.run_in_executor(None, spec.build)
            graphs = 0
            batch = getattr(engine, "batch", None)
            if spec.capture_graphs and batch is not None:
                graphs = await loop.run_in_executor(None, batch.capture)
        except Exception as exc:
            log.exception("engine process: loading failed")
            self.send(("fatal", f"loading the engine failed: {type(exc).__name__}: {exc}"))
            await self.writer.drain()
            return
        self.runner = EngineRunner(
            engine,
            max_calls=spec.max_slots,
            frame_ms=spec.frame_ms,
            max_backlog_frames=spec.max_backlog_frames,
            max_catchup_ticks=spec.max_catchup_ticks,
            name=f"engine-{os.getpid()}",
        )
        self.runner.start()
        self.send((
            "ready",
            {"pid": os.getpid(), "device": str(getattr(engine, "device", spec.device)),
             "max_slots": getattr(engine, "max_slots", spec.max_slots), "graphs": graphs,
             "load_s": round(time.perf_counter() - t0, 3)},
        ))  # fmt: skip
        clock = loop.create_task(self._clock())
        try:
            while True:
                try:
                    msg = await _recv(self.reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the server went away: so do we
                if msg[0] == "stop":
                    return
                self._dispatch(msg)
        finally:
            clock.cancel()
            await self.runner.stop()

    def _dispatch(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "push":
            call = self.calls.get(msg[1])
            if call is not None and not call.closed:
                call.push(np.frombuffer(msg[2], dtype=np.float32))
        elif kind == "inject":
            call = self.calls.get(msg[1])
            if call is not None:
                call.inject(msg[2])
        elif kind == "force_ret":
            call = self.calls.get(msg[1])
            if call is not None:
                call.force_ret()
        elif kind == "req":
            asyncio.get_running_loop().create_task(self._answer(msg[1], msg[2]))

    async def _answer(self, rid: int, request: tuple) -> None:
        try:
            value = await self._handle(request)
        except Exception as exc:
            self.send(("reply", rid, False, _portable(exc)))
        else:
            self.send(("reply", rid, True, value))

    async def _handle(self, request: tuple) -> Any:
        kind = request[0]
        if kind == "attach":
            _, key, call_id, persona, sampling, seed = request

            def on_output(out: TickOutput, key: int = key) -> None:
                call = self.calls.get(key)
                self.send(("tick", key, out, call.stats if call is not None else SlotStats()))

            def on_error(exc: BaseException, key: int = key) -> None:
                self.send(("call_error", key, _portable(exc)))

            call = await self.runner.attach(
                call_id, on_output, persona=persona, sampling=sampling, seed=seed, on_error=on_error
            )
            self.calls[key] = call
            return int(call.slot)
        if kind == "detach":
            call = self.calls.pop(request[1], None)
            if call is not None:
                await call.close()
            return None
        raise DuetaspanError(f"engine process: unknown request {kind!r}")

    async def _clock(self) -> None:
        while True:
            await asyncio.sleep(_CLOCK_EVERY_S)
            figures = self.runner.clock.summary()
            figures["last_step_ms"] = round(self.runner.clock.last_step_ms, 3)
            self.send(("clock", figures, self.runner.clock.timing.snapshot()))


async def _child_main(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    try:
        await _Child(reader, writer).serve()
    finally:
        with contextlib.suppress(Exception):
            await writer.drain()
        writer.close()


def main(argv: list[str] | None = None) -> None:
    """Entry point of the engine process (started by `EngineProcess`, not by hand)."""
    parser = argparse.ArgumentParser(description="duetaspan engine process (started by EngineProcess)")
    parser.add_argument("--fd", type=int, required=True, help="the inherited socket's file descriptor")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("DUETASPAN_ENGINE_LOG", "WARNING"))
    # The server decides when the engine stops; a Ctrl-C meant for it must not kill the calls first.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(_child_main(args.fd))


if __name__ == "__main__":
    main()
