"""Bounded call opening: persona prefills written in chunks that fit the spare time between ticks.

A persona prompt (a voice prompt of a few seconds plus the persona text) is ~100 forced frames; on a 7B model
one pass costs about a tick. Written in one go between ticks, eight callers ringing together would hold up
every live call for most of a second. `OpeningQueue` instead keeps each opening call's frames and writes them
in chunks (`LMGenerator.prefill(..., sample=False)`, the last chunk sampling as one pass would), each chunk
sized from the measured cost per frame to what the current gap before the next tick leaves. Until its prompt
is written a new call takes no part in ticks: its caller hears a few frames of silence, the live calls nothing.
`start_persona` resolves a persona into those frames and the slot's pin.

Example:
    >>> import torch
    >>> from duetaspan.model.generator import LMGenerator
    >>> from duetaspan.model.lm import LMModel
    >>> from duetaspan.model.lm_config import LMConfig
    >>> from duetaspan.model.opening import OpeningQueue
    >>> gen = LMGenerator(LMModel(LMConfig.preset("tiny-random")).eval(), batch_size=1, max_span=16)
    >>> queue = OpeningQueue(gen, max_span=16, first_chunk=4)
    >>> queue.add(0, 1, torch.zeros(17, 10, dtype=torch.long))
    >>> [p.slot for p in queue.run(budget_ms=1e6)], gen.offset(0), queue.chunk_sizes
    ([0], 10, [4, 6])
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from duetaspan.errors import ConfigError
from duetaspan.model.convention import FRAME_SIZE, UNGENERATED_TOKEN_ID
from duetaspan.model.generator import LMGenerator
from duetaspan.model.persona import Persona, persona_prompt_text, prompt_frames
from duetaspan.model.slots import EngineError, FrameResult, SlotRecord
from duetaspan.spans.block import persona_text_frames
from duetaspan.spans.pinning import PersonaPin

__all__ = ["OpeningError", "OpeningQueue", "PendingPrefill", "start_persona", "waiting_result"]

PIN_LEAD_FRAMES = 8


class OpeningError(EngineError):
    """A queued persona prefill failed: its call (`slot`) cannot start; the others go on."""

    def __init__(self, slot: int, message: str) -> None:
        super().__init__(message)
        self.slot = slot


@dataclass
class PendingPrefill:
    """One opening call's persona frames [17, n] and how many of them are written."""

    slot: int
    generation: int
    frames: torch.Tensor
    done: int = 0
    ms: float = 0.0
    chunks: list[int] = field(default_factory=list)

    @property
    def total(self) -> int:
        return int(self.frames.shape[1])


class OpeningQueue:
    """Persona prefills waiting to be written, first come first served, in chunks that fit a time budget.

    Args:
        lm: the engine's generator.
        max_span: the longest single pass.
        first_chunk: the chunk written before any cost is measured.
        clock: seconds, monotonic (tests give their own).
        fill: the share of a budget the planned chunk may take (the cost model is a fit, not a promise).
    """

    def __init__(
        self,
        lm: LMGenerator,
        max_span: int,
        first_chunk: int = 4,
        clock: Callable[[], float] = time.perf_counter,
        fill: float = 0.8,
    ) -> None:
        self.lm = lm
        self.max_span = max_span
        self.first_chunk = max(1, min(first_chunk, max_span))
        self.clock = clock
        self.fill = fill
        self.window = 24
        self._samples: list[tuple[int, float]] = []  # (frames, ms) of recent chunks: the cost model
        self.chunk_sizes: list[int] = []  # every chunk written (figures, tests)
        self.overruns: list[float] = []  # per chunk: ms it ran past its gap's budget (negative: it fit)
        self._pending: dict[int, PendingPrefill] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, slot: int, generation: int, frames: torch.Tensor) -> None:
        self._pending[slot] = PendingPrefill(slot, generation, frames)

    def drop(self, slot: int) -> None:
        self._pending.pop(slot, None)

    def waiting(self, slot: int) -> bool:
        return slot in self._pending

    def plan(self, budget_ms: float) -> int:
        """Frames of the next chunk within `budget_ms` (0: nothing fits), from the fitted cost a + b * n."""
        if budget_ms <= 0:
            return 0
        if not self._samples:
            return self.first_chunk
        a, b = self.cost()
        room = budget_ms * self.fill
        # Never far past what was measured to fit: at most 1.5x (+1) the largest chunk that took no longer
        # than this room (the cost of big passes grows faster than the line fitted on small ones).
        fitted = [n for n, ms in self._samples if ms <= room]
        if not fitted:
            return 0
        return max(0, min(self.max_span, max(fitted) * 3 // 2 + 1, int((room - a) / b)))

    def cost(self) -> tuple[float, float]:
        """(overhead ms, ms per frame) of one chunk: a least-squares line through the recent chunks."""
        ns = np.array([n for n, _ in self._samples], dtype=np.float64)
        ms = np.array([m for _, m in self._samples], dtype=np.float64)
        if np.ptp(ns) > 0:
            b, a = np.polyfit(ns, ms, 1)
            if b > 0:
                return max(float(a), 0.0), float(b)
        # one size so far (or a noisy fit): half of the mean cost for overhead, half per frame
        return float(ms.mean() / 2), max(float(ms.mean() / (2 * ns.mean())), 1e-3)

    def run(self, budget_ms: float, at_least: int = 0) -> list[PendingPrefill]:
        """Write chunks for up to `budget_ms` of wall time (the first chunk at least `at_least` frames, so a
        queue that never gets room still moves); returns the prefills that finished."""
        deadline = self.clock() + budget_ms / 1e3
        finished: list[PendingPrefill] = []
        while self._pending:
            p = next(iter(self._pending.values()))
            n = min(max(self.plan((deadline - self.clock()) * 1e3), at_least), p.total - p.done)
            at_least = 0
            if n < 1:
                break
            last = p.done + n == p.total
            t0 = self.clock()
            try:
                self.lm.prefill(p.slot, p.frames[:, p.done : p.done + n], sample=last)
            except Exception as exc:
                del self._pending[p.slot]
                raise OpeningError(p.slot, f"persona prefill of slot {p.slot} failed: {exc}") from exc
            ms = (self.clock() - t0) * 1e3
            self._learn(n, ms)
            self.overruns.append(ms - (deadline - t0) * 1e3)
            p.done += n
            p.ms += ms
            p.chunks.append(n)
            self.chunk_sizes.append(n)
            if last:
                del self._pending[p.slot]
                finished.append(p)
        return finished

    def _learn(self, n: int, ms: float) -> None:
        self._samples.append((n, ms))
        del self._samples[: -self.window]


def start_persona(
    persona: Persona,
    state: SlotRecord,
    *,
    voice_codes: Callable[[Any], torch.Tensor],
    tokenizer: Any,
    context: int,
    pin_persona: bool,
    write: Callable[[torch.Tensor], float | None],
) -> None:
    """Resolve a persona into prompt frames and the slot's pin; `write(frames)` prefills them (returns the
    milliseconds) or queues them (returns None)."""
    voice = voice_codes(persona.voice) if persona.voice is not None else None
    prompt = persona_prompt_text(persona)
    tokens = tokenizer.encode(prompt) if prompt else []
    frames = prompt_frames(voice, tokens)
    if frames.shape[1] == 0:
        return
    state.prompt_frames = frames.shape[1]
    state.prompt_ms = write(frames) or 0.0
    if tokens and pin_persona:
        block = persona_text_frames(tokens)
        try:
            state.pin = PersonaPin(context, block.shape[1], lead=PIN_LEAD_FRAMES)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        state.pin_frames = block
        state.pin.written(0 if voice is None else voice.shape[1])


def waiting_result(slot: int, state: SlotRecord) -> FrameResult:
    """The frame of a call whose persona is still being written: silence, no token, nothing landed."""
    return FrameResult(
        slot=slot, frame_index=state.frame_index, pcm=np.zeros(FRAME_SIZE, np.float32),
        text_token=UNGENERATED_TOKEN_ID, text="", is_ret=False, silent=True, spans=[], step_ms=0.0,
        waiting=True,
    )  # fmt: skip
