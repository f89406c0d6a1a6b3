"""Engine-clock figures kept as plain numbers, cheap enough to update on every 80 ms tick: fixed-bucket
histograms of the step time and of the clock's lateness, and counters of skipped ticks, concealed caller
frames and failed steps.

No Prometheus here: the engine thread (or the engine process) only adds to lists of ints; `/metrics` reads a
`snapshot()` when it is scraped. An engine process sends its snapshot to the server over its channel, so the
server reports the child's ticks as its own.

Example:
    >>> timing = TickTiming()
    >>> timing.observe(step_s=0.031, lateness_s=0.002, concealed=1)
    >>> snap = timing.snapshot()
    >>> snap["ticks"], snap["concealed"], snap["step"]["count"]
    (1, 1, 1)
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

# Bucket upper bounds in seconds. An 80 ms tick: the step must stay well under 80 ms, lateness near zero.
STEP_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.1, 0.15, 0.25, 0.5)  # fmt: skip
LATENESS_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64)


@dataclass
class BucketCounts:
    """A histogram with fixed upper bounds (Prometheus `le` semantics: a value equal to a bound counts in it).

    `counts[i]` is the number of values in bucket i (not cumulative); the last entry is the `+Inf` bucket.
    """

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def snapshot(self) -> dict[str, Any]:
        counts = list(self.counts)  # one copy, so that count == the +Inf bucket even mid-update
        return {"bounds": list(self.bounds), "counts": counts, "sum": self.total, "count": sum(counts)}


@dataclass
class TickTiming:
    """What one engine clock has done since it started (owned by `ClockStats`, written by the engine thread)."""

    step: BucketCounts = field(default_factory=lambda: BucketCounts(STEP_BUCKETS))
    lateness: BucketCounts = field(default_factory=lambda: BucketCounts(LATENESS_BUCKETS))
    ticks: int = 0
    skipped: int = 0
    concealed: int = 0
    step_errors: int = 0

    def observe(self, step_s: float, lateness_s: float, concealed: int) -> None:
        """One tick that stepped the engine: its duration, how late it started, how many slots got silence."""
        self.ticks += 1
        self.step.observe(step_s)
        self.lateness.observe(max(0.0, lateness_s))
        self.concealed += concealed

    def snapshot(self) -> dict[str, Any]:
        """Plain, picklable figures (what an engine process sends to the server)."""
        return {
            "ticks": self.ticks,
            "skipped": self.skipped,
            "concealed": self.concealed,
            "step_errors": self.step_errors,
            "step": self.step.snapshot(),
            "lateness": self.lateness.snapshot(),
        }


def empty_snapshot() -> dict[str, Any]:
    """The snapshot of a clock that has not ticked (an engine process before its first report)."""
    return TickTiming().snapshot()
