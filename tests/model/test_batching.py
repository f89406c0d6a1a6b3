"""Batched ticks: a slot's outputs in a shared batch equal its solo run; join/leave/reset mid-run; spans in
several slots in one tick; per-slot sampling; buckets leave rows past the bucket untouched; admission."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from duetaspan.model.batching import BatchedTick, cuda_graphs_wanted, default_buckets
from duetaspan.model.engine import Persona
from duetaspan.model.slots import EngineFullError, SamplingParams
from tests.model.engine_support import GREEDY, caller_audio, engine, tiny_parts

N = 10
SAMPLED = SamplingParams(temperature=0.8, text_temperature=0.7, top_k=50, text_top_k=10)


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return tiny_parts(tmp_path_factory.mktemp("tok"))


# Each call: (persona, sampling, seed, frame it joins, frame it leaves, {frame: [references]}).
CALLS = [
    ("You are Ada.", GREEDY, 1, 0, 6, {2: ["It is 22 degrees."], 4: ["The shop opens at nine."]}),
    ("You are Ben.", SAMPLED, 2, 1, N, {2: ["(no information found)"]}),
    ("You are Cy.", GREEDY, 3, 0, N, {2: ["Flight BA12 leaves at 10."], 7: ["Gate 4."]}),
    # joins slot 0 again after Ada left: a reset in the middle of the run
    ("You are Dee.", GREEDY, 4, 7, N, {8: ["Room 12 is free."]}),
]


def _solo(parts, call, audio) -> list[tuple[int, tuple[int, ...], np.ndarray]]:
    persona, sampling, seed, start, stop, spans = call
    eng = engine(parts, max_slots=1, max_span=32)
    slot = eng.open_slot(Persona(text=persona), sampling=sampling, seed=seed)
    out = []
    for t in range(start, stop):
        for ref in spans.get(t, []):
            assert eng.inject(slot, ref)
        r = eng.step({slot: audio[t]})[slot]
        out.append((r.text_token, r.agent_codes, r.pcm))
    return out


def test_batched_equals_solo_with_join_leave_reset_and_spans_in_one_tick(parts):
    audios = [caller_audio(N, seed=10 + i) for i in range(len(CALLS))]
    eng = engine(parts, max_slots=4, max_span=32)
    slots: dict[int, int] = {}
    got: dict[int, list] = {i: [] for i in range(len(CALLS))}
    buckets = []
    for t in range(N):
        for i, (persona, sampling, seed, start, stop, _) in enumerate(CALLS):
            if t == stop and i in slots:
                eng.close_slot(slots.pop(i))
            if t == start:
                slots[i] = eng.open_slot(Persona(text=persona), sampling=sampling, seed=seed)
        landed_now = 0
        for i, slot in slots.items():
            for ref in CALLS[i][5].get(t, []):
                assert eng.inject(slot, ref)
                landed_now += 1
        results = eng.step({slot: audios[i][t] for i, slot in slots.items()})
        buckets.append(eng.batch.bucket_for([eng.is_open(s) for s in range(4)]))
        if t == 2:
            assert landed_now == 3 and sum(len(r.spans) for r in results.values()) == 3
        for i, slot in slots.items():
            r = results[slot]
            got[i].append((r.text_token, r.agent_codes, r.pcm))

    assert int(slots[3]) == 0, "the new call reuses the lowest free slot"
    assert max(buckets) == 4 and min(buckets) == 2
    for i, call in enumerate(CALLS):
        want = _solo(parts, call, audios[i])
        assert len(got[i]) == len(want)
        for t, ((tok, codes, pcm), (wtok, wcodes, wpcm)) in enumerate(zip(got[i], want, strict=True)):
            assert tok == wtok and codes == wcodes, f"call {i} frame {t}: tokens differ from its solo run"
            np.testing.assert_allclose(pcm, wpcm, atol=1e-4, err_msg=f"call {i} frame {t}")


def test_rows_past_the_bucket_are_untouched_and_buckets_follow_the_top_slot(parts):
    eng = engine(parts, max_slots=4, max_span=32)
    a = eng.open_slot(sampling=GREEDY, seed=1)
    far = eng.open_slot(sampling=GREEDY, seed=2)
    far2 = eng.open_slot(sampling=GREEDY, seed=3)
    audio = caller_audio(3)
    eng.step({a: audio[0], far: audio[0], far2: audio[0]})
    before = eng.lm.slot_state(2)
    enc_before = eng.mimi._enc.transformer.cache[:, :, 2].clone()
    tick = eng.batch.run(np.stack([audio[1]] * 4), [True, True, False, False])
    assert tick.bucket == 2 and tick.text[2:] == [-2, -2]
    after = eng.lm.slot_state(2)
    assert after.offset == before.offset and torch.equal(after.kv, before.kv)
    assert torch.equal(after.token_ring, before.token_ring)
    assert torch.equal(eng.mimi._enc.transformer.cache[:, :, 2], enc_before)
    assert eng.batch.bucket_for([False, False, True, False]) == 4
    assert eng.batch.bucket_for([True, False, False, False]) == 1
    assert eng.batch.bucket_for([False] * 4) == 1


def test_per_slot_sampling_seeds_do_not_depend_on_the_batch(parts):
    audio = caller_audio(6, seed=5)

    def run(seed: int, neighbours: int) -> list[int]:
        eng = engine(parts, max_slots=3, max_span=32)
        others = [eng.open_slot(sampling=SAMPLED, seed=100 + k) for k in range(neighbours)]
        slot = eng.open_slot(sampling=SAMPLED, seed=seed)
        out = []
        for frame in audio:
            res = eng.step({s: frame for s in [*others, slot]})
            out.append(res[slot].text_token)
            out.extend(res[slot].agent_codes)
        return out

    alone = run(7, 0)
    assert run(7, 2) == alone, "a sampled slot's tokens changed with its neighbours"
    assert run(8, 0) != alone, "the seed does not reach the slot's sampler"


def test_admission_when_full_and_a_freed_slot_is_reused(parts):
    eng = engine(parts, max_slots=2, max_span=32)
    first = eng.open_slot(sampling=GREEDY)
    eng.open_slot(sampling=GREEDY)
    with pytest.raises(EngineFullError, match="all 2 slots are in use"):
        eng.open_slot()
    eng.close_slot(first)
    again = eng.open_slot(sampling=GREEDY)
    assert int(again) == int(first) and again.generation == first.generation + 1


def test_buckets_and_graph_switch():
    assert default_buckets(1) == (1,)
    assert default_buckets(12) == (1, 2, 4, 8, 12)
    assert default_buckets(16) == (1, 2, 4, 8, 16)
    assert not cuda_graphs_wanted(torch.device("cpu"))
    assert not cuda_graphs_wanted(torch.device("cuda"), requested=False)


def test_cuda_graph_env_switch(monkeypatch):
    monkeypatch.setenv("NO_CUDA_GRAPH", "1")
    assert not cuda_graphs_wanted(torch.device("cuda"))
    monkeypatch.setenv("NO_CUDA_GRAPH", "0")
    assert cuda_graphs_wanted(torch.device("cuda"))


def test_bad_buckets_and_cpu_capture_is_a_no_op(parts):
    eng = engine(parts, max_slots=4, max_span=32)
    with pytest.raises(ValueError, match="end at max_slots=4"):
        BatchedTick(eng.lm, eng.mimi, buckets=(1, 2))
    assert eng.batch.capture() == 0 and eng.batch.graph_count == 0
