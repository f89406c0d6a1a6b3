"""The batched streaming front of Mimi (`MimiStream`): per-slot encoder and decoder state, 80 ms at a time.

One stream serves B call slots over a shared `MimiModel`; slot masks decide whose state advances, so a slot
reset or an idle slot never disturbs the others.

Example:
    >>> import torch
    >>> from duetaspan.model.mimi import MimiStream, random_mimi
    >>> stream = MimiStream(random_mimi("tiny"), batch_size=2)
    >>> stream.decode(stream.encode(torch.zeros(2, 1, 1920))).shape
    torch.Size([2, 1, 1920])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from duetaspan.errors import AudioFormatError
from duetaspan.model.mimi.codec import MimiModel, as_batch, check_codes


class MimiStream:
    """Streaming Mimi for B call slots: `encode` caller audio and `decode` agent codes, 80 ms frames at a time.

    Every slot has its own conv and transformer state; `reset(slot)` starts one slot afresh without touching the
    others, and slots marked inactive (`active` mask, or the `active=` argument of a call) keep their state
    bit-identical while the batch is computed. Encoder and decoder states are independent. Compute runs under
    `torch.inference_mode`; outputs are float32 audio and int64 codes on the model's device. A stream is not
    thread-safe (drive it from the engine's compute thread); several streams may share one model.

    Example:
        >>> import torch
        >>> from duetaspan.model.mimi import random_mimi
        >>> stream = MimiStream(random_mimi("tiny"), batch_size=3)
        >>> stream.active = torch.tensor([True, False, True])   # slot 1 is idle this tick
        >>> stream.encode(torch.zeros(3, 1, 2 * 1920)).shape
        torch.Size([3, 8, 2])
    """

    def __init__(self, model: MimiModel, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.batch_size = batch_size
        with torch.inference_mode():
            self._enc = model.init_encoder_state(batch_size)
            self._dec = model.init_decoder_state(batch_size)
            self._active = torch.ones(batch_size, dtype=torch.bool, device=model.device)
        self._all_active = True
        self._mask_cache: dict[tuple[bool, ...], Tensor] = {}

    @property
    def frame_size(self) -> int:
        return self.model.frame_size

    @property
    def active(self) -> Tensor:
        """[B] bool: slots whose state advances on `encode`/`decode` (default: all)."""
        return self._active

    @active.setter
    def active(self, mask: Tensor | Sequence[bool]) -> None:
        with torch.inference_mode():
            self._active = self._mask(mask)
        # A host-side flag, so the all-active fast path needs no device sync.
        self._all_active = not isinstance(mask, Tensor) and all(bool(v) for v in mask)

    def _mask(self, slots: int | Sequence[int] | Sequence[bool] | Tensor | None) -> Tensor:
        B, device = self.batch_size, self.model.device
        if slots is None:
            return torch.ones(B, dtype=torch.bool, device=device)
        if isinstance(slots, int | np.integer) and not isinstance(slots, bool):
            if not 0 <= slots < B:
                raise IndexError(f"slot {slots} out of range for batch_size {B}")
            return torch.arange(B, device=device) == int(slots)
        if isinstance(slots, Tensor) and slots.dtype == torch.bool:
            if slots.shape != (B,):
                raise ValueError(f"slot mask must have shape ({B},), got {tuple(slots.shape)}")
            return slots.to(device)
        values = list(slots.tolist() if isinstance(slots, Tensor) else slots)
        if values and all(isinstance(v, bool | np.bool_) for v in values):
            if len(values) != B:
                raise ValueError(f"slot mask must have {B} entries, got {len(values)}")
            key = tuple(bool(v) for v in values)
            # Masks recur tick after tick; reusing the device copy avoids a blocking host-to-device copy per frame.
            cached = self._mask_cache.get(key)
            if cached is None:
                if len(self._mask_cache) >= 256:
                    self._mask_cache.clear()
                cached = self._mask_cache[key] = torch.tensor(key, dtype=torch.bool, device=device)
            return cached
        mask = torch.zeros(B, dtype=torch.bool)
        for v in values:
            if not 0 <= int(v) < B:
                raise IndexError(f"slot {v} out of range for batch_size {B}")
            mask[int(v)] = True
        return mask.to(device)

    def _call_active(self, active: Tensor | Sequence[bool] | None) -> Tensor | None:
        if active is not None:
            return self._mask(active)
        return None if self._all_active else self._active

    def encode(self, pcm: Tensor, active: Tensor | Sequence[bool] | None = None) -> Tensor:
        """[B, 1, 1920*k] float audio (24 kHz, [-1, 1]) -> [B, num_codebooks, k] int64 codes."""
        pcm = as_batch(pcm)
        if pcm.shape[0] != self.batch_size:
            raise AudioFormatError(f"expected {self.batch_size} slots, got audio of shape {tuple(pcm.shape)}")
        n = pcm.shape[-1]
        if n == 0 or n % self.frame_size:
            raise AudioFormatError(
                f"streaming encode needs a positive multiple of {self.frame_size} samples (80 ms), got {n}; "
                "buffer the audio into whole frames first"
            )
        with torch.inference_mode():
            pcm = pcm.to(self.model.device)
            return self.model.encode(pcm, self._enc, self._call_active(active))

    def decode(self, codes: Tensor, active: Tensor | Sequence[bool] | None = None) -> Tensor:
        """[B, K, k] int codes in [0, 2048) (any K from 1 to the 32 codebooks) -> [B, 1, 1920*k] float32 audio."""
        with torch.inference_mode():
            q = self.model.config.quantizer
            codes = check_codes(codes, self.batch_size, q.bins, self.model.device, q.n_q)
            return self.model.decode(codes, self._dec, self._call_active(active)).float()

    def reset(
        self,
        slots: int | Sequence[int] | Sequence[bool] | Tensor | None = None,
        *,
        encoder: bool = True,
        decoder: bool = True,
    ) -> None:
        """Start the given slots (index, indices, or [B] bool mask; None = all) afresh, others untouched."""
        with torch.inference_mode():
            mask = self._mask(slots)
            if encoder:
                self._enc.reset(mask)
            if decoder:
                self._dec.reset(mask)
