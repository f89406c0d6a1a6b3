"""Mimi's projected causal transformer (LayerNorm, GELU FFN, layer scale, interleaved RoPE, windowed attention).

Streaming keeps one ring KV cache of `context` entries per layer and slot, and one position per slot, in a
`TransformerState` the caller owns. Offline calls attend over the whole input under the same causal window.

Example:
    >>> import torch
    >>> from duetaspan.model.mimi.config import TransformerConfig
    >>> tr = ProjectedTransformer(TransformerConfig(d_model=32, num_heads=4, num_layers=1, dim_feedforward=64), 16)
    >>> state = tr.init_state(batch_size=2)
    >>> tr(torch.zeros(2, 16, 2), state).shape
    torch.Size([2, 16, 2])
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from duetaspan.model.device_paths import capturing
from duetaspan.model.mimi.config import TransformerConfig


@dataclass
class TransformerState:
    """Per-slot position (frames seen) and the ring KV caches of every layer."""

    offset: Tensor  # [B] long
    cache: Tensor  # [layers, 2, B, heads, context, head_dim]

    def reset(self, mask: Tensor) -> None:
        # Stale cache entries become invisible: positions at or past the slot's offset are masked out.
        self.offset.masked_fill_(mask, 0)


def rope_freqs(dim: int, max_period: float, device: torch.device | str | None = None) -> Tensor:
    """The [dim/2] float32 rotation frequencies `apply_rope` uses (callers may keep them)."""
    half = torch.arange(dim // 2, device=device, dtype=torch.float32)
    return torch.exp(half * (-math.log(max_period) * 2 / dim))


def apply_rope(
    q: Tensor, k: Tensor, offset: Tensor, max_period: float, freqs: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Interleaved rotary embedding of q, k ([B, H, T, D]) at positions offset[b] + t, computed in float32."""
    B, _, T, D = q.shape
    if freqs is None:
        freqs = rope_freqs(D, max_period, q.device)
    ts = offset.float().view(-1, 1) + torch.arange(T, device=q.device, dtype=torch.float32)
    angles = freqs * ts.view(B, 1, T, 1)
    cos, sin = torch.cos(angles), torch.sin(angles)

    def rotate(x: Tensor) -> Tensor:
        pairs = x.view(*x.shape[:-1], D // 2, 2)
        re, im = pairs.unbind(-1)
        if x.dtype != torch.float32:
            re, im = re.float(), im.float()
            out = torch.stack([(re * cos - im * sin).to(x.dtype), (re * sin + im * cos).to(x.dtype)], dim=-1)
        else:  # the same arithmetic without no-op conversions
            out = torch.stack([re * cos - im * sin, re * sin + im * cos], dim=-1)
        return out.view(*x.shape[:-1], D)

    return rotate(q), rotate(k)


class StreamingMultiheadAttention(nn.Module):
    """Causal self-attention over the last `context` steps; `in_projs.0` is the fused q/k/v projection."""

    def __init__(self, embed_dim: int, num_heads: int, context: int, max_period: float) -> None:
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.context = context
        self.max_period = max_period
        self.in_projs = nn.ModuleList([nn.Linear(embed_dim, 3 * embed_dim, bias=False)])
        self.out_projs = nn.ModuleList([nn.Linear(embed_dim, embed_dim, bias=False)])
        self._freqs: Tensor | None = None  # rope frequencies, derived once per device

    def forward(
        self, x: Tensor, offset: Tensor, cache: Tensor | None = None, active: Tensor | None = None
    ) -> Tensor:
        B, T, _ = x.shape
        H = self.num_heads
        qkv = self.in_projs[0](x).view(B, T, 3, H, -1).permute(2, 0, 3, 1, 4)
        freqs = self._freqs
        if freqs is None or freqs.device != x.device:
            freqs = rope_freqs(qkv.shape[-1], self.max_period, x.device)
            if not capturing(x.device):
                self._freqs = freqs  # never kept from inside a CUDA graph capture (it would hold no values)
        q, k = apply_rope(qkv[0], qkv[1], offset, self.max_period, freqs)
        v = qkv[2]
        steps = torch.arange(T, device=x.device)
        if cache is None:
            keys, values = k, v
            pos_k = steps.view(1, -1).expand(B, -1)
        else:
            capacity = cache.shape[-2]
            index = ((offset.view(-1, 1) + steps) % capacity).view(B, 1, T, 1).expand(-1, H, -1, k.shape[-1])
            new_k, new_v = k, v
            if active is not None:
                # Idle slots write back what was there, so their caches stay bit-identical.
                keep = active.view(-1, 1, 1, 1)
                new_k = torch.where(keep, k, cache[0].gather(2, index))
                new_v = torch.where(keep, v, cache[1].gather(2, index))
            cache[0].scatter_(2, index, new_k)
            cache[1].scatter_(2, index, new_v)
            keys, values = cache[0], cache[1]
            last = (offset + T - 1).view(-1, 1)
            slots = torch.arange(capacity, device=x.device)
            pos_k = last - (last - slots) % capacity  # absolute time held by each ring slot, < 0 if unwritten
        pos_q = offset.view(-1, 1, 1) + steps.view(1, -1, 1)
        delta = pos_q - pos_k[:, None, :]
        mask = (pos_k[:, None, :] >= 0) & (delta >= 0) & (delta < self.context)
        out = F.scaled_dot_product_attention(q, keys, values, mask[:, None], dropout_p=0.0)
        return self.out_projs[0](out.transpose(1, 2).reshape(B, T, self.embed_dim))


class LayerScale(nn.Module):
    """Per-channel residual scale."""

    def __init__(self, channels: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((channels,), init))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x


class StreamingTransformerLayer(nn.Module):
    """Pre-norm layer: x + ls1(attn(norm1 x)), then x + ls2(linear2(gelu(linear1(norm2 x))))."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.self_attn = StreamingMultiheadAttention(d, cfg.num_heads, cfg.context, cfg.max_period)
        self.norm1 = nn.LayerNorm(d, eps=1e-5)
        self.norm2 = nn.LayerNorm(d, eps=1e-5)
        self.linear1 = nn.Linear(d, cfg.dim_feedforward, bias=False)
        self.linear2 = nn.Linear(cfg.dim_feedforward, d, bias=False)
        scale = cfg.layer_scale
        self.layer_scale_1: nn.Module = nn.Identity() if scale is None else LayerScale(d, scale)
        self.layer_scale_2: nn.Module = nn.Identity() if scale is None else LayerScale(d, scale)

    def forward(
        self, x: Tensor, offset: Tensor, cache: Tensor | None = None, active: Tensor | None = None
    ) -> Tensor:
        update = self.self_attn(self.norm1(x), offset, cache, active)
        x = x.to(update) + self.layer_scale_1(update)
        update = self.linear2(F.gelu(self.linear1(self.norm2(x))))
        return x.to(update) + self.layer_scale_2(update)


class StreamingTransformer(nn.Module):
    """A stack of layers sharing one position per slot."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList([StreamingTransformerLayer(cfg) for _ in range(cfg.num_layers)])

    def forward(
        self, x: Tensor, state: TransformerState | None = None, active: Tensor | None = None
    ) -> Tensor:
        B, T, _ = x.shape
        offset = torch.zeros(B, device=x.device, dtype=torch.long) if state is None else state.offset
        dtype = x.dtype
        for i, layer in enumerate(self.layers):
            x = layer(x, offset, None if state is None else state.cache[i], active)
        if state is not None:
            advanced = state.offset + T
            state.offset.copy_(advanced if active is None else torch.where(active, advanced, state.offset))
        return x.to(dtype)


class ProjectedTransformer(nn.Module):
    """The transformer on [B, C, T] latents, with input/output projections when C differs from d_model."""

    def __init__(self, cfg: TransformerConfig, dimension: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.transformer = StreamingTransformer(cfg)
        self.input_proj = None if dimension == cfg.d_model else nn.Linear(dimension, cfg.d_model, bias=False)
        self.output_projs = nn.ModuleList(
            [nn.Identity() if dimension == cfg.d_model else nn.Linear(cfg.d_model, dimension, bias=False)]
        )

    def init_state(
        self, batch_size: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> TransformerState:
        weight = self.transformer.layers[0].self_attn.in_projs[0].weight
        device = weight.device if device is None else device
        cfg = self.cfg
        head_dim = cfg.d_model // cfg.num_heads
        cache = torch.zeros(
            cfg.num_layers, 2, batch_size, cfg.num_heads, cfg.context, head_dim,
            device=device, dtype=dtype or weight.dtype,
        )  # fmt: skip
        return TransformerState(torch.zeros(batch_size, device=device, dtype=torch.long), cache)

    def forward(
        self, x: Tensor, state: TransformerState | None = None, active: Tensor | None = None
    ) -> Tensor:
        x = x.transpose(1, 2)
        if self.input_proj is not None:
            x = self.input_proj(x)
        z = self.transformer(x, state, active)
        return self.output_projs[0](z).transpose(1, 2)
