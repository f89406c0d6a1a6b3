"""Per-slot token sampling: temperature + top-k, greedy at temperature 0, host-sync free.

Every slot of a batch has its own temperatures, top-k and `torch.Generator`, so a call's tokens do not depend
on which other calls share the batch. Randomness enters as exponential noise drawn from the slot's generator
(one draw per step); a token is `argmax(p / noise)` over the top-k probabilities (the "exponential race",
an exact sample of the renormalised top-k distribution without a host sync).

Example:
    >>> import torch
    >>> from duetaspan.model.sampling import SamplingParams, sample_tokens
    >>> logits = torch.tensor([[0.0, 3.0, 1.0]])
    >>> int(sample_tokens(logits, torch.zeros(1), torch.zeros(1, dtype=torch.long), 3, None)[0])
    1
    >>> SamplingParams(text_temperature=0).text_temperature
    0.0
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field


class SamplingParams(BaseModel):
    """Sampling for one slot. Temperature 0 means greedy; top-k 0 means the whole vocabulary."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    audio_temperature: float = Field(0.8, ge=0.0)
    audio_top_k: int = Field(250, ge=0)
    text_temperature: float = Field(0.7, ge=0.0)
    text_top_k: int = Field(25, ge=0)
    seed: int = 0
    # False: the slot never samples `<ret>` itself (P(<ret>) is still reported, and `force_ret` or the gate
    # still work): for scripted demos and tests that decide when the model asks, and for deployments without
    # a router, where a spontaneous `<ret>` could only end in no span.
    allow_ret: bool = True

    @classmethod
    def greedy(cls, seed: int = 0) -> SamplingParams:
        return cls(audio_temperature=0.0, text_temperature=0.0, seed=seed)

    @property
    def is_greedy(self) -> bool:
        return self.audio_temperature == 0.0 and self.text_temperature == 0.0


def sample_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    k_max: int,
    noise: torch.Tensor | None,
) -> torch.Tensor:
    """Sample one token per row of `logits` [B, V].

    `temperature` [B] (0: greedy), `top_k` [B] (0: whole vocabulary), `k_max` a host int >= every row's k
    (it fixes the shape of the top-k so nothing syncs), `noise` [B, V] Exp(1) draws or None (all greedy).
    """
    logits = logits.float()
    greedy = logits.argmax(dim=-1)
    if noise is None:
        return greedy
    V = logits.shape[-1]
    k_max = min(max(k_max, 1), V)
    temp = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).float()
    probs = torch.softmax(logits / temp[:, None], dim=-1)
    k = torch.where((top_k > 0) & (top_k < V), top_k, torch.full_like(top_k, V)).clamp(max=k_max)
    in_top = torch.arange(k_max, device=logits.device)[None, :] < k[:, None]
    sampled = race(probs, noise, k_max, in_top)
    return torch.where(temperature > 0, sampled, greedy)


def race(probs: torch.Tensor, noise: torch.Tensor, k_max: int, in_top: torch.Tensor | None) -> torch.Tensor:
    """The exponential race over the `k_max` most likely tokens: `argmax(p / noise)` among them.

    `probs` [B, V] (temperature applied), `noise` [B, V] Exp(1) draws, `in_top` [B, k_max] bool marks each row's
    own top-k (None: every row uses all `k_max`). Returns [B] token ids; no host sync.
    """
    top_p, top_i = probs.topk(k_max, dim=-1)
    score = top_p / noise.gather(1, top_i)
    if in_top is not None:
        score = torch.where(in_top, score, torch.zeros_like(top_p))
    return top_i.gather(1, score.argmax(dim=-1, keepdim=True))[:, 0]
