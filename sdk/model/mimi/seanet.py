"""The causal SEANet encoder (waveform -> 25 Hz latents) and decoder (latents -> waveform) of Mimi.

Each module's streaming state is a list aligned with its `model` children (None for stateless layers), so the
caller can keep one state per stream and reset slots with `reset_state`.

Example:
    >>> import torch
    >>> from duetaspan.model.mimi.config import SeanetConfig
    >>> enc = SeanetEncoder(SeanetConfig(dimension=16, n_filters=2))
    >>> enc(torch.zeros(1, 1, 960), enc.init_state(1)).shape
    torch.Size([1, 16, 1])
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from duetaspan.model.mimi.config import SeanetConfig
from duetaspan.model.mimi.conv import StreamingConv1d, StreamingConvTranspose1d

_STREAMING = (StreamingConv1d, StreamingConvTranspose1d)


def reset_state(state: Any, mask: Tensor) -> None:
    """Reset the slots in `mask` ([B] bool) of a (nested list of) streaming state(s) in place."""
    if state is None:
        return
    if isinstance(state, list | tuple):
        for item in state:
            reset_state(item, mask)
        return
    state.reset(mask)


def _init_states(seq: nn.Sequential, batch_size: int, device, dtype) -> list[Any]:
    return [m.init_state(batch_size, device, dtype) if hasattr(m, "init_state") else None for m in seq]


def _run(seq: nn.Sequential, x: Tensor, states: list[Any] | None, active: Tensor | None) -> Tensor:
    for i, module in enumerate(seq):
        if hasattr(module, "init_state"):
            x = module(x, None if states is None else states[i], active)
        else:
            x = module(x)
    return x


class SeanetResnetBlock(nn.Module):
    """ELU -> conv(k, dilation) -> ELU -> conv(1), added to the input (true skip)."""

    def __init__(self, dim: int, kernel_size: int, dilation: int, compress: int, true_skip: bool) -> None:
        super().__init__()
        hidden = dim // compress
        self.block = nn.Sequential(
            nn.ELU(),
            StreamingConv1d(dim, hidden, kernel_size, dilation=dilation),
            nn.ELU(),
            StreamingConv1d(hidden, dim, 1),
        )
        self.shortcut: nn.Module = nn.Identity() if true_skip else StreamingConv1d(dim, dim, 1)

    def init_state(self, batch_size: int, device=None, dtype=None) -> list[Any]:
        states = _init_states(self.block, batch_size, device, dtype)
        shortcut = (
            self.shortcut.init_state(batch_size, device, dtype)
            if hasattr(self.shortcut, "init_state")
            else None
        )
        return [*states, shortcut]

    def forward(self, x: Tensor, state: list[Any] | None = None, active: Tensor | None = None) -> Tensor:
        if isinstance(self.shortcut, StreamingConv1d):
            skip = self.shortcut(x, None if state is None else state[-1], active)
        else:
            skip = self.shortcut(x)
        return skip + _run(self.block, x, None if state is None else state[:-1], active)


class SeanetEncoder(nn.Module):
    """conv -> [resblocks, ELU, strided conv] per ratio -> ELU -> conv to `dimension`."""

    def __init__(self, cfg: SeanetConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = [StreamingConv1d(cfg.channels, cfg.n_filters, cfg.kernel_size)]
        mult = 1
        for ratio in reversed(cfg.ratios):
            width = mult * cfg.n_filters
            for j in range(cfg.n_residual_layers):
                layers.append(
                    SeanetResnetBlock(
                        width, cfg.residual_kernel_size, cfg.dilation_base**j, cfg.compress, cfg.true_skip
                    )
                )
            layers += [nn.ELU(), StreamingConv1d(width, width * 2, kernel_size=2 * ratio, stride=ratio)]
            mult *= 2
        layers += [nn.ELU(), StreamingConv1d(mult * cfg.n_filters, cfg.dimension, cfg.last_kernel_size)]
        self.model = nn.Sequential(*layers)

    def init_state(self, batch_size: int, device=None, dtype=None) -> list[Any]:
        return _init_states(self.model, batch_size, device, dtype)

    def forward(self, x: Tensor, state: list[Any] | None = None, active: Tensor | None = None) -> Tensor:
        return _run(self.model, x, state, active)


class SeanetDecoder(nn.Module):
    """conv from `dimension` -> [ELU, transposed conv, resblocks] per ratio -> ELU -> conv to audio."""

    def __init__(self, cfg: SeanetConfig) -> None:
        super().__init__()
        mult = 2 ** len(cfg.ratios)
        layers: list[nn.Module] = [StreamingConv1d(cfg.dimension, mult * cfg.n_filters, cfg.kernel_size)]
        for ratio in cfg.ratios:
            width = mult * cfg.n_filters
            layers += [
                nn.ELU(),
                StreamingConvTranspose1d(width, width // 2, kernel_size=2 * ratio, stride=ratio),
            ]
            for j in range(cfg.n_residual_layers):
                layers.append(
                    SeanetResnetBlock(
                        width // 2,
                        cfg.residual_kernel_size,
                        cfg.dilation_base**j,
                        cfg.compress,
                        cfg.true_skip,
                    )
                )
            mult //= 2
        layers += [nn.ELU(), StreamingConv1d(cfg.n_filters, cfg.channels, cfg.last_kernel_size)]
        self.model = nn.Sequential(*layers)

    def init_state(self, batch_size: int, device=None, dtype=None) -> list[Any]:
        return _init_states(self.model, batch_size, device, dtype)

    def forward(self, z: Tensor, state: list[Any] | None = None, active: Tensor | None = None) -> Tensor:
        return _run(self.model, z, state, active)


__all__ = ["SeanetDecoder", "SeanetEncoder", "SeanetResnetBlock", "reset_state"]
