"""An engine whose steps raise ends its calls (issue 23 point 2), in both hosts.

`ThreadHost` (the scripted engine, deterministic): one failed step is reported to the call and the clock goes
on; `max_failed_steps` in a row, or one error the engine marks fatal (a sticky CUDA error), take the host
down: every call ends with `EngineFailed`, new ones are refused with it, the crash is counted once. The
Pipecat service then pushes a fatal `ErrorFrame`, ends the pipeline and records `ended_by: "engine_error"`.

`EngineProcess` (a real child on tiny-random, its steps made to fail with the test-only
`DUETASPAN_TEST_ENGINE_FAULT`): the child reports the engine's end and exits, the call ends, admission
refuses while the host is down, and a fresh child process is started that takes new calls.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from pipecat.frames.frames import ErrorFrame, InputAudioRawFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.workers.runner import WorkerRunner

from duetaspan.model.faults import TEST_FAULT_ENV, EngineFault, TestFault, is_fatal
from duetaspan.pipeline.artifacts import CallRecorder
from duetaspan.pipeline.engine_process import EngineCrashed, EngineProcess, EngineProcessSpec
from duetaspan.pipeline.process_wire import HEADER, frame
from duetaspan.pipeline.runner import EngineRunner, TickOutput
from duetaspan.pipeline.service import DuetaSpanService
from duetaspan.pipeline.ticks import EngineFailed
from tests.pipeline.harness import Collector, UpstreamCollector
from tests.pipeline.scripted_engine import ScriptedEngine

CUDA_ERROR = "CUDA error: an illegal memory access was encountered"


async def _until(predicate, limit_s: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + limit_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("timed out waiting")
        await asyncio.sleep(0.02)


async def test_failed_steps_in_a_row_take_the_thread_host_down():
    engine = ScriptedEngine(fail_from=6)  # a device that breaks for good at step 6
    errors: list[BaseException] = []
    async with EngineRunner(engine, max_failed_steps=3) as runner:
        call = await runner.attach("CA1", lambda out: None, on_error=errors.append)
        await _until(lambda: any(getattr(e, "ends_call", False) for e in errors))
        assert [type(e) for e in errors] == [RuntimeError, RuntimeError, EngineFailed]
        down = errors[-1]
        assert down.crashed and "3 engine steps in a row failed" in str(down)
        assert "scripted step failure" in str(down)
        assert runner.engine_down and not runner.running and runner.free_slots == 0
        assert runner.engine_lost  # an in-thread engine does not come back by itself
        assert call.closed and runner.active_calls == 0 and runner.crashes == 1
        with pytest.raises(EngineFailed, match="3 engine steps in a row failed"):
            await runner.attach("CA2", lambda out: None)
        steps = engine.steps
        await asyncio.sleep(0.3)
        assert engine.steps == steps == 8  # the clock stopped: no more failing steps
        assert engine.closed == [call.slot]  # its slot was closed on the way down
    assert runner.crashes == 1


async def test_failed_steps_that_are_not_in_a_row_leave_the_host_up():
    engine = ScriptedEngine(fail_steps={3, 4, 6, 7, 9, 10})  # never three in a row
    errors: list[BaseException] = []
    async with EngineRunner(engine, max_failed_steps=3) as runner:
        call = await runner.attach("CA1", lambda out: None, on_error=errors.append)
        await _until(lambda: engine.steps >= 14)
        assert runner.running and not runner.engine_down and runner.crashes == 0
        await call.close()
    assert len(errors) == 6 and not any(getattr(e, "ends_call", False) for e in errors)
    assert runner.clock.timing.step_errors == 6


async def test_a_fatal_error_takes_the_host_down_at_once():
    engine = ScriptedEngine(fail_steps={4}, error=CUDA_ERROR)
    errors: list[BaseException] = []
    async with EngineRunner(engine, max_failed_steps=3) as runner:
        await runner.attach("CA1", lambda out: None, on_error=errors.append)
        await _until(lambda: bool(errors))
        assert len(errors) == 1 and isinstance(errors[0], EngineFailed), errors
        assert "after a fatal error" in str(errors[0]) and CUDA_ERROR in str(errors[0])
        assert runner.engine_down and runner.crashes == 1 and engine.steps == 4


def test_which_errors_are_fatal_and_the_test_fault_spec():
    assert is_fatal(RuntimeError(CUDA_ERROR)) and is_fatal(EngineFault("lost"))
    assert is_fatal(RuntimeError("CUDA error: device-side assert triggered"))
    assert not is_fatal(RuntimeError("shape mismatch")) and not is_fatal(ValueError("CUDA error"))
    fault = TestFault.parse("raise:2")
    fault.before_step(), fault.before_step()
    with pytest.raises(RuntimeError, match="injected engine fault after 2 steps"):
        fault.before_step()
    with pytest.raises(EngineFault):
        TestFault.parse("fatal:0").before_step()
    with pytest.raises(ValueError, match="expected raise:N or fatal:N"):
        TestFault.parse("sometimes")


async def test_the_pipecat_service_ends_the_call_with_a_fatal_error_frame(tmp_path):
    engine = ScriptedEngine(fail_from=15)
    async with EngineRunner(engine, max_failed_steps=3) as runner:
        recorder = CallRecorder(tmp_path, "CA-engine")
        service = DuetaSpanService(runner, call_id="CA-engine", recorder=recorder)
        first, last = UpstreamCollector(), Collector()
        worker = PipelineWorker(
            Pipeline([first, service, last]),
            params=PipelineParams(audio_in_sample_rate=24000, audio_out_sample_rate=24000),
            cancel_on_idle_timeout=False,
            enable_rtvi=False,
            idle_timeout_secs=None,
        )
        chunk = np.zeros(480, np.int16).tobytes()

        async def feed() -> None:
            await asyncio.wait_for(service.started.wait(), 30)
            for _ in range(3000):
                await worker.queue_frame(InputAudioRawFrame(audio=chunk, sample_rate=24000, num_channels=1))
                await asyncio.sleep(0.02)

        pipeline_runner = WorkerRunner(handle_sigint=False)
        await pipeline_runner.add_workers(worker)
        feeder = asyncio.create_task(feed())
        await asyncio.wait_for(pipeline_runner.run(), 60)  # returns: the engine's end cancelled the call
        feeder.cancel()
        await asyncio.gather(feeder, return_exceptions=True)
        assert runner.engine_down and runner.active_calls == 0
    record = service.recorder.close()
    assert record["summary"]["ended_by"] == "engine_error" and record["complete"]
    fatal = [f for f in first.up if isinstance(f, ErrorFrame) and f.fatal]
    assert len(fatal) == 1 and "the duplex engine is down" in fatal[0].error
    assert isinstance(fatal[0].exception, EngineFailed)
    passing = [f for f in first.up if isinstance(f, ErrorFrame) and not f.fatal]
    assert len(passing) == 2  # the two failed steps before the third took the engine down
    engine_events = [e for e in record["errors"] if e.get("stage") == "engine"]
    assert [e["fatal"] for e in engine_events] == [False, False, True]


SPEC = EngineProcessSpec(model="tiny-random", max_slots=1, threads=1, seed=0, max_failed_steps=3)


async def test_the_engine_process_goes_down_then_a_fresh_one_takes_new_calls(tmp_path):
    once = tmp_path / "fault-fired"
    env = {
        TEST_FAULT_ENV: f"raise:10:{once}"
    }  # the first child breaks after 10 steps; its successor runs clean
    errors: list[BaseException] = []
    runner = EngineProcess(SPEC, env=env, max_restarts=1, restart_delay_s=0.5)
    await runner.start()
    try:
        first_pid = runner.pid
        call = await runner.attach("CA1", lambda out: None, on_error=errors.append)
        await _until(lambda: any(getattr(e, "ends_call", False) for e in errors))
        down = errors[-1]
        assert isinstance(down, EngineCrashed) and down.crashed, errors
        assert "3 engine steps in a row failed" in str(down) and "injected engine fault" in str(down)
        assert call.closed and runner.engine_down and runner.free_slots == 0 and runner.crashes == 1
        assert not runner.engine_lost  # a fresh process is on its way
        with pytest.raises(EngineCrashed, match="in a row failed"):
            await runner.attach("CA2", lambda out: None)
        assert once.exists()

        await _until(lambda: runner.running, 120)  # restarted: a new child process, loaded
        assert runner.pid != first_pid and runner.host.restarts == 1 and not runner.engine_down
        ticks: list[TickOutput] = []
        again = await runner.attach("CA3", ticks.append)
        await _until(lambda: len(ticks) >= 12)
        await again.close()
        assert runner.crashes == 1 and runner.free_slots == 1
    finally:
        await runner.stop()
    assert not runner.running


async def test_an_engine_process_down_for_good_exits_once_its_host_has_read_why():
    """`max_restarts=0`: a fatal step fault ends the call with the child's own reason, and the child process,
    which waits after saying "fatal" until the host closes its side, is gone well before its own fallback
    (`FATAL_CLOSE_AFTER_S`): the host closes its side as soon as it has read the end."""
    errors: list[BaseException] = []
    runner = EngineProcess(SPEC, env={TEST_FAULT_ENV: "fatal:5"}, max_restarts=0)
    await runner.start()
    try:
        child = runner.host._proc
        call = await runner.attach("CA1", lambda out: None, on_error=errors.append)
        await _until(lambda: any(getattr(e, "ends_call", False) for e in errors))
        assert "a fatal error" in str(errors[-1]) and "injected engine fault" in str(errors[-1]), errors
        await _until(lambda: child.returncode is not None, 120)
        assert child.returncode == 0 and call.closed and runner.engine_lost
    finally:
        await runner.stop()


async def test_engine_max_failed_steps_from_agent_toml_reaches_both_hosts():
    from duetaspan.agent import Agent
    from duetaspan.config import AgentConfig

    config = AgentConfig.from_toml("[engine]\nmax_failed_steps = 1\nmax_restarts = 0\n")
    agent = Agent(engine=ScriptedEngine(fail_steps={4}), config=config, builtins=[], router=False)
    async with agent:
        session = agent.create_session("CA-toml")
        await session.open()
        await _until(lambda: agent.engine_down)  # one failed step is enough with max_failed_steps = 1
        assert agent.runner.host.max_failed_steps == 1 and agent.free_slots == 0
    spec = agent._engine_spec()
    assert spec.max_failed_steps == 1


def _read_message(sock: socket.socket) -> tuple | None:
    """The next framed message from a blocking socket (None at its end)."""
    import pickle

    def exactly(n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    head = exactly(HEADER.size)
    if head is None:
        return None
    body = exactly(HEADER.unpack(head)[0])
    assert body is not None, "the socket ended inside a message"
    return pickle.loads(body)


def test_an_engine_process_that_says_fatal_still_reads_what_the_server_sends_until_it_closes(tmp_path):
    """The real engine process, spoken to over its socket as `ProcessHost` does, its steps made fatal after 5.
    After "fatal" its end of the socket is half-closed: the server sees the end of what it says, yet a caller
    frame the server pushes after that still goes through, and the process exits once the server closes its
    side. (It used to close the socket outright: a push that crossed "fatal" then failed with EPIPE, the
    server's transport dropped what it had not read yet, "fatal" among it, and the crash was reported as
    "exited with code 0" instead of its cause. This fails then: the push raises `BrokenPipeError`.)"""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    env = {**os.environ, TEST_FAULT_ENV: "fatal:5"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "duetaspan.pipeline.engine_process", "--fd", str(theirs.fileno())],
        pass_fds=(theirs.fileno(),), env=env, stderr=(tmp_path / "child.log").open("wb"),
    )  # fmt: skip
    theirs.close()
    try:
        ours.settimeout(300)
        ours.sendall(frame(("spec", SPEC.model_dump(mode="json"))))
        assert (first := _read_message(ours)) is not None and first[0] == "ready", first
        ours.sendall(frame(("req", 1, ("attach", 7, "CA-half", None, None, 0, False))))
        said: list[tuple] = []
        while (msg := _read_message(ours)) is not None:  # ticks, replies, clock ... then "fatal", then the end
            said.append(msg)
        kinds = [m[0] for m in said]
        assert kinds[-1] == "fatal" and "reply" in kinds and "tick" in kinds, kinds
        assert "injected engine fault" in said[-1][1], said[-1]
        assert proc.poll() is None  # still there, reading
        ours.sendall(frame(("push", 7, np.zeros(1920, np.float32).tobytes())))  # crosses "fatal": not an error
        ours.close()
        assert proc.wait(timeout=300) == 0
    finally:
        ours.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
