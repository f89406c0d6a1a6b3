"""The engine host writes a new call's persona prompt in the ticks' spare time (issue 23.3), on a real tiny
engine: only between ticks, never with a budget past the next deadline, the new caller hearing silence until
it is written; an engine with no spare time still gets the call going; the old behaviour is one switch away."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from duetaspan.model.engine import DuplexEngine, Persona
from duetaspan.pipeline.runner import EngineRunner
from duetaspan.pipeline.thread_host import ThreadHost
from tests.model.engine_support import GREEDY

PERSONA = Persona(text="You are Ada, the booking assistant of a small hotel. Be brief and kind to callers.")


class Watched:
    """Records every `prefill_pending` call (budget, at_least, whether a step was running, thread)."""

    def __init__(self, engine: DuplexEngine, step_delay_s: float = 0.0) -> None:
        self.engine, self.calls, self.in_step = engine, [], False
        real_step, real_prefill = engine.step, engine.prefill_pending

        def step(frames):
            self.in_step = True
            try:
                if step_delay_s:
                    time.sleep(step_delay_s)
                return real_step(frames)
            finally:
                self.in_step = False

        def prefill_pending(budget_ms, at_least=0):
            self.calls.append((budget_ms, at_least, self.in_step, threading.current_thread().name))
            return real_prefill(budget_ms, at_least)

        engine.step, engine.prefill_pending = step, prefill_pending


async def _until(cond, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_a_persona_prompt_is_written_between_ticks_within_the_gap():
    engine = DuplexEngine.load("tiny-random", max_slots=2, seed=0)
    watched = Watched(engine)
    host = ThreadHost(engine, name="opening-test")
    async with EngineRunner(host=host, max_calls=2) as runner:
        live_out, new_out = [], []
        await runner.attach("CA1", live_out.append, sampling=GREEDY)
        await _until(lambda: len(live_out) >= 3)
        await runner.attach("CA2", new_out.append, persona=PERSONA, sampling=GREEDY)
        await _until(lambda: any(not o.result.waiting for o in new_out) and len(new_out) >= 4)
    first_live = next(i for i, o in enumerate(new_out) if not o.result.waiting)
    # (tiny-random's prompt may fit the very first gap: then the caller hears no waiting frame at all)
    assert all(o.result.waiting and o.result.silent for o in new_out[:first_live])
    assert all(not o.result.waiting for o in new_out[first_live:])
    assert engine.openings.chunk_sizes, "the prompt went through the queue, not one pass at open"
    assert not any(o.result.waiting for o in live_out), "the live call never waits"
    assert watched.calls and engine.prompt_stats(1)[0] > 0
    period_ms = host.period * 1e3
    for budget, at_least, in_step, thread in watched.calls:
        assert not in_step and thread == "opening-test", "prompts are written between ticks, on the engine thread"
        limit = period_ms - host.prefill_margin_ms + host.prefill_slack_ms
        assert budget <= limit or at_least > 0, "a gap's budget ends at most the slack past the deadline"


async def test_an_engine_without_spare_time_still_gets_a_new_call_going():
    engine = DuplexEngine.load("tiny-random", max_slots=2, seed=0)
    watched = Watched(engine, step_delay_s=0.09)  # every tick overruns the 80 ms frame: never a gap
    host = ThreadHost(engine, name="starved-test", starved_ticks=2)
    async with EngineRunner(host=host, max_calls=2) as runner:
        out = []
        await runner.attach("CA1", lambda o: None, sampling=GREEDY)
        await runner.attach("CA2", out.append, persona=PERSONA, sampling=GREEDY)
        await _until(lambda: any(not o.result.waiting for o in out), timeout_s=120)
    forced = [c for c in watched.calls if c[1] > 0]
    assert forced, "after starved_ticks without room, a chunk of at least 4 frames runs anyway"


@pytest.mark.parametrize("bounded", [True, False])
async def test_bounded_opening_is_one_switch(bounded):
    engine = DuplexEngine.load("tiny-random", max_slots=1, seed=0)
    host = ThreadHost(engine, bounded_opening=bounded)
    async with EngineRunner(host=host, max_calls=1) as runner:
        out = []
        await runner.attach("CA1", out.append, persona=PERSONA, sampling=GREEDY)
        # right after attach: a queued prompt (bounded) or one written in one pass at open (the old way)
        assert (engine.prompt_stats(0)[1] == 0.0) is bounded
        await _until(lambda: any(not o.result.waiting for o in out))
    assert bool(engine.openings.chunk_sizes) is bounded
