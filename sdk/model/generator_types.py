"""What `LMGenerator` hands out: one generated step (`LMStep`), a prefill's figures, a copy of a slot's state,
and its error type.

Example:
    >>> from duetaspan.model.generator_types import PrefillStats
    >>> PrefillStats(frames=5, offset=6, forward_ms=1.0, total_ms=1.5).frames
    5
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from duetaspan.errors import DuetaspanError

__all__ = ["GeneratorError", "LMStep", "PrefillStats", "SlotState"]


class GeneratorError(DuetaspanError, ValueError):
    """A generator call with an invalid slot, shape or span length."""


@dataclass
class LMStep:
    """One generated, time-aligned frame per slot.

    `text` [B] and `agent_codes` [B, 8] are -2 for slots still warming up or not executing this tick;
    `ret_prob` [B] is the probability (at the slot's text temperature, or 1 when greedy) with which `text`
    was `<ret>` when it was sampled (0 for forced or warming-up frames).
    """

    text: torch.Tensor
    agent_codes: torch.Tensor
    ret_prob: torch.Tensor


@dataclass
class PrefillStats:
    """What one `prefill` did: frames written, the slot's offset afterwards, and its cost."""

    frames: int
    offset: int
    forward_ms: float
    total_ms: float


@dataclass
class SlotState:
    """A copy of one slot's generator state (for tests and debugging)."""

    offset: int
    token_ring: torch.Tensor
    kv: torch.Tensor
    positions: torch.Tensor
    ret_prob: float
