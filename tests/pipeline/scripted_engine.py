"""A deterministic, dependency-free engine with the `DuplexEngine` contract, for clock and runner tests.

The clock tests measure the runner's timing, which must not depend on how fast the real model happens to be
on a shared 2-core machine; the pipeline tests use the real tiny-random engine. This engine speaks (a 220 Hz
tone) in a fixed on/off pattern, emits a word every few frames, samples `<ret>` when forced, lands injected
references as spans before the next step, and records every caller frame it was fed.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from duetaspan.model.convention import FRAME_SIZE, RET_ID, SAMPLE_RATE, TEXT_PAD_ID


@dataclass
class SpanLanded:
    reference: str
    n_frames: int
    prefill_ms: float
    frame_index: int
    kind: str = "reference"
    span_id: int | None = None


@dataclass
class FrameResult:
    slot: int
    frame_index: int
    pcm: np.ndarray
    text_token: int
    text: str
    is_ret: bool
    silent: bool
    spans: list[SpanLanded] = field(default_factory=list)
    step_ms: float = 0.0


class ScriptedEngine:
    sample_rate = SAMPLE_RATE
    frame_size = FRAME_SIZE

    def __init__(
        self,
        max_slots: int = 2,
        *,
        step_s: float = 0.0,
        speak: tuple[int, int] = (5, 5),
        word_every: int = 4,
        slow_steps: dict[int, float] | None = None,
        fail_at: int | None = None,
        fail_steps: set[int] | None = None,
        fail_from: int | None = None,
        error: str = "scripted step failure",
    ) -> None:
        self.max_slots = max_slots
        self.step_s = step_s
        self.speak = speak  # (frames speaking, frames silent), repeating
        self.word_every = word_every
        self.slow_steps = slow_steps or {}  # global step number -> seconds it takes
        self.fail_at = fail_at
        self.fail_steps = set(fail_steps or ()) | ({fail_at} if fail_at is not None else set())
        self.fail_from = fail_from  # every step from this one on raises (a broken device)
        self.error = error
        self.steps = 0
        self.fed: dict[int, list[np.ndarray]] = {}
        self._frame: dict[int, int] = {}
        self._forced: set[int] = set()
        self._spans: dict[int, list[tuple[str, int | None]]] = {}
        self._lock = threading.Lock()
        self.opened: list[int] = []
        self.closed: list[int] = []

    def open_slot(self, persona=None, sampling=None, seed=None) -> int:
        free = [s for s in range(self.max_slots) if s not in self._frame]
        if not free:
            raise RuntimeError("no free slot")
        slot = free[0]
        self._frame[slot] = 0
        self.fed[slot] = []
        self.opened.append(slot)
        return slot

    def close_slot(self, slot: int) -> None:
        self._frame.pop(slot, None)
        with self._lock:
            self._spans.pop(slot, None)
        self.closed.append(slot)

    def inject(self, slot: int, reference: str, span_id: int | None = None) -> bool:
        with self._lock:
            self._spans.setdefault(slot, []).append((reference, span_id))
        return True

    def force_ret(self, slot: int) -> None:
        with self._lock:
            self._forced.add(slot)

    def step(self, pcm: dict[int, np.ndarray]) -> dict[int, FrameResult]:
        started = time.perf_counter()
        self.steps += 1
        if self.steps in self.fail_steps or (self.fail_from is not None and self.steps >= self.fail_from):
            raise RuntimeError(self.error)
        delay = self.slow_steps.get(self.steps, self.step_s)
        if delay:
            time.sleep(delay)
        out = {}
        for slot, frame in pcm.items():
            assert frame.shape == (FRAME_SIZE,) and frame.dtype == np.float32
            self.fed[slot].append(frame.copy())
            i = self._frame[slot]
            with self._lock:
                refs = self._spans.pop(slot, [])
                is_ret = slot in self._forced
                self._forced.discard(slot)
            spans = [SpanLanded(r, 2 + len(r.split()), 1.0, i, span_id=sid) for r, sid in refs]
            i += sum(s.n_frames for s in spans)
            on, off = self.speak
            speaking = (i % (on + off)) < on
            n = np.arange(FRAME_SIZE) + i * FRAME_SIZE
            audio = (0.3 * np.sin(2 * np.pi * 220 * n / SAMPLE_RATE)).astype(np.float32)
            if not speaking:
                audio = (0.002 * np.sin(n * 0.7)).astype(np.float32)  # low "silent" noise, as Moshi's is
            word = speaking and i % self.word_every == 0
            out[slot] = FrameResult(
                slot=slot,
                frame_index=i,
                pcm=audio,
                text_token=RET_ID if is_ret else (100 if word else TEXT_PAD_ID),
                text=" hi" if word and not is_ret else "",
                is_ret=is_ret,
                silent=not speaking,
                spans=spans,
                step_ms=0.0,
            )
            self._frame[slot] = i + 1
        for r in out.values():
            r.step_ms = (time.perf_counter() - started) * 1000.0
        return out
