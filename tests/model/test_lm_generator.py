"""The B-slot generator: one-pass prefill equals forced stepping (also after the KV ring wrapped), slot
isolation (exec mask, prefill, reset), batched == solo, per-slot sampling, and input validation."""

from __future__ import annotations

import pytest
import torch

from duetaspan.model.convention import (
    N_STREAMS,
    RET_ID,
    SILENCE_CODES,
    SINE_CODES,
    SPAN_CLOSE_ID,
    SPAN_OPEN_ID,
)
from duetaspan.model.generator import GeneratorError, LMGenerator
from duetaspan.model.sampling import SamplingParams
from tests.model.lm_helpers import greedy_generator, random_model, small_config

pytestmark = pytest.mark.usefixtures("one_thread")


def _codes(n: int, seed: int, width: int = 8) -> torch.Tensor:
    return torch.randint(0, 2048, (n, width), generator=torch.Generator().manual_seed(seed))


def _span(n: int, seed: int = 5) -> torch.Tensor:
    """A Context Span block: text `12, tokens…, 13`, agent silence, user sine (undelayed rows)."""
    frames = torch.empty(N_STREAMS, n, dtype=torch.long)
    body = torch.randint(20, 1000, (n,), generator=torch.Generator().manual_seed(seed))
    body[0], body[-1] = SPAN_OPEN_ID, SPAN_CLOSE_ID
    frames[0] = body
    frames[1:9] = torch.tensor(SILENCE_CODES)[:, None]
    frames[9:] = torch.tensor(SINE_CODES)[:, None]
    return frames


def _run(gen: LMGenerator, user: torch.Tensor, slot: int = 0) -> torch.Tensor:
    """Step a single-slot generator through `user` [T, 8]; the emitted frames [T, 9]."""
    rows = []
    for t in range(user.shape[0]):
        out = gen.step(user[t][None])
        rows.append(torch.cat([out.text, out.agent_codes[0]]))
    return torch.stack(rows) if rows else torch.empty(0, 9, dtype=torch.long)


def _assert_same_state(a, b, kv_tol: float = 1e-5) -> None:
    assert a.offset == b.offset
    assert torch.equal(a.token_ring, b.token_ring)
    assert torch.equal(a.positions, b.positions)
    written = a.positions >= 0
    assert (a.kv[..., written, :] - b.kv[..., written, :]).abs().max() <= kv_tol
    assert abs(a.ret_prob - b.ret_prob) < 1e-5


@pytest.mark.parametrize(
    ("warmup", "n"),
    [(0, 6), (1, 1), (7, 12), (3, 16), (60, 12), (75, 16)],
    ids=["at-start", "single-frame", "mid", "max-span", "wrapped", "wrapped-max-span"],
)
def test_one_pass_prefill_equals_forced_stepping(warmup: int, n: int) -> None:
    # context 32 + max_span 16 = 48 ring cells: warm-ups of 60/75 frames have wrapped the ring.
    model = random_model(small_config(context=32), seed=1)
    live = _codes(warmup + 50, seed=2)
    span = _span(n)
    a, b = greedy_generator(model), greedy_generator(model)
    for gen in (a, b):
        _run(gen, live[:warmup])
    for j in range(n):
        a.force_step(0, span[:, j])
    stats = b.prefill(0, span)
    assert stats.frames == n and stats.offset == warmup + n and stats.total_ms >= stats.forward_ms > 0
    _assert_same_state(a.slot_state(0), b.slot_state(0))
    after_a, after_b = _run(a, live[warmup:]), _run(b, live[warmup:])
    assert torch.equal(after_a, after_b)
    assert len(set(after_a[:, 0].tolist())) > 2  # the comparison is not vacuous


def test_prefill_keeps_live_audio_at_both_boundaries() -> None:
    model = random_model(small_config())
    live = _codes(5, seed=3)
    entry, exit_ = greedy_generator(model), greedy_generator(model)
    for gen in (entry, exit_):
        _run(gen, live)
    o = entry.offset(0)
    ct = entry.ring.shape[-1]
    # Entry: the block's first column reads the last live frame's acoustic codes (delay 1, cell o); a
    # one-frame block leaves that cell's delayed rows as they were.
    before = entry.ring[0, :, o % ct].clone()
    assert before[10:].tolist() == live[-1, 1:].tolist()
    entry.prefill(0, _span(1))
    assert torch.equal(entry.ring[0, 2:9, o % ct], before[2:9])
    assert torch.equal(entry.ring[0, 10:, o % ct], before[10:])
    # Exit: the cell the next live step reads carries the last span frame's delayed codebooks.
    exit_.prefill(0, _span(4))
    nxt = (o + 4) % ct
    assert exit_.ring[0, 2:9, nxt].tolist() == list(SILENCE_CODES[1:])
    assert exit_.ring[0, 10:, nxt].tolist() == list(SINE_CODES[1:])
    # The next live frame is consumed in the same tick: its semantic code lands in that cell.
    user = _codes(1, seed=4)
    out = exit_.step(user)
    assert int(exit_.ring[0, 9, nxt]) == int(user[0, 0])
    assert int(out.text[0]) >= 0 and (out.agent_codes >= 0).all()


def test_prefill_in_one_slot_leaves_other_slots_bit_identical() -> None:
    model = random_model(small_config(context=32), seed=2)
    gen = greedy_generator(model, batch=3)
    user = _codes(70, seed=6, width=24).view(70, 3, 8)
    for t in range(60):  # every slot's ring has wrapped
        gen.step(user[t])
    others = [gen.slot_state(s) for s in (1, 2)]
    kv_before = gen.kv.kv[:, :, 1:].clone()
    gen.prefill(0, _span(16))
    for s, before in zip((1, 2), others, strict=True):
        after = gen.slot_state(s)
        assert torch.equal(after.kv, before.kv) and torch.equal(after.token_ring, before.token_ring)
        assert torch.equal(after.positions, before.positions) and after.offset == before.offset
    assert torch.equal(gen.kv.kv[:, :, 1:], kv_before)


def test_inactive_slot_is_bit_untouched_and_resumes_exactly() -> None:
    model = random_model(small_config(), seed=3)
    user = _codes(40, seed=8, width=16).view(40, 2, 8)
    batched = greedy_generator(model, batch=2)
    solo = greedy_generator(model)
    out0 = []
    for t in range(10):
        out0.append(batched.step(user[t]).text[1])
        solo.step(user[t, 1][None])
    frozen = batched.slot_state(1)
    for t in range(10, 20):  # slot 1 skips ten ticks
        out = batched.step(user[t], torch.tensor([True, False]))
        assert int(out.text[1]) == -2 and (out.agent_codes[1] == -2).all()
    thawed = batched.slot_state(1)
    assert torch.equal(thawed.kv, frozen.kv) and torch.equal(thawed.token_ring, frozen.token_ring)
    assert thawed.offset == frozen.offset == 10
    for t in range(20, 40):
        b = batched.step(user[t])
        s = solo.step(user[t, 1][None])
        assert int(b.text[1]) == int(s.text[0]) and torch.equal(b.agent_codes[1], s.agent_codes[0])


def test_batched_greedy_equals_solo_slot_by_slot_with_prefill_and_reset() -> None:
    model = random_model(small_config(context=32), seed=4)
    T = 60
    user = _codes(T, seed=9, width=16).view(T, 2, 8)
    batched = greedy_generator(model, batch=2)
    solo0, solo1 = greedy_generator(model), greedy_generator(model)
    got0, got1, want0, want1 = [], [], [], []
    for t in range(T):
        if t == 25:  # a span lands in slot 0 only
            batched.prefill(0, _span(10))
            solo0.prefill(0, _span(10))
        if t == 30:  # slot 1's call ends and a new one starts
            batched.reset(1)
            solo1 = greedy_generator(model)
        b = batched.step(user[t])
        s0, s1 = solo0.step(user[t, 0][None]), solo1.step(user[t, 1][None])
        got0.append(torch.cat([b.text[:1], b.agent_codes[0]]))
        got1.append(torch.cat([b.text[1:], b.agent_codes[1]]))
        want0.append(torch.cat([s0.text, s0.agent_codes[0]]))
        want1.append(torch.cat([s1.text, s1.agent_codes[0]]))
    assert torch.equal(torch.stack(got0), torch.stack(want0))
    assert torch.equal(torch.stack(got1), torch.stack(want1))
    assert int(got1[30][0]) == -2  # warming up again right after the reset
    assert batched.offset(0) == T + 10 and batched.offset(1) == T - 30


def test_per_slot_sampling_is_seeded_and_independent_of_the_batch() -> None:
    model = random_model(small_config(), seed=5)
    params = SamplingParams(
        text_temperature=1.0, audio_temperature=1.0, text_top_k=50, audio_top_k=100, seed=11
    )
    user = _codes(20, seed=1, width=16).view(20, 2, 8)
    batched = LMGenerator(model, 2, max_span=8)
    batched.set_sampling(0, params)
    batched.set_sampling(1, SamplingParams.greedy())
    solo = LMGenerator(model, 1, max_span=8, sampling=params)
    greedy = greedy_generator(model)
    sampled_b, sampled_s, greedy_b, greedy_s = [], [], [], []
    for t in range(20):
        b = batched.step(user[t])
        s = solo.step(user[t, 0][None])
        g = greedy.step(user[t, 1][None])
        sampled_b.append(b.agent_codes[0])
        sampled_s.append(s.agent_codes[0])
        greedy_b.append(b.agent_codes[1])
        greedy_s.append(g.agent_codes[0])
    assert torch.equal(torch.stack(sampled_b), torch.stack(sampled_s))
    assert torch.equal(torch.stack(greedy_b), torch.stack(greedy_s))
    assert not torch.equal(torch.stack(sampled_b[2:]), torch.stack(greedy_s[2:]))
    # Another seed gives another sample; resetting the slot replays the same one.
    other = LMGenerator(model, 1, max_span=8, sampling=params.model_copy(update={"seed": 12}))
    replay = LMGenerator(model, 1, max_span=8, sampling=params)
    _run(replay, user[:5, 0])
    replay.reset(0)
    seq_other, seq_replay = _run(other, user[:, 0]), _run(replay, user[:, 0])
    assert torch.equal(seq_replay[:, 1:], torch.stack(sampled_s))
    assert not torch.equal(seq_other[:, 1:], seq_replay[:, 1:])


def test_top_k_one_is_greedy_and_ret_prob_is_a_probability() -> None:
    model = random_model(small_config(), seed=6)
    top1 = SamplingParams(text_temperature=0.7, audio_temperature=0.8, text_top_k=1, audio_top_k=1, seed=3)
    user = _codes(12, seed=2)
    a = LMGenerator(model, 1, max_span=8, sampling=top1)
    b = greedy_generator(model)
    assert torch.equal(_run(a, user), _run(b, user))
    gen = greedy_generator(model)
    probs = [float(gen.step(user[t][None]).ret_prob[0]) for t in range(12)]
    assert probs[0] == 0.0 and all(0.0 <= p <= 1.0 for p in probs) and any(p > 0 for p in probs[1:])
    assert RET_ID == 4


def test_allow_ret_false_never_samples_ret_but_reports_its_probability() -> None:
    model = random_model(small_config(), seed=6)
    bias = torch.zeros(model.text_linear.out_features)
    bias[RET_ID] = 1e3  # make <ret> the model's favourite text token whatever the hidden state
    model.text_linear.bias = torch.nn.Parameter(bias, requires_grad=False)
    user = _codes(10, seed=2)
    sampled = SamplingParams(seed=1)
    for params in (SamplingParams.greedy(), sampled):
        free = LMGenerator(model, 2, max_span=8)
        free.set_sampling(0, params)
        free.set_sampling(1, params.model_copy(update={"allow_ret": False}))
        texts, probs = [], []
        for t in range(10):
            out = free.step(user[t][None].expand(2, -1))
            texts.append(out.text.tolist())
            probs.append(out.ret_prob.tolist())
        warm = range(1, 10)  # frame 0 is the warm-up (-2)
        assert all(texts[t][0] == RET_ID for t in warm)  # the free slot asks every frame
        assert all(texts[t][1] not in (RET_ID, -2) for t in warm)  # the other never does
        assert all(probs[t][1] > 0.5 for t in warm)  # ... yet its P(<ret>) is still reported


def test_invalid_calls_raise_generator_error() -> None:
    gen = greedy_generator(random_model(small_config()), batch=2, max_span=8)
    with pytest.raises(GeneratorError, match="max_span=8"):
        gen.prefill(0, _span(9))
    with pytest.raises(GeneratorError, match=r"\[17, n\]"):
        gen.prefill(0, torch.zeros(16, 3, dtype=torch.long))
    with pytest.raises(GeneratorError, match="slot 2"):
        gen.reset(2)
    with pytest.raises(GeneratorError, match=r"\[2, 8\]"):
        gen.step(torch.zeros(1, 8, dtype=torch.long))
    with pytest.raises(GeneratorError, match=r"\[17\]"):
        gen.force_step(0, torch.zeros(16, dtype=torch.long))
    assert gen.offset(0) == 0 and gen.offset(1) == 0
