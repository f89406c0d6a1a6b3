"""The child side of an engine process: loads the engine from the parent's `EngineProcessSpec`, runs it on
an `EngineRunner` (in-thread host: its own thread and absolute-deadline 80 ms clock) and relays the parent's
calls over the socket (see `duetaspan.pipeline.process_wire` for the messages).

Started by `ProcessHost` as `python -m duetaspan.pipeline.engine_process --fd N`, never by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import time
from typing import Any

import numpy as np

from duetaspan.errors import DuetaspanError
from duetaspan.pipeline.process_wire import CLOCK_EVERY_S, EngineProcessSpec, frame, portable, recv
from duetaspan.pipeline.runner import CallSlot, EngineRunner
from duetaspan.pipeline.ticks import SlotStats, TickOutput

log = logging.getLogger(__name__)

FATAL_CLOSE_AFTER_S = 600.0  # after saying "fatal", how long to wait for the server to close its side


class ChildServer:
    """The engine process: one `EngineRunner` and the calls relayed to it, by the parent's call keys."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.runner: EngineRunner | None = None
        self.calls: dict[int, CallSlot] = {}
        self.said_fatal = False  # the engine went down and the server was told: nothing more is sent

    def send(self, message: tuple) -> None:
        if not self.said_fatal and not self.writer.is_closing():
            self.writer.write(frame(message))

    async def serve(self) -> None:
        kind, raw = await recv(self.reader)
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
        runner = self.runner = EngineRunner(
            engine,
            max_calls=spec.max_slots,
            frame_ms=spec.frame_ms,
            max_backlog_frames=spec.max_backlog_frames,
            max_catchup_ticks=spec.max_catchup_ticks,
            max_failed_steps=spec.max_failed_steps,
            name=f"engine-{os.getpid()}",
        )

        # the engine went down (steps kept failing, a fatal device error): tell the server why and exit, so
        # it ends the calls and starts a fresh process
        def on_crash(exc: BaseException) -> None:  # from the engine thread
            loop.call_soon_threadsafe(self._engine_down, exc)

        runner.on_crash = on_crash
        runner.start()
        self.send((
            "ready",
            {"pid": os.getpid(), "device": str(getattr(engine, "device", spec.device)),
             "max_slots": getattr(engine, "max_slots", spec.max_slots), "graphs": graphs,
             "load_s": round(time.perf_counter() - t0, 3)},
        ))  # fmt: skip
        clock = loop.create_task(self._clock(runner))
        try:
            while True:
                try:
                    msg = await recv(self.reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the server went away: so do we
                if msg[0] == "stop":
                    return
                self._dispatch(msg)
        finally:
            clock.cancel()
            await runner.stop()

    def _engine_down(self, exc: BaseException) -> None:
        self.send(("fatal", str(exc)))
        self.said_fatal = True
        # Half-close: the server reads every message up to "fatal", sees the end, closes its side, and our
        # reader then ends `serve`. Closing the socket here instead would make the next caller frame the server
        # pushes fail with EPIPE, and its transport would then drop what it had not read yet, "fatal" among it
        # (the crash was then reported as "exited with code 0"). Closed anyway if the server never closes.
        with contextlib.suppress(Exception):
            self.writer.write_eof()
        asyncio.get_running_loop().call_later(FATAL_CLOSE_AFTER_S, self.writer.close)

    def _dispatch(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "push":
            call = self.calls.get(msg[1])
            if call is not None and not call.closed:
                call.push(np.frombuffer(msg[2], dtype=np.float32))
        elif kind == "inject":
            call = self.calls.get(msg[1])
            if call is not None:
                call.inject(msg[2], msg[3])
        elif kind == "force_ret":
            call = self.calls.get(msg[1])
            if call is not None:
                call.force_ret()
        elif kind == "hold":
            call = self.calls.get(msg[1])
            if call is not None:
                call.hold_agent(msg[2])
        elif kind == "req":
            asyncio.get_running_loop().create_task(self._answer(msg[1], msg[2]))

    async def _answer(self, rid: int, request: tuple) -> None:
        try:
            value = await self._handle(request)
        except Exception as exc:
            self.send(("reply", rid, False, portable(exc)))
        else:
            self.send(("reply", rid, True, value))

    async def _handle(self, request: tuple) -> Any:
        assert self.runner is not None
        kind = request[0]
        if kind == "attach":
            _, key, call_id, persona, sampling, seed, hold = request

            def on_output(out: TickOutput, key: int = key) -> None:
                call = self.calls.get(key)
                self.send(("tick", key, out, call.stats if call is not None else SlotStats()))

            def on_error(exc: BaseException, key: int = key) -> None:
                if not getattr(exc, "ends_call", False):  # the engine's end reaches the server as "fatal"
                    self.send(("call_error", key, portable(exc)))

            call = await self.runner.attach(
                call_id, on_output, persona=persona, sampling=sampling, seed=seed, on_error=on_error,
                hold_agent=hold,
            )  # fmt: skip
            self.calls[key] = call
            return int(call.slot)
        if kind == "detach":
            call = self.calls.pop(request[1], None)
            if call is not None:
                await call.close()
            return None
        raise DuetaspanError(f"engine process: unknown request {kind!r}")

    async def _clock(self, runner: EngineRunner) -> None:
        while True:
            await asyncio.sleep(CLOCK_EVERY_S)
            figures = runner.clock.summary()
            figures["last_step_ms"] = round(runner.clock.last_step_ms, 3)
            self.send(("clock", figures, runner.clock.timing.snapshot()))


async def _child_main(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    try:
        await ChildServer(reader, writer).serve()
    finally:
        with contextlib.suppress(Exception):
            await writer.drain()
        writer.close()


def main(argv: list[str] | None = None) -> None:
    """Entry point of the engine process (started by `ProcessHost`, not by hand)."""
    parser = argparse.ArgumentParser(description="duetaspan engine process (started by EngineProcess)")
    parser.add_argument("--fd", type=int, required=True, help="the inherited socket's file descriptor")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("DUETASPAN_ENGINE_LOG", "WARNING"))
    # The server decides when the engine stops: a Ctrl-C, or the SIGTERM that systemd and Kubernetes send the
    # whole process group, is meant for it (it drains its calls first) and must not kill the calls under it.
    # The engine ends when the server says `stop` or goes away (its socket closes: `serve` returns).
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)
    asyncio.run(_child_main(args.fd))
