"""The generator's per-slot sampling: each slot's settings, RNG and noise draws, and the sampling of one step.

`SlotSampling` holds, for B slots, the `SamplingParams`, one `torch.Generator` each, and the settings derived
from them as device tensors (softmax divisor, effective top-k, temperature > 0, `<ret>` allowed). Those
tensors are written in place, so a CUDA graph captured once sees a later `set`. `SamplingShape` is what the
settings of a range of slots fix in a step's shapes and branches: the key of a captured graph.

Example:
    >>> import torch
    >>> from duetaspan.model.sampling import SamplingParams
    >>> from duetaspan.model.slot_sampling import SlotSampling
    >>> s = SlotSampling(2, text_vocab=8, card=4, gen_q=2, device=torch.device("cpu"))
    >>> s.set(0, SamplingParams.greedy()); s.set(1, SamplingParams(seed=1))
    >>> s.shape(0, 2).text_mode, s.noise_width   # mixed greedy / sampling; 8 + 2 * 4 draws per slot
    (2, 16)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from duetaspan.model.convention import RET_ID
from duetaspan.model.sampling import SamplingParams, race
from duetaspan.model.transformer import may_cache


@dataclass(frozen=True)
class SamplingShape:
    """What the sampling settings of a range of slots fix in a step: top-k widths and which branches run.

    A step's tensor shapes and ops depend only on this (never on a device value), so one CUDA graph per value
    serves every tick. `*_mode` is 0 when every slot is greedy on that stream, 1 when every slot samples, 2
    when mixed; `*_masked` says some slot's top-k is narrower than the width.
    """

    text_k: int
    audio_k: int
    text_mode: int
    audio_mode: int
    text_masked: bool
    audio_masked: bool


class SlotSampling:
    """Sampling settings, generators and derived device tensors of B slots (see the module docstring).

    Slot indices are trusted here: the generator checks them.
    """

    def __init__(self, batch_size: int, text_vocab: int, card: int, gen_q: int, device: torch.device) -> None:
        self.text_vocab = text_vocab
        self.card = card
        self.gen_q = gen_q
        dev = device
        # Derived once in `set` (in place, so captured graphs see new values): the softmax divisor
        # (temperature, 1 when greedy), the effective top-k, and temperature > 0.
        self._text_scale = torch.ones(batch_size, 1, device=dev)
        self._text_k = torch.zeros(batch_size, 1, dtype=torch.long, device=dev)
        self._text_on = torch.zeros(batch_size, dtype=torch.bool, device=dev)
        self._ret_off = torch.zeros(batch_size, dtype=torch.bool, device=dev)
        self._audio_scale = torch.ones(batch_size, 1, device=dev)
        self._audio_k = torch.zeros(batch_size, 1, dtype=torch.long, device=dev)
        self._audio_on = torch.zeros(batch_size, dtype=torch.bool, device=dev)
        self._shapes: dict[tuple[int, int], SamplingShape] = {}
        self._ranks: dict[int, torch.Tensor] = {}  # arange(k) per top-k width
        self.params: list[SamplingParams] = [SamplingParams() for _ in range(batch_size)]
        # The meta device (shape checks) has no generators; its draws hold no values anyway.
        self._rngs: list[torch.Generator | None] = [
            None if dev.type == "meta" else torch.Generator(device=dev) for _ in range(batch_size)
        ]

    def set(self, slot: int, params: SamplingParams) -> None:
        """Set a slot's temperatures/top-k and reseed its generator with `params.seed`."""
        self.params[slot] = params
        for temp, top_k, vocab, scale, k, on in (
            (params.text_temperature, params.text_top_k, self.text_vocab, self._text_scale, self._text_k,
             self._text_on),
            (params.audio_temperature, params.audio_top_k, self.card, self._audio_scale, self._audio_k,
             self._audio_on),
        ):  # fmt: skip
            scale[slot] = temp if temp > 0 else 1.0  # stored in float32, as `sample_tokens` divides
            k[slot] = top_k if 0 < top_k < vocab else vocab
            on[slot] = temp > 0
        self._ret_off[slot] = not params.allow_ret
        self._shapes.clear()
        self.reseed(slot)

    def reseed(self, slot: int) -> None:
        """Restart the slot's generator from its settings' seed (a new call on the slot)."""
        rng = self._rngs[slot]
        if rng is not None:
            rng.manual_seed(self.params[slot].seed)

    @property
    def noise_width(self) -> int:
        """Exp(1) draws per slot and step: the text vocabulary, then `card` per agent codebook."""
        return self.text_vocab + self.gen_q * self.card

    def shape(self, lo: int, hi: int) -> SamplingShape:
        """The `SamplingShape` of slots [lo, hi) (cached until a `set`)."""
        shape = self._shapes.get((lo, hi))
        if shape is None:
            shape = self._shapes[(lo, hi)] = self._compute_shape(self.params[lo:hi])
        return shape

    def _compute_shape(self, params: Sequence[SamplingParams]) -> SamplingShape:
        parts = []
        for temps, top_ks, vocab in (
            ([p.text_temperature for p in params], [p.text_top_k for p in params], self.text_vocab),
            ([p.audio_temperature for p in params], [p.audio_top_k for p in params], self.card),
        ):
            k_max = min(max(k or vocab for k in top_ks), vocab)
            mode = 0 if not any(t > 0 for t in temps) else 1 if all(t > 0 for t in temps) else 2
            masked = any((k if 0 < k < vocab else vocab) < k_max for k in top_ks)
            parts.append((k_max, mode, masked))
        (tk, tm, tmask), (ak, am, amask) = parts
        return SamplingShape(tk, ak, tm, am, tmask, amask)

    def draw_noise(self, rows: Sequence[bool], out: torch.Tensor, start: int = 0) -> bool:
        """Fill `out` [len(rows), noise_width] for slots `start + i`: Exp(1) draws from the generator of each
        executing, non-greedy slot, ones elsewhere. Returns False (and leaves `out` alone) when no slot draws.

        A slot's generator is used only when it executes, so its tokens never depend on the other calls.
        """
        draw = [run and not self.params[start + i].is_greedy for i, run in enumerate(rows)]
        if not any(draw):
            return False
        if not all(draw):
            out.fill_(1.0)
        for i, d in enumerate(draw):
            if d:
                out[i].exponential_(generator=self._rngs[start + i])
        return True

    def _ranks_below(self, k_max: int, k: torch.Tensor) -> torch.Tensor:
        ranks = self._ranks.get(k_max)
        if ranks is None or ranks.device != k.device:
            ranks = torch.arange(k_max, device=k.device)[None, :]
            if may_cache(k.device):
                self._ranks[k_max] = ranks
        return ranks < k

    def sample(
        self,
        logits: torch.Tensor,
        probs: torch.Tensor | None,
        noise: torch.Tensor | None,
        lo: int,
        hi: int,
        text: bool,
        shape: SamplingShape,
    ) -> torch.Tensor:
        """`sample_tokens` with the slots' derived settings, skipping branches the shape rules out (the same
        arithmetic, bit for bit)."""
        mode = shape.text_mode if text else shape.audio_mode
        if noise is None or mode == 0:
            return logits.argmax(dim=-1)
        if probs is None:
            scale = (self._text_scale if text else self._audio_scale)[lo:hi]
            probs = torch.softmax(logits / scale, dim=-1)
        k_max = min(max(shape.text_k if text else shape.audio_k, 1), logits.shape[-1])
        masked = shape.text_masked if text else shape.audio_masked
        in_top = (
            self._ranks_below(k_max, (self._text_k if text else self._audio_k)[lo:hi]) if masked else None
        )
        sampled = race(probs, noise, k_max, in_top)
        if mode == 1:
            return sampled
        on = (self._text_on if text else self._audio_on)[lo:hi]
        return torch.where(on, sampled, logits.argmax(dim=-1))

    def sample_text(
        self, logits: torch.Tensor, lo: int, hi: int, noise: torch.Tensor | None, shape: SamplingShape
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The text token of slots [lo, hi) and the probability it was `<ret>` (`noise`: the full-width row)."""
        logits = logits.float()
        # One softmax serves the sample and the reported P(<ret>) (same temperature, same arithmetic).
        probs = torch.softmax(logits / self._text_scale[lo:hi], dim=-1)
        ret_prob = probs[:, RET_ID].clone()
        # Slots with `allow_ret=False` cannot draw `<ret>` (greedy or sampled); where the flag is off the
        # values are untouched, so results stay bit-identical. No host sync: a graph-safe `where`.
        off = self._ret_off[lo:hi]
        logits[:, RET_ID] = torch.where(off, torch.full_like(ret_prob, float("-inf")), logits[:, RET_ID])
        probs[:, RET_ID] = torch.where(off, torch.zeros_like(ret_prob), ret_prob)
        seg = None if noise is None else noise[:, : logits.shape[-1]]
        return self.sample(logits, probs, seg, lo, hi, True, shape), ret_prob
