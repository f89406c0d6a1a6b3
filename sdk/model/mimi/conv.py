"""Causal 1-d convolutions that stream with explicit per-slot state, and the 25 <-> 12.5 Hz conv resamplers.

State lives in small dataclasses owned by the caller, batched over call slots; the modules hold only weights,
so one model serves any number of streams. `active` ([B] bool or None) freezes the state of idle slots.
Module nesting mirrors Kyutai's Mimi (`conv.conv.weight`, `convtr.convtr.weight`) so checkpoints load as is.

Example:
    >>> import torch
    >>> conv = StreamingConv1d(1, 4, kernel_size=4, stride=2)
    >>> state = conv.init_state(batch_size=2)
    >>> conv(torch.zeros(2, 1, 8), state).shape
    torch.Size([2, 4, 4])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from duetaspan.model.device_paths import cpu_fast_path


def keep_active(active: Tensor | None, new: Tensor, old: Tensor) -> Tensor:
    """`new` where the slot is active, `old` elsewhere (the batch is dim 0)."""
    if active is None:
        return new
    return torch.where(active.view(-1, *([1] * (new.dim() - 1))), new, old)


@dataclass
class ConvState:
    """The last `kernel - stride` input samples of each slot (and whether replicate padding is still unseeded)."""

    previous: Tensor  # [B, C_in, k_eff - stride]
    first: Tensor  # [B] bool

    def reset(self, mask: Tensor) -> None:
        self.previous.masked_fill_(mask.view(-1, 1, 1), 0.0)
        self.first.logical_or_(mask)


@dataclass
class ConvTrState:
    """The overlapping tail of the previous transposed-conv output (bias removed), per slot."""

    partial: Tensor  # [B, C_out, kernel - stride]

    def reset(self, mask: Tensor) -> None:
        self.partial.masked_fill_(mask.view(-1, 1, 1), 0.0)


# On CPU, PyTorch falls back to slow reference kernels for wide convs over a handful of steps (a 1024-channel
# transposed conv over 2 steps takes ~50 ms, versus ~4 ms as one matmul). Streaming runs exactly those shapes.
_SMALL_CONV_STEPS = 64
_SMALL_CONVTR_STEPS = 8
_WIDE = 1024  # in_channels * kernel_size from which the matmul form pays off


def _conv1d_as_matmul(conv: nn.Conv1d, x: Tensor) -> Tensor:
    weight = conv.weight
    c_out, c_in, k = weight.shape
    dilation = conv.dilation[0]
    windows = x.unfold(2, (k - 1) * dilation + 1, conv.stride[0])[..., ::dilation]  # [B, C_in, T_out, k]
    B, _, steps, _ = windows.shape
    y = windows.permute(0, 2, 1, 3).reshape(B, steps, c_in * k) @ weight.view(c_out, c_in * k).t()
    if conv.bias is not None:
        y = y + conv.bias
    return y.transpose(1, 2)


def _conv_transpose1d_as_matmul(convtr: nn.ConvTranspose1d, x: Tensor) -> Tensor:
    weight = convtr.weight
    c_in, c_out, k = weight.shape
    stride = convtr.stride[0]
    B, _, steps = x.shape
    cols = (x.transpose(1, 2) @ weight.view(c_in, c_out * k)).view(B, steps, c_out * k).transpose(1, 2)
    length = (steps - 1) * stride + k
    y = F.fold(cols, (1, length), (1, k), stride=(1, stride)).view(B, c_out, length)
    if convtr.bias is not None:
        y = y + convtr.bias[:, None]
    return y


def _fast_conv(conv: nn.Conv1d, x: Tensor) -> Tensor:
    wide = conv.in_channels * conv.kernel_size[0] >= _WIDE
    if (
        wide
        and cpu_fast_path(x.device)
        and conv.groups == 1
        and x.shape[-1] // conv.stride[0] <= _SMALL_CONV_STEPS
    ):
        return _conv1d_as_matmul(conv, x)
    return conv(x)


def _single_step_depthwise(convtr: nn.ConvTranspose1d, x: Tensor) -> bool:
    c = convtr.in_channels
    return (
        x.shape[-1] == 1
        and cpu_fast_path(x.device)
        and convtr.groups == c == convtr.out_channels
        and convtr.bias is None
        and convtr.padding == (0,)
        and convtr.output_padding == (0,)
        and convtr.dilation == (1,)
    )


def _fast_conv_transpose(convtr: nn.ConvTranspose1d, x: Tensor) -> Tensor:
    if _single_step_depthwise(convtr, x):
        # The streaming upsample: one input step of a channel-wise transposed conv is one product per output
        # sample, which the CPU kernels accumulate onto zero; `+ 0.0` gives the same signed zeros. Bit-exact,
        # and ~15x cheaper than the generic kernel at this shape.
        return x * convtr.weight[:, 0][None] + 0.0
    wide = convtr.in_channels * convtr.kernel_size[0] >= 2 * _WIDE
    if wide and cpu_fast_path(x.device) and convtr.groups == 1 and x.shape[-1] <= _SMALL_CONVTR_STEPS:
        return _conv_transpose1d_as_matmul(convtr, x)
    return convtr(x)


class _Conv(nn.Module):
    """Holds the raw conv as `.conv` (Kyutai's NormConv1d with norm='none')."""

    def __init__(self, conv: nn.Conv1d) -> None:
        super().__init__()
        self.conv = conv


class _ConvTr(nn.Module):
    """Holds the raw transposed conv as `.convtr`."""

    def __init__(self, convtr: nn.ConvTranspose1d) -> None:
        super().__init__()
        self.convtr = convtr


class StreamingConv1d(nn.Module):
    """Causal Conv1d: left context comes from the slot's state (zeros, or the first sample for `replicate`)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        dilation: int = 1,
        groups: int = 1,
        bias: bool = True,
        pad_mode: str = "constant",
    ) -> None:
        super().__init__()
        if pad_mode not in ("constant", "replicate"):
            raise ValueError(f"pad_mode must be 'constant' or 'replicate', not {pad_mode!r}")
        self.pad_mode = pad_mode
        self.stride = stride
        self.context = (kernel_size - 1) * dilation + 1 - stride
        self.conv = _Conv(
            nn.Conv1d(
                in_channels, out_channels, kernel_size, stride, dilation=dilation, groups=groups, bias=bias
            )
        )

    def init_state(
        self, batch_size: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> ConvState:
        weight = self.conv.conv.weight
        device = weight.device if device is None else device
        previous = torch.zeros(
            batch_size, self.conv.conv.in_channels, self.context, device=device, dtype=dtype or weight.dtype
        )
        return ConvState(previous, torch.ones(batch_size, device=device, dtype=torch.bool))

    def forward(self, x: Tensor, state: ConvState | None = None, active: Tensor | None = None) -> Tensor:
        if x.shape[-1] == 0 or x.shape[-1] % self.stride:
            raise ValueError(
                f"conv input length {x.shape[-1]} is not a positive multiple of stride {self.stride}"
            )
        offline = state is None
        if state is None:
            state = self.init_state(x.shape[0], x.device, x.dtype)
        if self.context:
            previous = state.previous
            if self.pad_mode == "replicate":
                previous = torch.where(state.first.view(-1, 1, 1), x[..., :1].expand_as(previous), previous)
            x = torch.cat([previous, x], dim=-1)
        y = _fast_conv(self.conv.conv, x)
        if not offline and self.context:
            state.previous.copy_(keep_active(active, x[..., -self.context :], state.previous))
            if self.pad_mode == "replicate":
                state.first.copy_(keep_active(active, torch.zeros_like(state.first), state.first))
        return y


class StreamingConvTranspose1d(nn.Module):
    """Causal ConvTranspose1d: the `kernel - stride` overlapping tail is carried to the next call."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        groups: int = 1,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.overlap = kernel_size - stride
        self.convtr = _ConvTr(
            nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride, groups=groups, bias=bias)
        )

    def init_state(
        self, batch_size: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> ConvTrState:
        weight = self.convtr.convtr.weight
        device = weight.device if device is None else device
        channels = self.convtr.convtr.out_channels
        return ConvTrState(
            torch.zeros(batch_size, channels, self.overlap, device=device, dtype=dtype or weight.dtype)
        )

    def forward(self, x: Tensor, state: ConvTrState | None = None, active: Tensor | None = None) -> Tensor:
        y = _fast_conv_transpose(self.convtr.convtr, x)
        n = self.overlap
        if n == 0:
            return y
        if state is None:
            return y[..., :-n]
        y[..., :n] += state.partial
        tail = y[..., -n:]
        bias = self.convtr.convtr.bias
        if bias is not None:
            tail = tail - bias[:, None]
        state.partial.copy_(keep_active(active, tail, state.partial))
        return y[..., :-n]


class ConvDownsample1d(nn.Module):
    """Learnt strided conv from the encoder rate to the codec frame rate (kernel 2*stride, replicate padding)."""

    def __init__(self, stride: int, dimension: int) -> None:
        super().__init__()
        self.conv = StreamingConv1d(
            dimension, dimension, 2 * stride, stride, bias=False, pad_mode="replicate"
        )

    def init_state(self, batch_size: int, device=None, dtype=None) -> ConvState:
        return self.conv.init_state(batch_size, device, dtype)

    def forward(self, x: Tensor, state: ConvState | None = None, active: Tensor | None = None) -> Tensor:
        return self.conv(x, state, active)


class ConvTrUpsample1d(nn.Module):
    """Learnt channel-wise transposed conv from the codec frame rate back to the encoder rate."""

    def __init__(self, stride: int, dimension: int) -> None:
        super().__init__()
        self.convtr = StreamingConvTranspose1d(
            dimension, dimension, 2 * stride, stride, groups=dimension, bias=False
        )

    def init_state(self, batch_size: int, device=None, dtype=None) -> ConvTrState:
        return self.convtr.init_state(batch_size, device, dtype)

    def forward(self, x: Tensor, state: ConvTrState | None = None, active: Tensor | None = None) -> Tensor:
        return self.convtr(x, state, active)
