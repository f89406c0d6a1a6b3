"""EngineProcess: a real child process on tiny-random. Frames round-trip (tokens equal an in-process engine fed
what the model heard), spans land, admission when full, and a SIGKILLed engine ends its calls with a reported
error and refuses new ones."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import numpy as np
import pytest

from duetaspan.model.engine import DuplexEngine, Persona, SamplingParams
from duetaspan.pipeline.engine_process import EngineCrashed, EngineProcess, EngineProcessSpec
from duetaspan.pipeline.runner import EngineFull, TickOutput
from tests.model.engine_support import caller_audio

GREEDY = SamplingParams(temperature=0.0, text_temperature=0.0)
SPEC = EngineProcessSpec(model="tiny-random", max_slots=2, threads=1, max_backlog_frames=64, seed=0)
PERSONA = Persona(text="You are Ada.")


async def _until(predicate, limit_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + limit_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("timed out waiting")
        await asyncio.sleep(0.02)


async def test_frames_round_trip_spans_land_and_admission_when_full():
    outputs: list[TickOutput] = []
    async with EngineProcess(SPEC) as runner:
        assert runner.info["max_slots"] == 2 and runner.pid != os.getpid()
        call = await runner.attach("CA1", outputs.append, persona=PERSONA, sampling=GREEDY, seed=5)
        other = await runner.attach("CA2", lambda out: None, sampling=GREEDY)
        assert runner.free_slots == 0
        with pytest.raises(EngineFull, match="all 2 call slots are busy"):
            await runner.attach("CA3", lambda out: None)
        await other.close()
        assert runner.free_slots == 1

        audio = caller_audio(12, seed=3)
        for frame in audio[:6]:
            call.push(frame)
        await _until(lambda: len(outputs) >= 6)
        assert call.inject("It is 22 degrees in Sydney.") and not call.inject("   ")
        for frame in audio[6:]:
            call.push(frame)
        # wait for every pushed frame to be heard: under load the engine may conceal any number of ticks
        # before the first push, so a count of outputs alone can end the call with frames still queued
        await _until(
            lambda: (
                sum(len(o.result.spans) for o in outputs) >= 1 and sum(not o.concealed for o in outputs) >= 12
            )
        )
        await call.close()
        assert runner.free_slots == 2 and runner.clock.summary()["ticks"] > 0

    assert not runner.running
    assert [o.call_frame for o in outputs] == list(range(len(outputs)))
    heard = [o.caller_pcm for o in outputs if not o.concealed]
    assert len(heard) == 12 and all(np.array_equal(h, a) for h, a in zip(heard, audio, strict=True))
    span_at = next(i for i, o in enumerate(outputs) if o.result.spans)
    assert outputs[span_at].result.spans[0].reference == "It is 22 degrees in Sydney."

    # The same engine in this process, fed exactly what the model heard, says exactly the same (frames
    # before the persona prompt was written between ticks were silence the model never heard).
    local = DuplexEngine.load("tiny-random", max_slots=2, seed=0)
    slot = local.open_slot(PERSONA, sampling=GREEDY, seed=5)
    for i, out in enumerate(outputs):
        if out.result.waiting:
            assert out.result.silent and i < span_at
            continue
        if i == span_at:
            local.inject(slot, "It is 22 degrees in Sydney.")
        r = local.step({slot: out.caller_pcm})[slot]
        assert (r.text_token, r.agent_codes) == (out.result.text_token, out.result.agent_codes), i
        np.testing.assert_allclose(r.pcm, out.result.pcm, atol=1e-5)


async def test_killed_engine_ends_its_calls_with_a_reported_error(caplog):
    errors: list[BaseException] = []
    ticks: list[TickOutput] = []
    runner = EngineProcess(SPEC.model_copy(update={"max_slots": 1}), max_restarts=0)  # stays down
    await runner.start()
    try:
        call = await runner.attach("CA9", ticks.append, on_error=errors.append)
        await _until(lambda: len(ticks) >= 2)
        with caplog.at_level(logging.ERROR, logger="duetaspan.pipeline.engine_process"):
            os.kill(runner.pid, signal.SIGKILL)
            await _until(lambda: bool(errors))
        assert isinstance(errors[0], EngineCrashed) and errors[0].ends_call
        assert "SIGKILL" in str(errors[0])
        assert call.closed and not runner.running and runner.free_slots == 0
        assert any("SIGKILL" in r.getMessage() and "CA9" in r.getMessage() for r in caplog.records)
        with pytest.raises(EngineCrashed, match="SIGKILL"):
            await runner.attach("CA10", ticks.append)
        await call.close()  # closing a call of a dead engine is a no-op
        call.push(np.zeros(1920, np.float32))  # and so is feeding it
    finally:
        await runner.stop()


async def test_a_model_that_fails_to_load_is_reported():
    runner = EngineProcess(EngineProcessSpec(model="no-such-model", threads=1))
    with pytest.raises(EngineCrashed, match="loading the engine failed"):
        await runner.start()
    assert not runner.running


async def test_engine_crash_ends_the_call_pipeline_and_is_recorded(tmp_path):
    from pipecat.frames.frames import InputAudioRawFrame, SpeechOutputAudioRawFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.workers.runner import WorkerRunner

    from duetaspan.pipeline.artifacts import CallRecorder
    from duetaspan.pipeline.service import DuetaSpanService
    from tests.pipeline.harness import Collector, UpstreamCollector

    async with EngineProcess(SPEC) as runner:
        service = DuetaSpanService(runner, call_id="CA-crash", recorder=CallRecorder(tmp_path, "CA-crash"))
        last = Collector()
        worker = PipelineWorker(
            Pipeline([UpstreamCollector(), service, last]),
            params=PipelineParams(audio_in_sample_rate=24000, audio_out_sample_rate=24000),
            cancel_on_idle_timeout=False,
            enable_rtvi=False,
            idle_timeout_secs=None,
        )
        chunk = np.zeros(480, np.int16).tobytes()

        async def feed_then_kill() -> None:
            await asyncio.wait_for(service.started.wait(), 30)
            for i in range(2000):
                await worker.queue_frame(InputAudioRawFrame(audio=chunk, sample_rate=24000, num_channels=1))
                if i == 25:
                    await _until(
                        lambda: len([f for f in last.down if isinstance(f, SpeechOutputAudioRawFrame)])
                    )
                    os.kill(runner.pid, signal.SIGKILL)
                await asyncio.sleep(0.02)

        pipeline_runner = WorkerRunner(handle_sigint=False)
        await pipeline_runner.add_workers(worker)
        feeder = asyncio.create_task(feed_then_kill())
        await asyncio.wait_for(pipeline_runner.run(), 30)  # returns because the crash cancelled the call
        feeder.cancel()
        await asyncio.gather(feeder, return_exceptions=True)
        assert not runner.running and runner.active_calls == 0
    record = service.recorder.close()
    errors = [e for e in record.get("events", record.get("errors", [])) if e.get("stage") == "engine"]
    assert errors and "SIGKILL" in errors[0]["message"], record.keys()


async def test_agent_engine_process_option_admits_and_refuses_calls():
    from duetaspan.agent import Agent

    agent = Agent(persona="Hi", model="tiny-random", device="cpu", max_calls=1, builtins=[], router=False,
                  engine_process=True)  # fmt: skip
    async with agent:
        assert isinstance(agent.runner, EngineProcess) and agent.runner.info["max_slots"] == 1
        first = agent.create_session("A")
        await first.open()
        with pytest.raises(EngineFull, match="busy"):
            await agent.create_session("B").open()
        await first.service.close()
        assert agent.free_slots == 1
    assert not agent.runner.running
