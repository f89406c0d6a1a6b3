"""Span landing: how queued Context Spans, persona re-pins and forced `<ret>`s reach a slot between frames.

Each span (and a due persona re-pin) is written into the slot's streams as one prefill pass before the slot's
next step, so the model "reads" it without the 80 ms clock stopping. A forced `<ret>` is written as the text
the slot's next step reads and reports.

Example:
    >>> from duetaspan.model.generator import LMGenerator
    >>> from duetaspan.model.lm import LMModel
    >>> from duetaspan.model.lm_config import LMConfig
    >>> from duetaspan.model.span_landing import prefill, write_ret
    >>> from duetaspan.spans.block import span_frames
    >>> gen = LMGenerator(LMModel(LMConfig.preset("tiny-random")).eval(), batch_size=1, max_span=8)
    >>> _ = prefill(gen, 0, span_frames([100] * 10, 13), max_span=8)  # 12 frames: two passes of <= 8
    >>> gen.offset(0), write_ret(gen, 0)
    (12, True)
"""

from __future__ import annotations

import logging

import torch

from duetaspan.model.convention import RET_ID, TEXT_ROW
from duetaspan.model.generator import LMGenerator
from duetaspan.model.slots import SlotRecord
from duetaspan.spans.block import span_frames
from duetaspan.spans.events import SpanLanded
from duetaspan.spans.pending import SpanQueue

# The engine's log channel, where operators already look for landed spans.
log = logging.getLogger("duetaspan.model.engine")


def prefill(lm: LMGenerator, slot: int, frames: torch.Tensor, max_span: int) -> float:
    """Write forced frames into a slot (one pass per `max_span` frames); returns milliseconds. Only the last
    pass samples the post-block tokens (the earlier passes' would be overwritten), as one pass would."""
    total, n = 0.0, frames.shape[1]
    for start in range(0, n, max_span):
        total += lm.prefill(slot, frames[:, start : start + max_span], sample=start + max_span >= n).total_ms
    return total


def land_spans(
    lm: LMGenerator, spans: SpanQueue, slot: int, state: SlotRecord, span_close_id: int, max_span: int
) -> list[SpanLanded]:
    """Land a due persona re-pin and every queued span of this slot, before its step."""
    queued = spans.take(slot, state.generation)
    landed: list[SpanLanded] = []
    upcoming = sum(len(s.tokens) + 2 for s in queued)
    if state.pin is not None and state.pin_frames is not None:
        position = lm.offset(slot)
        if state.pin.due(position, upcoming):
            ms = prefill(lm, slot, state.pin_frames, max_span)
            state.pin.written(position)
            landed.append(
                SpanLanded("<persona>", state.pin_frames.shape[1], ms, state.frame_index, kind="persona")
            )
    for span in queued:
        block = span_frames(span.tokens, span_close_id)
        ms = prefill(lm, slot, block, max_span)
        landed.append(
            SpanLanded(
                span.reference, block.shape[1], ms, state.frame_index, truncated=span.truncated, span_id=span.span_id
            )
        )
        log.info("span landed in slot %d before frame %d: %d frames, %.1f ms", slot, state.frame_index,
                 block.shape[1], ms)  # fmt: skip
    state.landed.extend(landed)
    return landed


def write_ret(lm: LMGenerator, slot: int) -> bool:
    """Write `<ret>` as the text of the slot's next frame (its input and its reported token); False when the
    slot is still warming up, so the caller keeps the request for the next frame."""
    # The column at the slot's offset holds the text the next step reads and reports; during the warm-up
    # (offset <= max delay) it is masked to the initial token, so wait one frame.
    if lm.offset(slot) > lm.config.max_delay:
        lm.ring[slot, TEXT_ROW, lm.offset(slot) % lm.ring.shape[-1]] = RET_ID
        return True
    return False


def apply_forced_ret(
    lm: LMGenerator,
    forced: set[tuple[int, int]],
    generations: list[int],
    rows: list[bool],
    held: list[bool] | None = None,
) -> None:
    """Write `<ret>` as the text of the next frame of the forced (slot, generation)s stepping now (`rows`);
    a request stays in `forced` while its slot warms up or is `held` (at silence: it fires once released)."""
    for i, g in [(i, g) for i, g in forced if rows[i] and generations[i] == g and not (held and held[i])]:
        if write_ret(lm, i):
            forced.discard((i, g))
