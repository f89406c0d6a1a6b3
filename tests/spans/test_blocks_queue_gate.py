"""Span blocks, the generation-keyed span queue and the `<ret>` gate."""

from __future__ import annotations

import logging
import threading

import pytest

from duetaspan.model.convention import (
    PROMPT_SILENCE_FRAMES,
    SILENCE_CODES,
    SINE_CODES,
    SPAN_CLOSE_ID,
    SPAN_OPEN_ID,
    TEXT_PAD_ID,
)
from duetaspan.spans import QueuedSpan, RetGate, SpanQueue, persona_text_frames, span_frames


def test_span_block_layout():
    block = span_frames([100, 101, 102])
    assert block.shape == (17, 5)
    assert block[0].tolist() == [SPAN_OPEN_ID, 100, 101, 102, SPAN_CLOSE_ID]
    for j in range(5):
        assert tuple(block[1:9, j].tolist()) == SILENCE_CODES
        assert tuple(block[9:17, j].tolist()) == SINE_CODES
    assert span_frames([7], close_id=12)[0].tolist() == [12, 7, 12]  # checkpoints before 2026-09-08


def test_persona_text_block_layout():
    block = persona_text_frames([50, 51])
    pad = [TEXT_PAD_ID] * PROMPT_SILENCE_FRAMES
    assert block[0].tolist() == [*pad, 50, 51, *pad]
    assert tuple(block[1:9, 0].tolist()) == SILENCE_CODES and tuple(block[9:, -1].tolist()) == SINE_CODES


def test_queue_drops_other_generations(caplog):
    q = SpanQueue()
    q.put(QueuedSpan(0, 1, "old call", (5,)))
    q.put(QueuedSpan(0, 2, "new call", (6,)))
    q.put(QueuedSpan(1, 1, "other slot", (7,)))
    with caplog.at_level(logging.WARNING):
        taken = q.take(0, generation=2)
    assert [s.reference for s in taken] == ["new call"] and "old call" in caplog.text
    assert q.pending(1) == 1 and q.drop_slot(1) == 1 and q.pending(1) == 0


def test_queue_is_thread_safe():
    q = SpanQueue()

    def producer(k: int) -> None:
        for i in range(200):
            q.put(QueuedSpan(k % 2, 1, f"{k}-{i}", (1,)))

    threads = [threading.Thread(target=producer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(q.take(0, 1)) + len(q.take(1, 1)) == 800


def test_gate_threshold_and_refractory():
    gate = RetGate(threshold=0.5, refractory_frames=2)
    fired = [gate.update(p) for p in (0.1, 0.6, 0.9, 0.9, 0.7, 0.2)]
    assert fired == [False, True, False, False, True, False]
    gate.reset()
    assert gate.update(0.0, sampled=True) is False  # the model asked itself: quiet period starts
    assert gate.update(0.99) is False
    with pytest.raises(ValueError):
        RetGate(threshold=0.0)
