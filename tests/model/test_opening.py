"""Bounded call opening (issue 23.3): a persona prefill written in chunks between ticks leaves the slot in the
state one pass leaves, each gap's chunks fit the budget it was given (a cost model on a fake clock: logic, not
wall time), a waiting call hears silence while the live calls go on untouched."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from duetaspan.model.engine import Persona
from duetaspan.model.opening import OpeningQueue
from duetaspan.model.slots import SamplingParams
from tests.model.engine_support import GREEDY, caller_audio, engine, tiny_parts

SAMPLED = SamplingParams(temperature=0.8, text_temperature=0.7, top_k=50, text_top_k=10)


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return tiny_parts(tmp_path_factory.mktemp("tok"))


@pytest.fixture
def voice(tmp_path):
    codes = torch.randint(0, 2048, (8, 40), generator=torch.Generator().manual_seed(3))
    path = tmp_path / "voice.pt"
    torch.save({"codes": codes}, path)
    return str(path)


class FakeClock:
    """Time advances only when a prefill runs: `overhead + per_frame * n` ms per chunk."""

    def __init__(self, overhead_ms: float = 2.0, per_frame_ms: float = 0.5) -> None:
        self.t, self.overhead, self.per_frame = 0.0, overhead_ms, per_frame_ms

    def __call__(self) -> float:
        return self.t

    def charge(self, n: int) -> None:
        self.t += (self.overhead + self.per_frame * n) / 1e3


def _fake_costs(eng, clock: FakeClock) -> None:
    eng.openings.clock = clock
    real = eng.lm.prefill

    def prefill(slot, frames, sample=True):
        clock.charge(frames.shape[1])
        return real(slot, frames, sample=sample)

    eng.lm.prefill = prefill


def test_a_chunked_persona_prefill_equals_one_pass(parts, voice):
    who = Persona(text="You are Ada, the booking assistant of a small hotel.", voice=voice)
    one = engine(parts, max_slots=2, max_span=64)
    chunked = engine(parts, max_slots=2, max_span=64)
    clock = FakeClock()
    _fake_costs(chunked, clock)
    a = one.open_slot(who, sampling=SAMPLED, seed=4)
    b = chunked.open_slot(who, sampling=SAMPLED, seed=4, defer_prefill=True)
    assert chunked.openings.waiting(int(b)) and chunked.lm.offset(int(b)) == 0
    gaps = 0
    while chunked.openings:
        chunked.prefill_pending(9.0)
        gaps += 1
        assert gaps < 100
    sizes = chunked.openings.chunk_sizes
    assert len(set(sizes)) > 1 and len(sizes) > 3 and sum(sizes) == one.prompt_stats(a)[0]
    sa, sb = one.lm.slot_state(int(a)), chunked.lm.slot_state(int(b))
    assert sa.offset == sb.offset and torch.equal(sa.token_ring, sb.token_ring)
    assert torch.equal(sa.positions, sb.positions) and sa.ret_prob == pytest.approx(sb.ret_prob, abs=1e-6)
    torch.testing.assert_close(sa.kv, sb.kv, atol=1e-4, rtol=1e-4)
    assert one.prompt_stats(a)[0] == chunked.prompt_stats(b)[0]
    audio = caller_audio(8, seed=9)
    for t in range(8):  # sampled slots: the generators were drawn from exactly as often
        ra, rb = one.step({a: audio[t]})[a], chunked.step({b: audio[t]})[b]
        assert (ra.text_token, ra.agent_codes) == (rb.text_token, rb.agent_codes), t
        np.testing.assert_allclose(ra.pcm, rb.pcm, atol=1e-4)


def test_each_gap_writes_no_more_than_its_budget():
    """The live calls' next tick waits for a gap's chunks: the planned chunks must fit the gap's budget."""
    from duetaspan.model.generator import LMGenerator
    from duetaspan.model.lm import LMModel
    from duetaspan.model.lm_config import LMConfig

    gen = LMGenerator(LMModel(LMConfig.preset("tiny-random")).eval(), batch_size=2, max_span=64)
    clock = FakeClock(overhead_ms=3.0, per_frame_ms=0.4)
    queue = OpeningQueue(gen, max_span=64, first_chunk=4, clock=clock)
    real = gen.prefill
    gen.prefill = lambda slot, frames, sample=True: (clock.charge(frames.shape[1]), real(slot, frames, sample))[1]
    queue.add(0, 1, torch.zeros(17, 150, dtype=torch.long))
    queue.add(1, 1, torch.zeros(17, 90, dtype=torch.long))
    budgets = [12.0, 5.0, 30.0, 2.0, 0.0, 20.0] * 20
    finished = []
    for budget in budgets:
        start = clock()
        finished += [p.slot for p in queue.run(budget)]
        assert (clock() - start) * 1e3 <= budget + 1e-9, f"a gap of {budget} ms took longer"
        if not queue:
            break
    assert finished == [0, 1] and gen.offset(0) == 150 and gen.offset(1) == 90, "first come, first served"
    assert max(queue.chunk_sizes) > 2 * queue.first_chunk, "chunks grow to what the budget allows"
    # a queue that never gets room still moves: the host's forced chunk writes at least one frame
    queue.add(0, 2, torch.zeros(17, 3, dtype=torch.long))
    before = gen.offset(0)
    queue.run(0.0, at_least=1)
    assert gen.offset(0) == before + 1


def test_a_waiting_call_hears_silence_and_the_live_call_is_untouched(parts):
    who = Persona(text="You are Ben, who answers in one sentence.")
    alone = engine(parts, max_slots=2, max_span=64)
    busy = engine(parts, max_slots=2, max_span=64)
    _fake_costs(busy, FakeClock())
    live_a, live_b = alone.open_slot(who, sampling=GREEDY, seed=1), busy.open_slot(who, sampling=GREEDY, seed=1)
    audio = caller_audio(12, seed=2)
    new = None
    waiting_frames = 0
    for t in range(12):
        if t == 3:
            new = busy.open_slot(who, sampling=GREEDY, seed=2, defer_prefill=True)
            assert busy.inject(new, "It is 22 degrees."), "a span for a waiting call is kept for later"
        frames = {live_b: audio[t]} if new is None else {live_b: audio[t], new: audio[t]}
        out = busy.step(frames)
        want = alone.step({live_a: audio[t]})[live_a]
        assert (out[live_b].text_token, out[live_b].agent_codes) == (want.text_token, want.agent_codes), t
        if new is not None:
            r = out[new]
            if r.waiting:
                waiting_frames += 1
                assert r.silent and not r.pcm.any() and r.text_token == -2 and busy.lm.offset(int(new)) < 30
            else:
                assert not busy.openings.waiting(int(new))
            busy.prefill_pending(6.0)  # the gap before the next tick
    assert waiting_frames >= 2, "the prompt took several gaps"
    assert new is not None and any(s.reference == "It is 22 degrees." for s in busy._slots[int(new)].landed)
    busy.close_slot(new)
    assert not busy.openings


def test_closing_a_waiting_call_drops_its_prompt(parts):
    eng = engine(parts, max_slots=1, max_span=64)
    slot = eng.open_slot(Persona(text="You are Cy."), defer_prefill=True)
    assert eng.openings.waiting(int(slot))
    eng.close_slot(slot)
    assert not eng.openings and eng.prefill_pending(100.0) == 0
    again = eng.open_slot(Persona(text="You are Dee."), defer_prefill=True)
    assert eng.prefill_pending(1e6) == 1 and eng.prompt_stats(again)[0] > 0
