"""The agent-hold switch (`CallSlot.hold_agent`, `runner.attach(hold_agent=True)`) through the engine hosts: an
engine process opens the call held and releases it over its socket (the real tiny-random engine in a child
process), and an engine without the switch (the scripted one) runs the call as before."""

from __future__ import annotations

import asyncio

from duetaspan.model.convention import SILENCE_CODES, UNGENERATED_TOKEN_ID
from duetaspan.model.engine import SamplingParams
from duetaspan.pipeline.engine_process import EngineProcess, EngineProcessSpec
from duetaspan.pipeline.runner import EngineRunner, TickOutput
from tests.model.engine_support import caller_audio
from tests.pipeline.scripted_engine import ScriptedEngine

GREEDY = SamplingParams(temperature=0.0, text_temperature=0.0)
SPEC = EngineProcessSpec(model="tiny-random", max_slots=1, threads=1, max_backlog_frames=64, seed=0)


async def _until(predicate, limit_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + limit_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)


def _modelled(outputs: list[TickOutput]) -> list:
    return [o.result for o in outputs if o.result.text_token != UNGENERATED_TOKEN_ID]


async def test_an_engine_process_opens_a_call_held_and_releases_it_over_its_socket():
    outputs: list[TickOutput] = []
    async with EngineProcess(SPEC) as runner:
        call = await runner.attach("CA1", outputs.append, sampling=GREEDY, hold_agent=True)
        audio = caller_audio(8, seed=3)
        for frame in audio[:4]:
            call.push(frame)
        await _until(lambda: len(_modelled(outputs)) >= 4)
        call.hold_agent(False)
        for frame in audio[4:]:
            call.push(frame)
        await _until(lambda: sum(not r.held for r in _modelled(outputs)) >= 3)
        await call.close()
    frames = _modelled(outputs)
    first = next(i for i, r in enumerate(frames) if not r.held)
    assert first >= 4 and all(r.agent_codes == SILENCE_CODES for r in frames[:first])
    assert not any(r.held for r in frames[first:]) and frames[-1].agent_codes != SILENCE_CODES


async def test_an_engine_without_the_switch_ignores_it():
    engine = ScriptedEngine(max_slots=1)
    outputs: list[TickOutput] = []
    async with EngineRunner(engine) as runner:
        call = await runner.attach("CA1", outputs.append, hold_agent=True)
        call.hold_agent(False)
        await _until(lambda: len(outputs) >= 3)
        await call.close()
    assert engine.opened == [0] and not hasattr(outputs[0].result, "held")
