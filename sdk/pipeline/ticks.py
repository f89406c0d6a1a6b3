"""What the engine runner and every engine host share: the tick a call receives, per-call and clock figures,
the caller-frame check, and the admission errors.

Kept apart from `duetaspan.pipeline.runner` so that hosts (`thread_host`, `process_host`, the engine process's
child side) can use these types without importing the runner that drives them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from duetaspan.errors import DuetaspanError
from duetaspan.model.convention import FRAME_MS, FRAME_SIZE
from duetaspan.observability.timing import TickTiming


class EngineFull(DuetaspanError):
    """Every slot of the engine is taken: refuse the call (admission control) or add capacity."""


class RunnerStopped(DuetaspanError):
    """The engine runner is not running (never started, or stopped); start it before attaching calls."""


class EngineFailed(RunnerStopped):
    """The engine went down under its calls (steps kept failing, a fatal device error, its process died):
    every call on it is over. `ends_call` tells services to hang up; `crashed` is False for a plain stop."""

    ends_call = True

    def __init__(self, message: str, *, crashed: bool = True) -> None:
        super().__init__(message)
        self.crashed = crashed

    def __reduce__(self) -> tuple:  # keeps `crashed` across the engine process's socket
        return (_rebuild, (type(self), str(self), self.crashed))


def _rebuild(cls: type[EngineFailed], message: str, crashed: bool) -> EngineFailed:
    return cls(message, crashed=crashed)


class StepEngine(Protocol):
    """What the in-thread host needs from `duetaspan.model.engine.DuplexEngine`."""

    max_slots: int

    def open_slot(self, persona: Any = None, sampling: Any = None, seed: int | None = None) -> int: ...
    def close_slot(self, slot: int) -> None: ...
    def step(self, pcm: dict[int, np.ndarray]) -> dict[int, Any]: ...
    def inject(self, slot: int, reference: str, span_id: int | None = None) -> bool: ...
    def force_ret(self, slot: int) -> None: ...


@dataclass
class TickOutput:
    """One engine step for one call: the agent's frame and the caller frame the model heard with it."""

    result: Any  # duetaspan.model.engine.FrameResult
    caller_pcm: np.ndarray  # float32[1920], exactly what the model was fed this tick
    call_frame: int  # 0-based frame count of this call; call time is call_frame * 80 ms
    concealed: bool  # the caller's audio had not arrived: the model heard silence
    lateness_ms: float  # how far after its deadline this tick started
    # the caller stream frame the model heard (0-based, its time = n * 80 ms; None: concealed, or unknown):
    # differs from `call_frame` once frames were concealed or dropped (the recording maps caller times with it)
    caller_frame: int | None = None

    @property
    def t(self) -> float:
        """Call time of the START of this frame, in seconds."""
        return self.call_frame * FRAME_MS / 1000.0


@dataclass
class SlotStats:
    """Input-queue figures of one call."""

    frames_in: int = 0
    frames_used: int = 0
    concealed: int = 0  # ticks fed with silence because no caller audio was queued
    dropped: int = 0  # caller frames dropped because the backlog exceeded its bound
    max_backlog: int = 0


@dataclass
class ClockStats:
    """Timing of the engine clock. Lateness = tick start minus its deadline on the `t0 + k*80ms` grid."""

    ticks: int = 0
    skipped_ticks: int = 0
    late_ticks: int = 0  # ticks starting more than half a frame late
    last_lateness_ms: float = 0.0
    max_lateness_ms: float = 0.0
    last_step_ms: float = 0.0
    recent_lateness_ms: deque[float] = field(default_factory=lambda: deque(maxlen=2000))
    timing: TickTiming = field(default_factory=TickTiming)  # histograms and counters for /metrics

    def drift_ms(self) -> float:
        """Where the clock stands against its grid now (bounded; it does not grow with time)."""
        return self.last_lateness_ms

    def summary(self) -> dict[str, float]:
        lat = np.asarray(self.recent_lateness_ms, dtype=np.float64)
        pct = (lambda q: float(np.percentile(lat, q))) if lat.size else (lambda q: 0.0)
        return {
            "ticks": self.ticks,
            "skipped_ticks": self.skipped_ticks,
            "late_ticks": self.late_ticks,
            "drift_ms": round(self.last_lateness_ms, 3),
            "lateness_p50_ms": round(pct(50), 3),
            "lateness_p99_ms": round(pct(99), 3),
            "lateness_max_ms": round(self.max_lateness_ms, 3),
        }


def check_caller_frame(pcm: np.ndarray) -> None:
    """Refuse anything but one 80 ms caller frame (float32[1920] at 24 kHz)."""
    if pcm.shape != (FRAME_SIZE,):
        raise ValueError(f"caller frames must be float32[{FRAME_SIZE}], got shape {pcm.shape}")


def engine_full(name: str, max_calls: int) -> EngineFull:
    """The admission refusal the runner raises when every slot is taken."""
    return EngineFull(f"{name}: all {max_calls} call slots are busy; refuse the call or add an engine")
