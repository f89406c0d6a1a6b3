"""Persona pinning: on a small attention window, the persona text stays in view for the whole call."""

from __future__ import annotations

import pytest
import torch

from duetaspan.model.engine import Persona
from duetaspan.spans.pinning import PersonaPin
from tests.model.engine_support import GREEDY, caller_audio, engine, tiny_parts

CONTEXT = 48


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return tiny_parts(tmp_path_factory.mktemp("tok"), context=CONTEXT)


def test_pin_schedule_math():
    pin = PersonaPin(context=100, block_frames=20, lead=10)
    pin.written(5)
    assert not pin.due(74) and pin.due(75)
    assert pin.due(40, upcoming=40)  # a long span landing first would push the persona out
    assert pin.in_view(25) and pin.in_view(104) and not pin.in_view(105)
    with pytest.raises(ValueError, match="shorten the persona"):
        PersonaPin(context=30, block_frames=25, lead=8)


def _visible_positions(eng, slot) -> set[int]:
    """Absolute positions whose keys are in the slot's KV ring and inside the attention window."""
    state = eng.lm.slot_state(slot)
    now = state.offset
    return {int(p) for p in state.positions.reshape(-1).tolist() if p >= 0 and now - p < CONTEXT}


@pytest.mark.parametrize("pinned", [True, False])
def test_persona_stays_in_view_on_a_small_context(parts, pinned):
    eng = engine(parts, max_slots=1, max_span=32, pin_persona=pinned)
    slot = eng.open_slot(Persona(text="You are Ada."), sampling=GREEDY, seed=1)
    n_block = eng.prompt_stats(slot)[0]
    copies = [0]  # start positions of every copy of the persona text block
    lost_at = None
    for i, frame in enumerate(caller_audio(40)):
        if i % 3 == 1:
            eng.inject(slot, "(tool result) it is sunny.")  # spans use up the window too (and save steps)
        before = eng.lm.offset(slot)
        r = eng.step({slot: frame})[slot]
        # a pinned re-injection lands before any reference span of the same tick
        copies += [before for s in r.spans if s.kind == "persona"]
        assert all(s.kind == "reference" for s in r.spans[1:])
        visible = _visible_positions(eng, slot)
        if not any(set(range(c, c + n_block)) <= visible for c in copies):
            lost_at = eng.lm.offset(slot)
            break
    if pinned:
        assert lost_at is None, f"persona text left the window at position {lost_at}"
        assert len(copies) >= 3
        assert eng.lm.offset(slot) > 3 * CONTEXT
    else:
        assert lost_at is not None and lost_at <= CONTEXT + n_block  # upstream behaviour: the persona is gone
        assert copies == [0]


def test_pinned_copy_is_the_persona_text(parts):
    # the re-injected block writes exactly the prompt's text section: same tokens on the text row
    eng = engine(parts, max_slots=1, max_span=32)
    slot = eng.open_slot(Persona(text="You are Ada."), sampling=GREEDY, seed=1)
    state = eng._slots[int(slot)]
    expected = eng.tokenizer.encode("<system> You are Ada. <system>")
    assert state.pin_frames is not None
    assert [t for t in state.pin_frames[0].tolist() if t != 3] == expected
    assert torch.equal(state.pin_frames[1:], state.pin_frames[1:, :1].expand_as(state.pin_frames[1:]))
