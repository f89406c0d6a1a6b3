"""Mimi's split residual vector quantizer: one semantic RVQ and one acoustic RVQ over the same latent.

Codebooks are stored the way they were trained (EMA `embedding_sum` / `cluster_usage`); the centroids are derived
once per device and kept in float32, and nearest-centroid search always runs in float32.

Example:
    >>> import torch
    >>> from duetaspan.model.mimi.config import QuantizerConfig
    >>> q = SplitResidualVectorQuantizer(QuantizerConfig(dimension=8, n_q=4, bins=16), 32)
    >>> q.encode(torch.randn(1, 32, 3), num_codebooks=4).shape
    torch.Size([1, 4, 3])
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from duetaspan.model.device_paths import capturing
from duetaspan.model.mimi.config import QuantizerConfig

_EPSILON = 1e-5


class EuclideanCodebook(nn.Module):
    """One codebook of `bins` centroids: embedding_sum[i] / max(cluster_usage[i], eps)."""

    def __init__(self, dim: int, bins: int) -> None:
        super().__init__()
        self.register_buffer("_initialized", torch.zeros(1))
        self.register_buffer("cluster_usage", torch.ones(bins))
        self.register_buffer("embedding_sum", torch.zeros(bins, dim))
        self._centroids: Tensor | None = None
        self._augmented: tuple[Tensor, Tensor] | None = None  # (centroids it was built from, table)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self.invalidate()
        super()._load_from_state_dict(*args, **kwargs)

    def invalidate(self) -> None:
        """Forget the derived centroids (call after editing the buffers in place)."""
        self._centroids = None

    @property
    def centroids(self) -> Tensor:
        """[bins, dim] float32 centroids on the buffers' device."""
        cached = self._centroids
        if cached is None or cached.device != self.embedding_sum.device:
            usage = self.cluster_usage.float().clamp(min=_EPSILON)
            cached = self.embedding_sum.float() / usage[:, None]
            self._centroids = cached
        return cached

    def nearest(self, x: Tensor) -> Tensor:
        """Index [N] of the nearest centroid of each row of `x` [N, dim] (float32).

        Exactly `torch.cdist(x[None], centroids[None]).argmin(-1)`: for more than 25 centroids cdist computes
        `[-2x, |x|^2, 1] @ [c, 1, |c|^2]^T`, clamps and takes the root; here the centroid side of that product
        is built once instead of on every call (the same tensors, so the same floats).
        """
        centroids = self.centroids
        if centroids.shape[0] <= 25:
            return torch.cdist(x[None], centroids[None], p=2)[0].argmin(dim=-1)
        aug = self._augmented
        if aug is None or aug[0] is not centroids:
            norms = centroids[None].pow(2).sum(-1, keepdim=True)
            aug = (centroids, torch.cat([centroids[None], torch.ones_like(norms), norms], dim=-1))
            # Not kept while a CUDA graph is being captured: the table would only hold values during replays.
            if not capturing(centroids.device):
                self._augmented = aug
        x1 = x[None]
        norms = x1.pow(2).sum(-1, keepdim=True)
        query = torch.cat([x1.mul(-2), norms, torch.ones_like(norms)], dim=-1)
        return query.matmul(aug[1].mT).clamp_min_(0).sqrt_()[0].argmin(dim=-1)


class _VQLayer(nn.Module):
    """Holds one codebook as `._codebook` (Kyutai's VectorQuantization without projections)."""

    def __init__(self, dim: int, bins: int) -> None:
        super().__init__()
        self._codebook = EuclideanCodebook(dim, bins)


class _VQStack(nn.Module):
    def __init__(self, dim: int, bins: int, n_q: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_VQLayer(dim, bins) for _ in range(n_q)])


class ResidualVectorQuantizer(nn.Module):
    """1x1 conv in, residual nearest-centroid coding over `n_q` codebooks, 1x1 conv out."""

    def __init__(
        self, dimension: int, input_dimension: int, output_dimension: int, n_q: int, bins: int
    ) -> None:
        super().__init__()
        self.input_proj = nn.Conv1d(input_dimension, dimension, 1, bias=False)
        self.output_proj = nn.Conv1d(dimension, output_dimension, 1, bias=False)
        self.vq = _VQStack(dimension, bins, n_q)

    def codebooks(self) -> list[EuclideanCodebook]:
        return [layer._codebook for layer in self.vq.layers]

    def encode(self, x: Tensor, n_q: int) -> Tensor:
        """[B, C, T] latents -> [B, n_q, T] codes."""
        residual = self.input_proj(x.to(self.input_proj.weight.dtype)).float()
        B, D, T = residual.shape
        codes = []
        for codebook in self.codebooks()[:n_q]:
            flat = residual.transpose(1, 2).reshape(-1, D)
            index = codebook.nearest(flat).view(B, T)
            residual = residual - F.embedding(index, codebook.centroids).transpose(1, 2)
            codes.append(index)
        return torch.stack(codes, dim=1)

    def decode(self, codes: Tensor) -> Tensor:
        """[B, K, T] codes -> [B, C_out, T] latents (sum of the K centroids, projected)."""
        books = self.codebooks()
        quantized: Tensor | None = None
        for i in range(codes.shape[1]):
            part = F.embedding(codes[:, i], books[i].centroids)
            quantized = part if quantized is None else quantized + part
        assert quantized is not None
        weight = self.output_proj.weight
        return self.output_proj(quantized.transpose(1, 2).to(weight.dtype))


class SplitResidualVectorQuantizer(nn.Module):
    """`rvq_first` (semantic) and `rvq_rest` (acoustic) quantize the same latent; decoding sums both."""

    def __init__(self, cfg: QuantizerConfig, latent_dimension: int) -> None:
        super().__init__()
        self.n_q_semantic = cfg.n_q_semantic
        self.n_q = cfg.n_q
        self.bins = cfg.bins
        args = (cfg.dimension, latent_dimension, latent_dimension)
        self.rvq_first = ResidualVectorQuantizer(*args, n_q=cfg.n_q_semantic, bins=cfg.bins)
        self.rvq_rest = ResidualVectorQuantizer(*args, n_q=cfg.n_q - cfg.n_q_semantic, bins=cfg.bins)

    def codebooks(self) -> list[EuclideanCodebook]:
        return self.rvq_first.codebooks() + self.rvq_rest.codebooks()

    def encode(self, x: Tensor, num_codebooks: int) -> Tensor:
        codes = self.rvq_first.encode(x, self.n_q_semantic)
        if num_codebooks > self.n_q_semantic:
            codes = torch.cat([codes, self.rvq_rest.encode(x, num_codebooks - self.n_q_semantic)], dim=1)
        return codes

    def decode(self, codes: Tensor) -> Tensor:
        quantized = self.rvq_first.decode(codes[:, : self.n_q_semantic])
        if codes.shape[1] > self.n_q_semantic:
            quantized = quantized + self.rvq_rest.decode(codes[:, self.n_q_semantic :])
        return quantized
