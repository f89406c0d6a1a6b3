"""A slot's agent held at silence inside the engine (`DuplexEngine.hold_agent`, answer detection): while held the
row steps and hears, but what it writes into its own agent streams (its context) and reports is pad text and
`SILENCE_CODES`, whatever the model sampled, and its batch neighbours are untouched; released, its samples go
through from its next step; a `<ret>` it samples while held never fires, a forced one waits for the release;
Context Spans still land; and the hold reaches a replayed (emulated) graph."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from duetaspan.model.convention import RET_ID, SILENCE_CODES, SILENT_AGENT_TOKENS, TEXT_PAD_ID
from duetaspan.model.engine import Persona
from duetaspan.model.graphs import EmulatedGraphBackend
from tests.model.engine_support import GREEDY, caller_audio, engine, tiny_parts

pytestmark = pytest.mark.usefixtures("one_thread")

ADA, BEN = Persona(text="You are Ada, a kind booking assistant."), Persona(text="You are Ben.")


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return tiny_parts(tmp_path_factory.mktemp("tok"))


def written(eng, slot: int) -> list[int]:
    """The agent tokens (text, 8 codes) the slot's last step wrote into its token ring: what it reads back."""
    lm = eng.lm
    return lm.ring[slot, : len(SILENT_AGENT_TOKENS), lm.offset(slot) % lm.ring.shape[-1]].tolist()


def sampled(eng) -> list[tuple[list[int], list[list[int]]]]:
    """Every step's draws, per row of its bucket, before any hold: (text tokens, [8 agent codes] per row)."""
    lm, draws, last = eng.lm, [], {}
    sample_text, depformer = lm._sampling.sample_text, lm._depformer

    def text(*args, **kw):
        out = sample_text(*args, **kw)
        last["text"] = out[0].tolist()
        return out

    def codes(*args, **kw):
        out = depformer(*args, **kw)
        if out.shape[1] == lm.config.gen_q:  # a step's depformer (a prefill's samples codebook 0 only)
            draws.append((last["text"], out.tolist()))
        return out

    lm._sampling.sample_text, lm._depformer = text, codes
    return draws


def test_a_held_row_writes_and_reports_silence_and_its_batch_neighbour_is_untouched(parts):
    n = 8
    audio0, audio1 = caller_audio(n, seed=3), caller_audio(n, seed=4)
    held = engine(parts, max_slots=2)
    h0, h1 = held.open_slot(ADA, seed=1, hold_agent=True), held.open_slot(BEN, seed=2)
    free = engine(parts, max_slots=2)  # the same two calls, nobody held
    f0, f1 = free.open_slot(ADA, seed=1), free.open_slot(BEN, seed=2)
    spoke = []
    for i in range(n):
        r = held.step({h0: audio0[i], h1: audio1[i]})
        w = free.step({f0: audio0[i], f1: audio1[i]})
        # what the held row wrote as its own past and what it reports: no text, a silent frame
        assert written(held, 0) == list(SILENT_AGENT_TOKENS), i
        got = r[h0]
        assert got.held and got.text_token == TEXT_PAD_ID and got.agent_codes == SILENCE_CODES, (i, got)
        assert got.silent and got.text == "" and not got.is_ret and got.ret_prob == 0.0
        # it still steps and hears: its offset and its user streams are the unheld call's
        assert held.lm.offset(0) == free.lm.offset(0)
        assert torch.equal(held.lm.ring[0, len(SILENT_AGENT_TOKENS) :], free.lm.ring[0, len(SILENT_AGENT_TOKENS) :])
        # the other row of the batch is bit-identical to the same call beside an unheld one
        other, same = r[h1], w[f1]
        assert not other.held and (other.text_token, other.agent_codes) == (same.text_token, same.agent_codes)
        assert np.array_equal(other.pcm, same.pcm)
        spoke.append(w[f0].agent_codes)
    assert not any(codes == SILENCE_CODES for codes in spoke), "unheld, the same call says something"
    one, two = held.lm.slot_state(1), free.lm.slot_state(1)
    assert torch.equal(one.kv, two.kv) and torch.equal(one.token_ring, two.token_ring)


def test_released_the_models_own_samples_go_through_from_the_next_step(parts):
    eng = engine(parts, max_slots=2)
    s0 = eng.open_slot(ADA, seed=1, hold_agent=True)
    s1 = eng.open_slot(BEN, seed=2)
    eng.hold_agent(s1, True)  # held after opening: from its next step
    draws = sampled(eng)
    audio = caller_audio(6, seed=5)
    for i in range(3):
        r = eng.step({s0: audio[i], s1: audio[i]})
        assert r[s0].held and r[s1].held and r[s0].agent_codes == r[s1].agent_codes == SILENCE_CODES
    eng.hold_agent(s0, False)
    first = eng.step({s0: audio[3], s1: audio[3]})
    text, codes = draws[-1]
    # the release step writes what slot 0 sampled; slot 1, still held, writes silence
    assert written(eng, 0) == [text[0], *codes[0]] and [text[0], *codes[0]] != list(SILENT_AGENT_TOKENS)
    assert written(eng, 1) == list(SILENT_AGENT_TOKENS)
    # its frame: the semantic part was read while held (pad, silent codebook 0), the acoustic codes are sampled
    r = first[s0]
    assert not r.held and r.text_token == TEXT_PAD_ID and r.agent_codes == (SILENCE_CODES[0], *codes[0][1:])
    assert r.ret_prob == 0.0  # the text it reports was held: not the P(<ret>) of the sample it replaced
    assert first[s1].held and first[s1].agent_codes == SILENCE_CODES
    second = eng.step({s0: audio[4], s1: audio[4]})
    text2, codes2 = draws[-1]
    assert written(eng, 0) == [text2[0], *codes2[0]]
    r = second[s0]  # the next frame is all the model's own
    assert (r.text_token, r.agent_codes) == (text[0], (codes[0][0], *codes2[0][1:]))
    assert second[s1].held and second[s1].agent_codes == SILENCE_CODES


def test_a_ret_while_held_never_fires_and_a_forced_one_waits_for_the_release(parts):
    def always_ret(eng):  # the model "samples" <ret> on every frame, with certainty
        real = eng.lm._sampling.sample_text

        def planted(*args, **kw):
            tokens, prob = real(*args, **kw)
            return torch.full_like(tokens, RET_ID), torch.ones_like(prob)

        eng.lm._sampling.sample_text = planted

    audio = caller_audio(8, seed=6)
    free = engine(parts, max_slots=1, ret_gate=(1e-12, 2))
    f = free.open_slot(ADA, seed=1)
    always_ret(free)
    asked = [free.step({f: a})[f].is_ret for a in audio[:3]]
    assert asked[1:] == [True, True], "the plant makes an unheld call ask (frame 0 was sampled at its prompt)"

    held = engine(parts, max_slots=1, ret_gate=(1e-12, 2))
    h = held.open_slot(ADA, seed=1, hold_agent=True)
    always_ret(held)
    for a in audio[:3]:
        r = held.step({h: a})[h]
        assert r.held and not r.is_ret and r.text_token == TEXT_PAD_ID and r.ret_prob == 0.0
    assert not held._forced, "the <ret> gate did not fire on a held frame"

    eng = engine(parts, max_slots=1)
    s = eng.open_slot(ADA, seed=1, hold_agent=True)
    eng.force_ret(s)
    assert not any(eng.step({s: a})[s].is_ret for a in audio[:3])  # kept while held
    eng.hold_agent(s, False)
    r = eng.step({s: audio[3]})[s]
    assert not r.held and r.is_ret and r.text_token == RET_ID  # on the first released frame


def test_spans_land_while_held_and_the_agent_stays_silent(parts):
    eng = engine(parts, max_slots=1)
    s = eng.open_slot(ADA, seed=1, hold_agent=True)
    audio = caller_audio(4, seed=8)
    eng.step({s: audio[0]})
    assert eng.inject(s, "(tool result) the table for four is booked for seven pm.")
    r = eng.step({s: audio[1]})[s]
    assert r.spans and r.spans[0].n_frames > 2
    assert r.held and r.text_token == TEXT_PAD_ID and r.agent_codes == SILENCE_CODES
    assert written(eng, 0) == list(SILENT_AGENT_TOKENS)
    r = eng.step({s: audio[2]})[s]
    assert r.held and r.agent_codes == SILENCE_CODES


@pytest.mark.cuda_logic
def test_the_hold_reaches_a_replayed_graph(parts):
    def run(eng) -> list[tuple]:
        s = eng.open_slot(sampling=GREEDY, seed=1, hold_agent=True)
        out = []
        for t, frame in enumerate(caller_audio(8, seed=7)):
            if t in (4, 6):
                eng.hold_agent(s, t == 6)  # released at frame 4, held again at frame 6
            r = eng.step({s: frame})[s]
            out.append((r.held, r.text_token, r.agent_codes))
        return out

    backend = EmulatedGraphBackend("cpu")
    graphed = run(engine(parts, sampling=GREEDY, max_slots=1, max_span=32, graph_backend=backend))
    eager = run(engine(parts, sampling=GREEDY, max_slots=1, max_span=32, cuda_graphs=False))
    assert backend.replays == 8 and graphed == eager
    assert [held for held, *_ in graphed] == [True] * 4 + [False] * 2 + [True] * 2
    assert all(codes == SILENCE_CODES for _, _, codes in graphed[1:4] + graphed[6:])  # held again at once
    assert graphed[5][2] != SILENCE_CODES
