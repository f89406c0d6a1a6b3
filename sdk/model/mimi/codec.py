"""The Mimi model (`MimiModel`): weights, per-slot streaming state objects, compute, and offline encode/decode.

`MimiModel` holds weights only; parameter and buffer names are those of Kyutai's `MimiModel.state_dict()`, so the
released `tokenizer-e351c8d8-checkpoint125.safetensors` loads strictly. Streaming state lives in `MimiStream`
(`duetaspan.model.mimi.stream`), one per group of B call slots, so several streams can share one model; checkpoint
loading, saving and random init are `duetaspan.model.mimi.checkpoint`.

Example:
    >>> import torch
    >>> from duetaspan.model.mimi import MimiStream, random_mimi
    >>> model = random_mimi("tiny")
    >>> stream = MimiStream(model, batch_size=2)
    >>> codes = stream.encode(torch.zeros(2, 1, 1920))      # [2, 8, 1]
    >>> stream.decode(codes).shape
    torch.Size([2, 1, 1920])
    >>> stream.reset(1)                                      # slot 1 starts a new call; slot 0 untouched
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from duetaspan.errors import AudioFormatError, DuetaspanError
from duetaspan.model.device_paths import cpu_fast_path
from duetaspan.model.mimi.config import MimiConfig
from duetaspan.model.mimi.conv import ConvDownsample1d, ConvState, ConvTrState, ConvTrUpsample1d
from duetaspan.model.mimi.quantizer import SplitResidualVectorQuantizer
from duetaspan.model.mimi.seanet import SeanetDecoder, SeanetEncoder, reset_state
from duetaspan.model.mimi.transformer import ProjectedTransformer, TransformerState


class CodesError(DuetaspanError, ValueError):
    """Codes handed to the decoder have the wrong shape, type or range."""


@dataclass
class EncoderState:
    """Streaming state of the encoder side for B slots."""

    seanet: list[Any]
    transformer: TransformerState
    downsample: ConvState | None

    def reset(self, mask: Tensor) -> None:
        reset_state([self.seanet, self.transformer, self.downsample], mask)


@dataclass
class DecoderState:
    """Streaming state of the decoder side for B slots."""

    upsample: ConvTrState | None
    transformer: TransformerState
    seanet: list[Any]

    def reset(self, mask: Tensor) -> None:
        reset_state([self.upsample, self.transformer, self.seanet], mask)


class MimiModel(nn.Module):
    """Mimi: SEANet + transformer + 25->12.5 Hz conv downsample + split RVQ, and the mirror decoder.

    Build it with `load_mimi` (weights) or `random_mimi` (tests); stream it with `MimiStream`.
    """

    def __init__(self, config: MimiConfig | None = None) -> None:
        super().__init__()
        cfg = config or MimiConfig()
        self.config = cfg
        self.num_codebooks = cfg.num_codebooks
        dim = cfg.seanet.dimension
        self.encoder = SeanetEncoder(cfg.seanet)
        self.decoder = SeanetDecoder(cfg.seanet)
        self.encoder_transformer = ProjectedTransformer(cfg.transformer, dim)
        self.decoder_transformer = ProjectedTransformer(cfg.transformer, dim)
        self.quantizer = SplitResidualVectorQuantizer(cfg.quantizer, dim)
        stride = cfg.resample_stride
        self.downsample = ConvDownsample1d(stride, dim) if stride > 1 else None
        self.upsample = ConvTrUpsample1d(stride, dim) if stride > 1 else None

    @property
    def frame_size(self) -> int:
        return self.config.frame_size

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def device(self) -> torch.device:
        return self.encoder.model[0].conv.conv.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.encoder.model[0].conv.conv.weight.dtype

    def set_num_codebooks(self, n: int) -> None:
        """How many codebooks `encode` emits (the semantic one plus n-1 acoustic ones)."""
        q = self.config.quantizer
        if not q.n_q_semantic <= n <= q.n_q:
            raise ValueError(f"num_codebooks must be within [{q.n_q_semantic}, {q.n_q}], got {n}")
        self.num_codebooks = n

    # -- states ---------------------------------------------------------------------------------------------

    def init_encoder_state(self, batch_size: int) -> EncoderState:
        args = (batch_size, self.device, self.dtype)
        return EncoderState(
            self.encoder.init_state(*args),
            self.encoder_transformer.init_state(*args),
            None if self.downsample is None else self.downsample.init_state(*args),
        )

    def init_decoder_state(self, batch_size: int) -> DecoderState:
        args = (batch_size, self.device, self.dtype)
        return DecoderState(
            None if self.upsample is None else self.upsample.init_state(*args),
            self.decoder_transformer.init_state(*args),
            self.decoder.init_state(*args),
        )

    # -- compute ---------------------------------------------------------------------------------------------

    def encode_latent(
        self, pcm: Tensor, state: EncoderState | None = None, active: Tensor | None = None
    ) -> Tensor:
        """[B, 1, 1920*k] audio -> [B, dimension, k] unquantized latents."""
        x = pcm.to(self.dtype)
        emb = self.encoder(x, None if state is None else state.seanet, active)
        emb = self.encoder_transformer(emb, None if state is None else state.transformer, active)
        if self.downsample is not None:
            emb = self.downsample(emb, None if state is None else state.downsample, active)
        return emb

    def encode(self, pcm: Tensor, state: EncoderState | None = None, active: Tensor | None = None) -> Tensor:
        """[B, 1, 1920*k] audio -> [B, num_codebooks, k] int64 codes. `state=None` encodes offline."""
        return self.quantizer.encode(self.encode_latent(pcm, state, active), self.num_codebooks)

    def decode(
        self, codes: Tensor, state: DecoderState | None = None, active: Tensor | None = None
    ) -> Tensor:
        """[B, K, k] codes -> [B, 1, 1920*k] audio in the model dtype. `state=None` decodes offline."""
        emb = self.quantizer.decode(codes).to(self.dtype)
        if self.upsample is not None:
            emb = self.upsample(emb, None if state is None else state.upsample, active)
        emb = self.decoder_transformer(emb, None if state is None else state.transformer, active)
        return self.decoder(emb, None if state is None else state.seanet, active)

    @torch.inference_mode()
    def encode_offline(self, pcm: Tensor) -> Tensor:
        """Encode a whole clip (e.g. a voice prompt) in one pass; the tail is zero-padded to a whole frame.

        `pcm` may live anywhere (a voice prompt read from a wav is on the CPU): it is moved to the model's device.

        >>> from duetaspan.model.mimi import random_mimi
        >>> model = random_mimi("tiny")
        >>> model.encode_offline(torch.zeros(1, 1, 3000)).shape
        torch.Size([1, 8, 2])
        """
        pcm = as_batch(pcm)
        if pcm.shape[-1] == 0:
            raise AudioFormatError("encode_offline: empty audio")
        pcm = pcm.to(self.device)
        pad = -pcm.shape[-1] % self.frame_size
        if pad:
            pcm = nn.functional.pad(pcm, (0, pad))
        return self.encode(pcm)

    @torch.inference_mode()
    def decode_offline(self, codes: Tensor) -> Tensor:
        """Decode whole code sequences [B, K, k] in one pass -> float32 [B, 1, 1920*k]."""
        q = self.config.quantizer
        return self.decode(check_codes(codes, None, q.bins, self.device, q.n_q)).float()


# -- input checks (shared with `MimiStream`) ---------------------------------------------------------------------


def as_batch(pcm: Tensor) -> Tensor:
    """Mono audio [T], [B, T] or [B, 1, T] as [B, 1, T]."""
    if pcm.dim() == 1:
        return pcm.view(1, 1, -1)
    if pcm.dim() == 2:
        return pcm.unsqueeze(1)
    if pcm.dim() != 3 or pcm.shape[1] != 1:
        raise AudioFormatError(f"expected mono audio [B, 1, T], got shape {tuple(pcm.shape)}")
    return pcm


def check_codes(codes: Tensor, batch: int | None, bins: int, device: torch.device, n_q: int = 32) -> Tensor:
    """Codes [B, 1..n_q, k>0] of integers in [0, bins) as int64 on `device`, else `CodesError`."""
    bad_shape = codes.dim() != 3 or (batch is not None and codes.shape[0] != batch) or codes.shape[-1] == 0
    if bad_shape or not 1 <= codes.shape[1] <= n_q:
        want = f"[{batch if batch is not None else 'B'}, 1..{n_q}, k>0]"
        raise CodesError(f"expected codes {want}, got shape {tuple(codes.shape)}")
    if codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise CodesError(f"codes must be integers, got {codes.dtype}")
    if cpu_fast_path(codes.device) and codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= bins):
        # Checked on CPU only: on an accelerator this would cost a host sync per frame.
        raise CodesError(f"codes must be within [0, {bins}), got [{int(codes.min())}, {int(codes.max())}]")
    return codes.to(device=device, dtype=torch.long)
