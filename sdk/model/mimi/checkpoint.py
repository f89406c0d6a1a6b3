"""Mimi weights on disk and in tests: strict checkpoint loading, saving in the released layout, random init.

`load_mimi` accepts the released safetensors layout (fused attention projections, older codebook names) and
ours, and names the file and key of anything missing, extra, misshapen or truncated. `random_mimi` builds a
seeded model whose codebooks are calibrated to real-scale latents, for tests and demos.

Example:
    >>> from duetaspan.model.mimi.checkpoint import random_mimi
    >>> random_mimi("tiny", seed=1).config.frame_size
    1920
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from duetaspan.errors import CheckpointError
from duetaspan.model.mimi.codec import MimiModel
from duetaspan.model.mimi.config import MimiConfig

# Released / older checkpoints store each attention projection fused under these names (one weight step).
_LEGACY_ATTENTION = (
    (re.compile(r"(.*\.self_attn\.)in_proj_weight$"), r"\1in_projs.0.weight"),
    (re.compile(r"(.*\.self_attn\.)in_proj\.weight$"), r"\1in_projs.0.weight"),
    (re.compile(r"(.*\.self_attn\.)out_proj\.weight$"), r"\1out_projs.0.weight"),
)
_LEGACY_CODEBOOK = {"inited": "_initialized", "cluster_size": "cluster_usage", "embed_avg": "embedding_sum"}
_LEGACY_CODEBOOK["embed_sum"] = "embedding_sum"
_TRAINING_PREFIXES = ("module.", "_orig_mod.")


def _canonical_key(key: str) -> str:
    for prefix in _TRAINING_PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix) :]
    for pattern, target in _LEGACY_ATTENTION:
        if pattern.match(key):
            return pattern.sub(target, key)
    head, _, leaf = key.rpartition(".")
    if head.endswith("_codebook") and leaf in _LEGACY_CODEBOOK:
        return f"{head}.{_LEGACY_CODEBOOK[leaf]}"
    return key


def _diagnose(path: Path, exc: Exception) -> str:
    """Say which tensor a truncated file cuts off, when its header is still readable."""
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            if header_len <= 0 or 8 + header_len > size:
                raise ValueError("header cut off")
            header = json.loads(f.read(header_len))
        ends = sorted((meta["data_offsets"][1], key) for key, meta in header.items() if key != "__metadata__")
    except (ValueError, KeyError, TypeError, IndexError):
        return f"not a readable safetensors file ({exc}); it may be truncated or corrupt, download it again"
    available = size - 8 - header_len
    for end, key in ends:
        if end > available:
            return (
                f"truncated: key {key!r} needs {end - available} more bytes of data (file is {size} bytes); "
                "download it again"
            )
    return f"not a readable safetensors file ({exc}); download it again"


def _resolve_config(config: MimiConfig | str | None, num_codebooks: int | None) -> MimiConfig:
    cfg = MimiConfig.preset(config) if isinstance(config, str) else (config or MimiConfig())
    if num_codebooks is not None and num_codebooks != cfg.num_codebooks:
        cfg = cfg.model_copy(update={"num_codebooks": num_codebooks})
        cfg = MimiConfig.model_validate(cfg.model_dump())
    return cfg


def load_mimi(
    path: str | Path,
    config: MimiConfig | str | None = None,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    num_codebooks: int | None = 8,
) -> MimiModel:
    """Load a Mimi safetensors checkpoint (the released layout or ours) strictly into a `MimiModel`.

    Every key must be present with the right shape and nothing may be left over; otherwise `CheckpointError`
    names the file and the key. Codebooks stay float32 whatever `dtype` is.

    >>> model = load_mimi("tokenizer-e351c8d8-checkpoint125.safetensors", device="cuda")  # doctest: +SKIP
    """
    path = Path(path)
    cfg = _resolve_config(config, num_codebooks)
    if not path.is_file():
        raise CheckpointError(f"{path}: Mimi checkpoint not found")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            raw = {key: f.get_tensor(key) for key in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: {_diagnose(path, exc)}") from exc
    state: dict[str, Tensor] = {}
    for key, tensor in raw.items():
        name = _canonical_key(key)
        if name in state:
            raise CheckpointError(f"{path}: key {key!r} duplicates {name!r}")
        state[name] = tensor
    with torch.device("meta"):
        model = MimiModel(cfg)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(
            f"{path}: missing key {missing[0]!r}{more}; is this a Mimi checkpoint for the "
            f"{'released' if cfg == MimiConfig() else 'configured'} architecture?"
        )
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise CheckpointError(f"{path}: unexpected key {unexpected[0]!r}{more} for this Mimi config")
    for name, shape in expected.items():
        got = tuple(state[name].shape)
        if got != shape:
            raise CheckpointError(f"{path}: key {name!r} has shape {list(got)}, expected {list(shape)}")
    model.load_state_dict(state, strict=True, assign=True)
    return _finish(model, device, dtype)


def _finish(model: MimiModel, device: torch.device | str, dtype: torch.dtype) -> MimiModel:
    model.to(device=device, dtype=dtype)
    model.quantizer.float()  # nearest-centroid search needs float32 centroids
    for codebook in model.quantizer.codebooks():
        codebook.invalidate()
    model.eval()
    model.requires_grad_(False)
    return model


def random_mimi(
    config: MimiConfig | str | None = "tiny",
    *,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    num_codebooks: int | None = None,
) -> MimiModel:
    """A Mimi with seeded random weights and noise codebooks (so codes are not all zero), for tests and demos.

    The global RNG is left untouched.

    >>> random_mimi("tiny", seed=1).config.frame_size
    1920
    """
    cfg = _resolve_config(config, num_codebooks)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MimiModel(cfg).eval()
        # Centroids drawn at the scale of real latents, so codes follow the input instead of sticking to the
        # smallest-norm centroid.
        t = torch.arange(25 * cfg.frame_size, dtype=torch.float32) / cfg.sample_rate
        probe = 0.3 * torch.sin(2 * torch.pi * (110 + 700 * t) * t) + 0.05 * torch.randn(t.shape)
        with torch.no_grad():
            latents = model.encode_latent(probe.view(1, 1, -1))
        calibrate_codebooks(model.quantizer, latents, seed=seed)
    return _finish(model, device, dtype)


def calibrate_codebooks(quantizer: nn.Module, latents: Tensor, seed: int = 0) -> None:
    """Fill a split RVQ's codebooks (ours or Kyutai's: same names) with seeded Gaussian centroids matched, level
    by level, to the mean and spread of the residuals of `latents` ([B, C, T]); mark them initialized."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for rvq in (quantizer.rvq_first, quantizer.rvq_rest):
            proj = rvq.input_proj
            residual = proj(latents.to(proj.weight.dtype)).float()
            residual = residual.transpose(1, 2).reshape(-1, residual.shape[1]).cpu()
            for layer in rvq.vq.layers:
                book = layer._codebook
                bins, dim = book.embedding_sum.shape
                spread = residual.std(dim=0, keepdim=True) if residual.shape[0] > 1 else residual.abs() + 1e-3
                centroids = (
                    residual.mean(dim=0, keepdim=True) + torch.randn(bins, dim, generator=gen) * spread
                )
                book.embedding_sum.copy_(centroids)
                book.cluster_usage.fill_(1.0)
                book._initialized.fill_(1.0)
                residual = residual - centroids[torch.cdist(residual, centroids).argmin(dim=-1)]
    _forget_centroids(quantizer)


def _forget_centroids(model: nn.Module) -> None:
    # Both implementations cache derived centroids; ours as `_centroids`, Kyutai's as the `_embedding` buffer.
    for module in model.modules():
        for attr in ("_centroids", "_embedding"):
            if hasattr(module, attr):
                setattr(module, attr, None)


def fill_codebooks(model: nn.Module, seed: int = 0, scale: float = 1.0) -> None:
    """Fill every Mimi codebook (ours or Kyutai's) with seeded Gaussian centroids and mark it initialized."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("_codebook.embedding_sum"):
                buf.copy_(torch.randn(buf.shape, generator=gen) * scale)
            elif name.endswith("_codebook.cluster_usage"):
                buf.fill_(1.0)
            elif name.endswith("_codebook._initialized"):
                buf.fill_(1.0)
    _forget_centroids(model)


def released_state_dict(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Rename a `MimiModel.state_dict()` to the released file layout (fused `in_proj_weight`, `out_proj.weight`)."""
    out = {}
    for key, tensor in state.items():
        key = re.sub(r"\.self_attn\.in_projs\.0\.weight$", ".self_attn.in_proj_weight", key)
        key = re.sub(r"\.self_attn\.out_projs\.0\.weight$", ".self_attn.out_proj.weight", key)
        out[key] = tensor.detach().to("cpu").contiguous()
    return out


def save_mimi(model: nn.Module, path: str | Path) -> Path:
    """Write a Mimi's weights as safetensors in the released layout (loadable by `load_mimi` and by moshi)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(released_state_dict(model.state_dict()), str(path))
    return path
