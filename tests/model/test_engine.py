"""DuplexEngine composition: persona one pass == stepping, span frame accounting, batch isolation, slots."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from duetaspan.model.convention import RET_ID, SILENCE_CODES, SPAN_CLOSE_ID, SPAN_OPEN_ID
from duetaspan.model.engine import Persona
from duetaspan.model.generator import LMGenerator
from duetaspan.model.mimi import MimiStream
from duetaspan.model.persona import persona_prompt_text, prompt_frames
from duetaspan.model.slots import EngineError, EngineFullError, FrameResult, SlotId
from duetaspan.spans.block import span_frames
from tests.model.engine_support import GREEDY, caller_audio, engine, tiny_parts

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return tiny_parts(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def voice_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("voices") / "ada.pt"
    codes = torch.randint(0, 2048, (8, 7), generator=torch.Generator().manual_seed(3))
    torch.save({"codes": codes}, path)
    return path


PERSONA_TEXT = "You are Ada, a kind booking assistant."


def test_persona_one_pass_equals_stepping(parts, voice_file):
    eng = engine(parts, max_slots=1)
    persona = Persona(text=PERSONA_TEXT, voice=voice_file, user_name="Sam")
    slot = eng.open_slot(persona, sampling=GREEDY, seed=5)
    text = persona_prompt_text(persona)
    assert text == f"<system> {PERSONA_TEXT} The user's name is Sam. <system>"
    tokens = eng.tokenizer.encode(text)
    frames = prompt_frames(eng.voice_codes(voice_file), tokens)
    assert eng.prompt_stats(slot)[0] == frames.shape[1] == 7 + 6 + len(tokens) + 6

    ref = LMGenerator(parts[0], batch_size=1, max_span=64)
    ref.set_sampling(0, GREEDY.model_copy(update={"seed": 5}))
    ref.reset(0)
    for j in range(frames.shape[1]):
        ref.force_step(0, frames[:, j])
    one, many = eng.lm.slot_state(slot), ref.slot_state(0)
    assert one.offset == many.offset == frames.shape[1]
    assert torch.equal(one.token_ring, many.token_ring)
    assert torch.equal(one.positions, many.positions)
    assert torch.allclose(one.kv, many.kv, atol=1e-5)
    # and the conversation that follows is the same
    user = torch.randint(0, 2048, (6, 1, 8), generator=torch.Generator().manual_seed(1))
    for t in range(6):
        a = eng.lm.step(user[t])
        b = ref.step(user[t])
        assert torch.equal(a.text, b.text) and torch.equal(a.agent_codes, b.agent_codes)


def _reference_run(parts, slot_count, persona_frames, audio, spans_at, close_id=SPAN_CLOSE_ID):
    """The engine's work done by hand on a fresh LMGenerator + MimiStream (slot 0 only)."""
    lm, mimi, tok = parts
    gen = LMGenerator(lm, batch_size=slot_count, max_span=64)
    gen.set_sampling(0, GREEDY.model_copy(update={"seed": 7}))
    gen.reset(0)
    stream = MimiStream(mimi, batch_size=slot_count)
    if persona_frames.shape[1]:
        gen.prefill(0, persona_frames)
    rows = [True] + [False] * (slot_count - 1)
    out = []
    with torch.inference_mode():
        for i, frame in enumerate(audio):
            for reference in spans_at.get(i, []):
                gen.prefill(0, span_frames(tok.encode(reference), close_id))
            pcm = torch.zeros(slot_count, 1, 1920)
            pcm[0, 0] = torch.from_numpy(frame)
            codes = stream.encode(pcm, active=rows)
            step = gen.step(codes[:, :, 0], torch.tensor(rows))
            if int(step.text[0]) < 0:
                out.append(np.zeros(1920, np.float32))
                continue
            dec = stream.decode(step.agent_codes.clamp(min=0)[:, :, None], active=rows)
            out.append(dec[0, 0].numpy())
    return out


def test_span_frame_accounting_at_random_frames(parts):
    rng = np.random.default_rng(11)
    n = 16
    at = sorted(rng.choice(np.arange(1, n), size=3, replace=False).tolist())
    refs = ["(tool result) it is 22 degrees in Sydney.", "The store opens at nine.", "(no information found)"]
    spans_at = {f: [r] for f, r in zip(at, refs, strict=True)}
    audio = caller_audio(n, seed=2)
    persona = Persona(text=PERSONA_TEXT)

    # One bucket of 2 rows, as the hand-made reference below: bit-exact floats need the same batch shape.
    eng = engine(parts, max_slots=2, buckets=(2,))
    slot = eng.open_slot(persona, sampling=GREEDY, seed=7)
    results: list[FrameResult] = []
    for i, frame in enumerate(audio):
        for r in spans_at.get(i, []):
            assert eng.inject(slot, r)
        results.append(eng.step({slot: frame})[slot])

    assert len(results) == n and [r.frame_index for r in results] == list(range(n))
    landed = [(r.frame_index, s.reference, s.n_frames) for r in results for s in r.spans]
    assert [(f, ref) for f, ref, _ in landed] == [(f, spans_at[f][0]) for f in at]
    for _, ref, n_frames in landed:
        assert n_frames == len(eng.tokenizer.encode(ref)) + 2
    assert all(s.prefill_ms > 0 for r in results for s in r.spans)
    assert eng.lm.offset(slot) == eng.prompt_stats(slot)[0] + n + sum(x[2] for x in landed)

    frames = prompt_frames(None, eng.tokenizer.encode(persona_prompt_text(persona)))
    expected = _reference_run(parts, 2, frames, audio, spans_at)
    for i, (got, want) in enumerate(zip(results, expected, strict=True)):
        assert got.pcm.shape == (1920,) and got.pcm.dtype == np.float32
        assert np.array_equal(got.pcm, want), f"agent audio of frame {i} comes from the wrong frame"


def test_batch_isolation_span_in_slot0_leaves_slot1_identical(parts):
    n = 8
    audio0, audio1 = caller_audio(n, seed=3), caller_audio(n, seed=4)
    persona = Persona(text=PERSONA_TEXT)

    both = engine(parts, max_slots=2)
    s0 = both.open_slot(Persona(text="You are Ben."), sampling=GREEDY, seed=1)
    s1 = both.open_slot(persona, sampling=GREEDY, seed=2)
    alone = engine(parts, max_slots=2)
    a0 = alone.open_slot(Persona(text="You are Ben."), sampling=GREEDY, seed=1)  # holds slot 0, never stepped
    a1 = alone.open_slot(persona, sampling=GREEDY, seed=2)
    assert (int(s1), int(a1)) == (1, 1) and int(a0) == 0
    for i in range(n):
        if i in (2, 5):
            both.inject(s0, "(tool result) the table for four is booked for seven pm.")
        r = both.step({s0: audio0[i], s1: audio1[i]})
        solo = alone.step({a1: audio1[i]})[a1]
        assert r[s1].text_token == solo.text_token and r[s1].agent_codes == solo.agent_codes
        assert np.array_equal(r[s1].pcm, solo.pcm)
        assert r[s1].spans == [] and (i not in (2, 5) or r[s0].spans)
    state_both, state_alone = both.lm.slot_state(1), alone.lm.slot_state(1)
    assert torch.equal(state_both.kv, state_alone.kv) and torch.equal(
        state_both.token_ring, state_alone.token_ring
    )


def test_idle_slot_state_is_untouched(parts):
    eng = engine(parts, max_slots=2)
    s0 = eng.open_slot(Persona(text=PERSONA_TEXT), seed=1)
    s1 = eng.open_slot(Persona(text="You are Ben."), seed=2)
    before = eng.lm.slot_state(s1)
    for frame in caller_audio(3):
        eng.inject(s0, "(tool result) sunny")
        eng.step({s0: frame})
    after = eng.lm.slot_state(s1)
    assert torch.equal(before.kv, after.kv) and torch.equal(before.token_ring, after.token_ring)
    assert before.offset == after.offset


def test_reset_and_reprompt_one_slot(parts):
    eng = engine(parts, max_slots=2)
    s0 = eng.open_slot(Persona(text=PERSONA_TEXT), sampling=GREEDY, seed=1)
    s1 = eng.open_slot(Persona(text="You are Ben."), sampling=GREEDY, seed=2)
    audio = caller_audio(6)
    first = [eng.step({s0: f, s1: f})[s1] for f in audio[:3]]
    eng.close_slot(s0)
    s0b = eng.open_slot(Persona(text="You are Carla."), sampling=GREEDY, seed=3)
    assert int(s0b) == 0 and s0b.generation == s0.generation + 1
    rest = [eng.step({s0b: f, s1: f})[s1] for f in audio[3:]]
    # slot 1 continued exactly as if slot 0 had never been reset
    ref = engine(parts, max_slots=2)
    ref.open_slot(Persona(text="You are Zed."), sampling=GREEDY, seed=9)
    r1 = ref.open_slot(Persona(text="You are Ben."), sampling=GREEDY, seed=2)
    want = [ref.step({r1: f})[r1] for f in audio]
    assert [r.agent_codes for r in first + rest] == [w.agent_codes for w in want]


def test_slots_full_closed_and_bad_frames(parts):
    eng = engine(parts, max_slots=1)
    slot = eng.open_slot()
    assert isinstance(slot, SlotId) and slot == 0 and {slot: 1}[0] == 1
    with pytest.raises(EngineFullError, match="all 1 slots"):
        eng.open_slot()
    with pytest.raises(Exception, match="1920 samples"):
        eng.step({slot: np.zeros(100, np.float32)})
    first = eng.step({slot: np.zeros(1920, np.float32)})[slot]
    assert first.text_token == -2 and first.silent and not first.pcm.any()  # no prompt: warming up
    eng.close_slot(slot)
    with pytest.raises(EngineError, match="not open"):
        eng.step({0: np.zeros(1920, np.float32)})
    with pytest.raises(EngineError, match="out of range"):
        eng.inject(5, "x")


def test_force_ret_and_gate(parts):
    eng = engine(parts, max_slots=1)
    slot = eng.open_slot(Persona(text=PERSONA_TEXT), seed=1)
    audio = caller_audio(6)
    eng.force_ret(slot)
    r = eng.step({slot: audio[0]})[slot]
    assert r.is_ret and r.text_token == RET_ID and r.text == ""
    assert not eng.step({slot: audio[1]})[slot].is_ret or True  # the model may ask again, never forced twice

    gated = engine(parts, max_slots=1, ret_gate=(1e-12, 2))
    s = gated.open_slot(Persona(text=PERSONA_TEXT), seed=1)
    rets = [gated.step({s: f})[s].is_ret for f in audio]
    # fires on frame 0 (forcing frame 1), then stays quiet for 2 frames, fires again...
    assert rets[1] and sum(rets) >= 2 and not all(rets)


def test_inject_contract(parts, caplog):
    eng = engine(parts, max_slots=1, max_reference_tokens=40)
    slot = eng.open_slot(Persona(text=PERSONA_TEXT), seed=1)
    assert eng.inject(slot, "   ") is False and eng.inject(slot, "") is False
    assert eng.inject(slot, "The weather is sunny. " * 30)
    assert eng.inject(slot, "Z\u00fcrich \u2603 \u201cquoted\u201d\tand\x00more")
    r = eng.step({slot: np.zeros(1920, np.float32)})[slot]
    capped, odd = r.spans
    assert capped.truncated and capped.n_frames <= 42 and capped.reference.endswith(".")
    assert not odd.truncated and odd.reference == 'Zürich ☃ "quoted" andmore'  # NFKC, quotes, no controls
    # the span's interior never carries a stream signal
    body = span_frames(eng.tokenizer.encode(odd.reference))[0].tolist()
    assert body[0] == SPAN_OPEN_ID and body[-1] == SPAN_CLOSE_ID
    assert not {0, 1, 2, 3, RET_ID, SPAN_OPEN_ID, SPAN_CLOSE_ID} & set(body[1:-1])

    # a span queued for a call that then ends is dropped, logged, and never lands in the next call
    assert eng.inject(slot, "(tool result) for the old call")
    with caplog.at_level(logging.WARNING):
        eng.close_slot(slot)
    assert "for the old call" in caplog.text
    new = eng.open_slot(Persona(text=PERSONA_TEXT), seed=1)
    assert eng.inject(slot, "(tool result) late answer for the old call") is False  # stale handle
    assert eng.step({new: np.zeros(1920, np.float32)})[new].spans == []
    eng.close_slot(new)
    assert eng.inject(0, "(tool result) nobody is listening") is False


def test_silence_codes_count_as_silent(parts):
    assert len(SILENCE_CODES) == 8
    eng = engine(parts, max_slots=1)
    slot = eng.open_slot(Persona(text=PERSONA_TEXT), seed=1)
    r = eng.step({slot: np.zeros(1920, np.float32)})[slot]
    rms = float(np.sqrt(np.mean(r.pcm**2)))
    assert r.silent == (r.agent_codes == SILENCE_CODES or rms < 10 ** (-50 / 20))
