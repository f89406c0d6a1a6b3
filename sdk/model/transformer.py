"""Transformer building blocks of the Moshi architecture on plain torch.

Owns the fp32 RMSNorm, interleaved RoPE, the SiLU-gated FFN, multi-head attention with one weight set per
depformer step, and the two stacks: the temporal transformer (causal attention over a per-slot KV ring with a
sliding `context` window) and the depth transformer (attention over the codebooks of one frame). Module and
parameter names follow moshi 0.2.13's `state_dict()` so checkpoints load without renaming.

Example:
    >>> import torch
    >>> from duetaspan.model.transformer import RMSNorm
    >>> RMSNorm(8, eps=1e-8)(torch.ones(1, 2, 8)).shape
    torch.Size([1, 2, 8])
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from duetaspan.model.device_paths import capturing, cpu_fast_path


def rms_norm(x: torch.Tensor, alpha: torch.Tensor, eps: float) -> torch.Tensor:
    """`RMSNorm` as a function (the hot loops call it directly, without the module call overhead)."""
    if x.dtype == torch.float32 and alpha.dtype == torch.float32:
        # The same arithmetic without the no-op dtype conversions (each is a dispatched op).
        return x * (alpha * torch.rsqrt(eps + torch.mean(x * x, dim=-1, keepdim=True)))
    xf = x.float()
    var = eps + torch.mean(xf * xf, dim=-1, keepdim=True)
    return (xf * (alpha.float() * torch.rsqrt(var))).to(x.dtype)


class RMSNorm(nn.Module):
    """RMS normalisation computed in float32, with a learnt `alpha` of shape [1, 1, dim]."""

    def __init__(self, dim: int, eps: float, device=None) -> None:
        super().__init__()
        self.eps = eps
        self.alpha = nn.Parameter(torch.ones(1, 1, dim, device=device, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.alpha, self.eps)


class GatedFFN(nn.Module):
    """SiLU-gated feed-forward: `linear_out(silu(a) * b)` with `[a, b] = linear_in(x)`."""

    def __init__(self, dim: int, hidden: int, device=None, dtype=None) -> None:
        super().__init__()
        self.linear_in = nn.Linear(dim, 2 * hidden, bias=False, device=device, dtype=dtype)
        self.linear_out = nn.Linear(hidden, dim, bias=False, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.linear(x, self.linear_in.weight)
        a, b = h.view(*h.shape[:-1], 2, -1).unbind(-2)
        return F.linear(F.silu(a) * b, self.linear_out.weight)


def may_cache(device: torch.device) -> bool:
    """Whether a derived tensor made now may be kept for later calls: not while a CUDA graph is being captured
    (capture records kernels without running them, so the tensor would hold no values outside replays)."""
    return not capturing(device)


def rope_freqs(head_dim: int, max_period: float, device: torch.device | str | None = None) -> torch.Tensor:
    """The [head_dim/2] fp32 rotation frequencies (what `rope_tables` uses; callers may keep them)."""
    ds = torch.arange(head_dim // 2, device=device, dtype=torch.float32)
    return torch.exp(ds * (-math.log(max_period) * 2 / head_dim))


def rope_tables(
    positions: torch.Tensor, head_dim: int, max_period: float, freqs: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [B, 1, T, head_dim/2] for absolute `positions` [B, T] (fp32, as Moshi computes them)."""
    if freqs is None:
        freqs = rope_freqs(head_dim, max_period, positions.device)
    ts = positions.float()[:, None, :, None]
    return torch.cos(freqs * ts), torch.sin(freqs * ts)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved (real, imaginary) pairs of `x` [B, H, T, D]."""
    xr = x.view(*x.shape[:-1], -1, 2)
    re, im = xr[..., 0].float(), xr[..., 1].float()
    out = torch.stack([(re * cos - im * sin).to(x.dtype), (re * sin + im * cos).to(x.dtype)], dim=-1)
    return out.view(x.shape)


class Attention(nn.Module):
    """Bias-free multi-head attention projections, `n_weights` sets (one per depformer step, or one)."""

    def __init__(self, dim: int, num_heads: int, n_weights: int = 1, device=None, dtype=None) -> None:
        super().__init__()
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        # out_projs first: the same registration order as moshi's state_dict.
        self.out_projs = nn.ModuleList(
            [nn.Linear(dim, dim, bias=False, device=device, dtype=dtype) for _ in range(n_weights)]
        )
        self.in_projs = nn.ModuleList(
            [nn.Linear(dim, 3 * dim, bias=False, device=device, dtype=dtype) for _ in range(n_weights)]
        )

    def qkv(self, x: torch.Tensor, w: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape
        qkv = F.linear(x, self.in_projs[w].weight).view(B, T, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, H, T, D]
        return q, k, v

    def out(self, y: torch.Tensor, w: int = 0) -> torch.Tensor:
        B, H, T, D = y.shape
        return F.linear(y.transpose(1, 2).reshape(B, T, H * D), self.out_projs[w].weight)


class Layer(nn.Module):
    """Pre-norm transformer layer: `x + attn(norm1(x))`, then `x + ffn(norm2(x))`."""

    def __init__(
        self, dim: int, num_heads: int, hidden: int, eps: float, n_weights: int, device=None, dtype=None
    ) -> None:
        super().__init__()
        self.self_attn = Attention(dim, num_heads, n_weights, device=device, dtype=dtype)
        self.norm1 = RMSNorm(dim, eps, device=device)
        self.norm2 = RMSNorm(dim, eps, device=device)
        self.gating: nn.Module
        if n_weights > 1:
            self.gating = nn.ModuleList(
                [GatedFFN(dim, hidden, device=device, dtype=dtype) for _ in range(n_weights)]
            )
        else:
            self.gating = GatedFFN(dim, hidden, device=device, dtype=dtype)

    def ffn(self, x: torch.Tensor, w: int = 0) -> torch.Tensor:
        gating = self.gating[w] if isinstance(self.gating, nn.ModuleList) else self.gating
        return x + gating.forward(rms_norm(x, self.norm2.alpha, self.norm2.eps))


@dataclass
class TemporalKV:
    """Per-slot attention state of the temporal transformer (tensors may be row views of a larger batch).

    `kv` is [L, 2, B, H, capacity, D]; `positions` [B, capacity] holds the absolute time written in each
    ring cell (-1: empty). Capacity exceeds `context` so a multi-frame write never evicts a key that an
    earlier query of the same chunk still sees (Moshi's mask only uses `context`).
    """

    kv: torch.Tensor
    positions: torch.Tensor

    @property
    def capacity(self) -> int:
        return self.kv.shape[-2]

    def rows(self, start: int, stop: int) -> TemporalKV:
        """A view of slots [start, stop): writes through it land in this state."""
        return TemporalKV(self.kv[:, :, start:stop], self.positions[start:stop])


class TemporalTransformer(nn.Module):
    """The causal temporal transformer with RoPE over a ring KV cache and a `context`-frame window."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        num_layers: int,
        hidden: int,
        eps: float,
        context: int,
        max_period: float,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.context = context
        self.max_period = max_period
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.layers = nn.ModuleList(
            [Layer(dim, num_heads, hidden, eps, 1, device=device, dtype=dtype) for _ in range(num_layers)]
        )
        self._freqs: torch.Tensor | None = None  # rope frequencies, derived once per device

    def new_kv(self, batch: int, capacity: int, device, dtype) -> TemporalKV:
        kv = torch.zeros(
            len(self.layers), 2, batch, self.num_heads, capacity, self.head_dim, device=device, dtype=dtype
        )
        return TemporalKV(kv, torch.full((batch, capacity), -1, device=device, dtype=torch.long))

    def forward(
        self,
        x: torch.Tensor,
        state: TemporalKV,
        offsets: torch.Tensor,
        active: torch.Tensor | None = None,
        kv_len: int | None = None,
    ) -> torch.Tensor:
        """Run T new frames `x` [B, T, dim] at absolute times `offsets[B] + arange(T)`.

        Keys and values of active rows are written into the ring (inactive rows are left bit-identical);
        the caller advances `offsets`. `kv_len` (a host-side hint, see `attention_span`) says that no ring cell
        from `kv_len` on holds a key yet, so attention reads only the cells before it.
        """
        B, T, _ = x.shape
        cap = state.capacity
        span = cap if kv_len is None else min(kv_len, cap)
        pos_q = offsets[:, None] + torch.arange(T, device=x.device)  # [B, T]
        cells = pos_q % cap
        if active is None:
            state.positions.scatter_(1, cells, pos_q)
        else:
            keep = active[:, None]
            state.positions.scatter_(1, cells, torch.where(keep, pos_q, state.positions.gather(1, cells)))
        pos_k = state.positions[:, None, :span]  # [B, 1, span]
        delta = pos_q[:, :, None] - pos_k
        mask = (pos_k >= 0) & (delta >= 0) & (delta < self.context)
        if active is not None:
            # Rows that do not execute may have no visible key at all; let them see everything (finite
            # garbage, discarded) rather than produce NaNs.
            mask = mask | ~active[:, None, None]
        mask = mask[:, None]  # [B, 1, T, span]
        freqs = self._freqs
        if freqs is None or freqs.device != x.device:
            freqs = rope_freqs(self.head_dim, self.max_period, x.device)
            if may_cache(x.device):
                self._freqs = freqs
        cos, sin = rope_tables(pos_q, self.head_dim, self.max_period, freqs)
        index = cells[:, None, :, None].expand(B, self.num_heads, T, self.head_dim)
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.norm1.alpha, layer.norm1.eps)
            q, k, v = layer.self_attn.qkv(h)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            k_cache, v_cache = state.kv[i, 0], state.kv[i, 1]
            if active is not None:
                sel = active[:, None, None, None]
                k = torch.where(sel, k, k_cache.gather(2, index))
                v = torch.where(sel, v, v_cache.gather(2, index))
            k_cache.scatter_(2, index, k)
            v_cache.scatter_(2, index, v)
            if span < cap:
                k_cache, v_cache = k_cache[:, :, :span], v_cache[:, :, :span]
            y = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)
            x = x + layer.self_attn.out(y)
            x = layer.ffn(x)
        return x


# PyTorch's CPU flash attention walks the keys in blocks of 512 (for short queries, torch 2.x); blocks whose keys
# are all masked add exactly nothing, so leaving out whole trailing blocks of never-written cells is bit-exact.
_CPU_KV_BLOCK = 512


def attention_span(device: torch.device, written: int, capacity: int) -> int | None:
    """The `kv_len` hint for a temporal pass when at most the first `written` ring cells hold keys: rounded up
    to whole attention blocks on a CPU; None (attend over the whole ring) on other devices, with
    `cuda_branches` on, or once it wraps.

    >>> attention_span(torch.device("cpu"), 40, 3256), attention_span(torch.device("cpu"), 3100, 3256)
    (512, None)
    """
    if not cpu_fast_path(device):
        return None
    span = -(-max(written, 1) // _CPU_KV_BLOCK) * _CPU_KV_BLOCK
    return span if span < capacity else None


class DepthTransformer(nn.Module):
    """The depth transformer: one weight set per codebook step, attention over the steps of one frame."""

    def __init__(
        self, dim: int, num_heads: int, num_layers: int, hidden: int, eps: float, steps: int, device=None,
        dtype=None,
    ) -> None:  # fmt: skip
        super().__init__()
        self.steps = steps
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.layers = nn.ModuleList(
            [Layer(dim, num_heads, hidden, eps, steps, device=device, dtype=dtype) for _ in range(num_layers)]
        )

    def new_kv(self, batch: int, device, dtype) -> torch.Tensor:
        """Scratch KV [L, 2, B, H, steps, D] for one frame; step i only reads cells < i+1, so no reset."""
        return torch.empty(
            len(self.layers), 2, batch, self.num_heads, self.steps, self.head_dim, device=device, dtype=dtype
        )

    @staticmethod
    def split_kv(kv: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer (keys, values) views [B, H, steps, D] of a scratch KV (split once per frame, not per step)."""
        # Plain selects: views from `unbind` may not be written in place outside no_grad.
        return [(kv[i, 0], kv[i, 1]) for i in range(kv.shape[0])]

    def forward(
        self, x: torch.Tensor, step: int, kv: torch.Tensor | list[tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """Codebook step `step` for x [B, 1, dim], attending to steps 0..step of this frame.

        `kv` is the scratch KV of `new_kv` (or its `split_kv` views).
        """
        caches = self.split_kv(kv) if isinstance(kv, torch.Tensor) else kv
        for layer, (keys, values) in zip(self.layers, caches, strict=True):
            attn = layer.self_attn
            q, k, v = attn.qkv(rms_norm(x, layer.norm1.alpha, layer.norm1.eps), step)
            keys.narrow(2, step, 1).copy_(k)
            values.narrow(2, step, 1).copy_(v)
            y = F.scaled_dot_product_attention(q, keys.narrow(2, 0, step + 1), values.narrow(2, 0, step + 1))
            x = x + attn.out(y, step)
            x = layer.ffn(x, step)
        return x
