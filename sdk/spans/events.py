"""`<ret>` events, landed-span records and the optional probability gate for `<ret>`.

Example:
    >>> gate = RetGate(threshold=0.3, refractory_frames=25)
    >>> [gate.update(p) for p in (0.1, 0.5, 0.6)]
    [False, True, False]
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RetEvent:
    """The model asked for a Context Span: slot, the frame index it sampled `<ret>` at, and wall time."""

    slot: int
    frame_index: int
    time: float
    forced: bool = False  # set by `force_ret` or the gate rather than sampled


@dataclass(frozen=True)
class SpanLanded:
    """A span written into a slot's streams before the step of `frame_index`, in one prefill pass."""

    reference: str
    n_frames: int
    prefill_ms: float
    frame_index: int
    kind: str = "reference"  # "reference" or "persona" (a pinned persona re-injection)
    truncated: bool = False
    # the id its `inject` was given: what the landed span is matched by (the text itself is normalised and
    # capped on the way in, so it need not equal what was delivered)
    span_id: int | None = None


@dataclass
class RetGate:
    """Emit `<ret>` when P(`<ret>`) reaches `threshold`, then stay quiet for `refractory_frames` frames.

    Off by default in the engine: the model's own sampled `<ret>` is the trained behaviour; the gate is for
    checkpoints or temperatures that sample it too rarely.
    """

    threshold: float
    refractory_frames: int = 25
    _quiet: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.refractory_frames < 0:
            raise ValueError("refractory_frames must be >= 0")

    def update(self, ret_prob: float, sampled: bool = False) -> bool:
        """Feed one frame; True when the gate fires (the engine then forces `<ret>` on the slot's next frame).

        A `<ret>` the model sampled itself (`sampled`) starts the refractory period without firing again.
        """
        if sampled:
            self._quiet = self.refractory_frames
            return False
        if self._quiet > 0:
            self._quiet -= 1
            return False
        if ret_prob >= self.threshold:
            self._quiet = self.refractory_frames
            return True
        return False

    def reset(self) -> None:
        self._quiet = 0
