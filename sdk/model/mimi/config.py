"""Mimi configuration (pydantic) and its two presets: the released 24 kHz `mimi` and a `tiny` CPU one.

Example:
    >>> from duetaspan.model.mimi.config import MimiConfig
    >>> cfg = MimiConfig.preset("mimi")
    >>> (cfg.frame_size, cfg.encoder_frame_rate, cfg.num_codebooks)
    (1920, 25.0, 8)
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, model_validator

from duetaspan.errors import ConfigError


class SeanetConfig(BaseModel):
    """The causal SEANet encoder/decoder (ELU, constant padding, no weight norm at inference)."""

    model_config = ConfigDict(frozen=True)

    channels: int = 1
    dimension: int = 512
    n_filters: int = 64
    n_residual_layers: int = 1
    ratios: tuple[int, ...] = (8, 6, 5, 4)  # decoder order; the encoder applies them reversed
    kernel_size: int = 7
    residual_kernel_size: int = 3
    last_kernel_size: int = 3
    dilation_base: int = 2
    compress: int = 2
    true_skip: bool = True

    @property
    def hop_length(self) -> int:
        return math.prod(self.ratios)


class TransformerConfig(BaseModel):
    """The projected causal transformer after the SEANet encoder and before the decoder (LayerNorm, GELU, RoPE)."""

    model_config = ConfigDict(frozen=True)

    d_model: int = 512
    num_heads: int = 8
    num_layers: int = 8
    dim_feedforward: int = 2048
    context: int = 250  # attention window in encoder frames (25 Hz): 10 s
    max_period: float = 10_000.0
    layer_scale: float | None = 0.01


class QuantizerConfig(BaseModel):
    """Split residual VQ: `n_q_semantic` semantic codebooks, then `n_q - n_q_semantic` acoustic ones."""

    model_config = ConfigDict(frozen=True)

    dimension: int = 256
    n_q: int = 32
    n_q_semantic: int = 1
    bins: int = 2048


class MimiConfig(BaseModel):
    """The whole codec. `num_codebooks` is how many codebooks `encode` emits (8 per speaker for DuetaSpan)."""

    model_config = ConfigDict(frozen=True)

    sample_rate: int = 24_000
    frame_rate: float = 12.5
    seanet: SeanetConfig = Field(default_factory=SeanetConfig)
    transformer: TransformerConfig = Field(default_factory=TransformerConfig)
    quantizer: QuantizerConfig = Field(default_factory=QuantizerConfig)
    num_codebooks: int = 8

    @model_validator(mode="after")
    def _check(self) -> MimiConfig:
        if self.sample_rate % self.seanet.hop_length:
            raise ConfigError(
                f"seanet.ratios: hop {self.seanet.hop_length} does not divide {self.sample_rate}"
            )
        stride = self.encoder_frame_rate / self.frame_rate
        if stride < 1 or stride != int(stride):
            raise ConfigError(
                f"frame_rate: {self.frame_rate} Hz must be the encoder rate {self.encoder_frame_rate} Hz "
                "divided by a whole number"
            )
        if self.transformer.d_model % self.transformer.num_heads:
            raise ConfigError("transformer.num_heads must divide transformer.d_model")
        if not self.quantizer.n_q_semantic <= self.num_codebooks <= self.quantizer.n_q:
            raise ConfigError(
                f"num_codebooks: {self.num_codebooks} must be within "
                f"[{self.quantizer.n_q_semantic}, {self.quantizer.n_q}]"
            )
        return self

    @property
    def encoder_frame_rate(self) -> float:
        return self.sample_rate / self.seanet.hop_length

    @property
    def resample_stride(self) -> int:
        """How many encoder frames make one codec frame (2: 25 Hz -> 12.5 Hz)."""
        return int(self.encoder_frame_rate / self.frame_rate)

    @property
    def frame_size(self) -> int:
        """Samples per codec frame (1920 = 80 ms at 24 kHz)."""
        return self.seanet.hop_length * self.resample_stride

    @classmethod
    def preset(cls, name: str) -> MimiConfig:
        """`mimi`: the released Kyutai Mimi. `tiny`: a small random Mimi with the same framing, for CPU tests."""
        if name == "mimi":
            return cls()
        if name == "tiny":
            return cls(
                seanet=SeanetConfig(dimension=64, n_filters=4, ratios=(8, 6, 5, 4), kernel_size=5),
                transformer=TransformerConfig(
                    d_model=64, num_heads=4, num_layers=1, dim_feedforward=128, layer_scale=0.01
                ),
                quantizer=QuantizerConfig(dimension=32, n_q=8, bins=2048),
            )
        raise ConfigError(f"unknown Mimi preset {name!r}; choose 'mimi' or 'tiny'")
