"""Reading and writing language-model checkpoints (DuetaSpan `.pt`, Moshi/PersonaPlex `model.safetensors`).

Accepts Moshi's split key layout (`in_projs.N.weight`) and the older fused one (`in_proj_weight`,
`out_proj.weight`), `_orig_mod.` / `module.` prefixes, dep_q 8 or 16 (detected from the keys; 16 is sliced
to the 8 agent steps, which the causal depformer computes first, so nothing they produce changes). Loading is
strict: a missing or unexpected key, or a shape mismatch, raises `CheckpointError` naming the file and key.
Pickles are read with `weights_only=True` only, so a file that carries code is refused.

Example:
    >>> import tempfile, pathlib, torch
    >>> from duetaspan.model.checkpoint import load_lm, save_lm
    >>> from duetaspan.model.lm import LMModel
    >>> from duetaspan.model.lm_config import LMConfig
    >>> cfg = LMConfig.preset("tiny-random")
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "model.safetensors"
    >>> save_lm(LMModel(cfg), path)
    >>> load_lm(path, cfg).config.dim
    128
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from duetaspan.errors import CheckpointError
from duetaspan.model.lm import LMModel
from duetaspan.model.lm_config import LMConfig

_FUSED = {
    "in_proj_weight": "in_projs",
    "in_proj.weight": "in_projs",
    "out_proj.weight": "out_projs",
}
_FUSED_RE = re.compile(r"^(?P<stack>transformer|depformer)\.layers\.(?P<layer>\d+)\.self_attn\.(?P<name>.+)$")
_LINEARS_RE = re.compile(r"^linears\.(\d+)\.weight$")
# keys indexed by depformer step, with the number of steps they exist for (relative to dep_q)
_STEP_KEYS = [
    (re.compile(r"^depformer\.layers\.\d+\.self_attn\.(?:in|out)_projs\.(\d+)\."), 0),
    (re.compile(r"^depformer\.layers\.\d+\.gating\.(\d+)\."), 0),
    (re.compile(r"^linears\.(\d+)\."), 0),
    (re.compile(r"^depformer_emb\.(\d+)\."), -1),
]
_DEPFORMER_IN_RE = re.compile(r"^depformer_in\.(\d+)\.")
_PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def default_dtype(device: torch.device | str) -> torch.dtype:
    """bfloat16 on CUDA, float32 elsewhere."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def build_lm(
    config: LMConfig | str, device: torch.device | str = "meta", dtype: torch.dtype | None = None
) -> LMModel:
    """Build an `LMModel` for a config or preset name, by default on the `meta` device (no memory).

    >>> build_lm("duetaspan-7b").text_emb.weight.shape
    torch.Size([32001, 4096])
    """
    cfg = LMConfig.preset(config) if isinstance(config, str) else config
    return LMModel(cfg, device=device, dtype=dtype or torch.bfloat16).eval()


def _resolve(path: Path) -> Path:
    if path.is_dir():
        found = [p for p in sorted(path.iterdir()) if p.suffix in (".safetensors", *_PICKLE_SUFFIXES)]
        if len(found) != 1:
            raise CheckpointError(
                f"{path}: expected exactly one .safetensors/.pt file, found {[p.name for p in found]}"
            )
        return found[0]
    if not path.exists():
        raise CheckpointError(f"{path}: checkpoint file not found")
    return path


def read_state_dict(path: str | Path, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The raw tensors of a checkpoint file (safetensors, or a weights-only pickle / `{"model": ...}`)."""
    path = _resolve(Path(path))
    if path.suffix == ".safetensors":
        try:
            return load_file(str(path), device=str(device))
        except Exception as exc:
            raise CheckpointError(
                f"{path}: cannot read safetensors ({exc}); the file may be truncated or corrupt"
            ) from None
    try:
        obj = torch.load(path, map_location=device, weights_only=True, mmap=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{path}: refused to load, the pickle contains more than tensors (weights_only=True): "
            f"{str(exc).splitlines()[0]}"
        ) from None
    except Exception as exc:
        raise CheckpointError(
            f"{path}: cannot read checkpoint ({exc}); the file may be truncated or corrupt"
        ) from None
    for wrapper in ("model", "state_dict"):
        if isinstance(obj, Mapping) and isinstance(obj.get(wrapper), Mapping):
            obj = obj[wrapper]
    if isinstance(obj, Mapping) and isinstance(obj.get("fsdp_best_state"), Mapping):
        obj = obj["fsdp_best_state"].get("model", obj)
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path}: expected a state dict of tensors (or {{'model': state_dict}})")
    return dict(obj)


def detect_dep_q(state: Mapping[str, torch.Tensor], source: str = "<state dict>") -> int:
    """The number of depformer steps a (prefix-stripped) state dict was trained with."""
    steps = {int(m.group(1)) for k in state if (m := _LINEARS_RE.match(k))}
    if not steps:
        raise CheckpointError(f"{source}: no 'linears.N.weight' keys, cannot tell the depformer size (dep_q)")
    return max(steps) + 1


def _strip(key: str) -> str:
    key = key.replace("_orig_mod.", "")
    while key.startswith("module."):
        key = key[len("module.") :]
    return key


def normalize_state_dict(
    state: Mapping[str, torch.Tensor], config: LMConfig, source: str = "<state dict>"
) -> dict[str, torch.Tensor]:
    """Map a Moshi/PersonaPlex state dict to `LMModel`'s keys: strip prefixes, split fused attention
    weights, and keep only the first `config.gen_q` depformer steps. Works on meta tensors too."""
    stripped = {_strip(k): v for k, v in state.items()}
    dep_q = detect_dep_q(stripped, source)
    gen_q = config.gen_q
    if dep_q < gen_q:
        raise CheckpointError(f"{source}: depformer has {dep_q} steps, the runtime needs at least {gen_q}")
    out: dict[str, torch.Tensor] = {}
    for key, value in stripped.items():
        m = _FUSED_RE.match(key)
        if m and m.group("name") in _FUSED:
            mult = dep_q if m.group("stack") == "depformer" else 1
            if value.shape[0] % mult:
                raise CheckpointError(
                    f"{source}: key {key!r} of shape {tuple(value.shape)} does not split into {mult}"
                )
            parts = value.reshape(mult, -1, *value.shape[1:])
            prefix = f"{m.group('stack')}.layers.{m.group('layer')}.self_attn.{_FUSED[m.group('name')]}"
            for i in range(mult):
                out[f"{prefix}.{i}.weight"] = parts[i]
        else:
            out[key] = value
    sliced: dict[str, torch.Tensor] = {}
    multi_in = sum(1 for k in out if _DEPFORMER_IN_RE.match(k)) > 1
    for key, value in out.items():
        limit = None
        for pattern, rel in _STEP_KEYS:
            if m := pattern.match(key):
                limit, index = gen_q + rel, int(m.group(1))
                break
        if limit is None and multi_in and (m := _DEPFORMER_IN_RE.match(key)):
            limit, index = gen_q, int(m.group(1))
        if limit is not None and index >= limit:
            continue
        sliced[key] = value
    return sliced


def load_state_dict_strict(
    model: LMModel,
    state: Mapping[str, torch.Tensor],
    source: str = "<state dict>",
    dtype: torch.dtype | None = None,
) -> None:
    """Load a normalised state dict, refusing any missing/unexpected key or shape mismatch."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing key(s), e.g. {missing[:5]}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected key(s), e.g. {unexpected[:5]}")
        raise CheckpointError(f"{source}: does not match the LM config: {'; '.join(parts)}")
    for key, want in expected.items():
        got = state[key]
        if tuple(got.shape) != tuple(want.shape):
            raise CheckpointError(
                f"{source}: key {key!r} has shape {tuple(got.shape)}, the config expects {tuple(want.shape)}"
            )
    cast = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v) for k, v in state.items()}
    model.load_state_dict(cast, strict=True, assign=True)


def _match_preset(state: Mapping[str, torch.Tensor], dep_q: int, source: str) -> LMConfig:
    text = state.get("text_emb.weight")
    n_layers = len({k.split(".")[2] for k in state if k.startswith("transformer.layers.")})
    for name in LMConfig.preset_names():
        cfg = LMConfig.preset(name)
        if (
            text is not None
            and tuple(text.shape) == (cfg.text_card + 1, cfg.dim)
            and n_layers == cfg.num_layers
        ):
            return cfg.model_copy(update={"dep_q": dep_q})
    raise CheckpointError(
        f"{source}: no config.json next to it and no preset matches its shapes; pass config=LMConfig(...)"
    )


def load_lm(
    path: str | Path,
    config: LMConfig | str | Path | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> LMModel:
    """Load an `LMModel` from a `.pt` / `.safetensors` checkpoint (or a folder holding one).

    `config` is an `LMConfig`, a preset name, or a `config.json` path; None reads `config.json` beside the
    file, else picks the preset whose shapes match. dep_q always comes from the file's keys.

    The file is read on the CPU, memory-mapped (safetensors, and pickles with `mmap=True`), so tensors the
    model does not keep (dep_q 16 -> 8) are never read; slicing and the cast happen there too, and only the
    final weights move to `device`: peak device memory during the load is the model itself.
    """
    path = _resolve(Path(path))
    source = str(path)
    if isinstance(config, Path) or (isinstance(config, str) and config.endswith(".json")):
        config = LMConfig.from_json(config)
    elif isinstance(config, str):
        config = LMConfig.preset(config)
    elif config is None and (path.parent / "config.json").is_file():
        config = LMConfig.from_json(path.parent / "config.json")
    dtype = dtype or default_dtype(device)
    raw = read_state_dict(path, "cpu")
    stripped = {_strip(k): v for k, v in raw.items()}
    dep_q = detect_dep_q(stripped, source)
    if config is None:
        config = _match_preset(stripped, dep_q, source)
    elif config.dep_q != dep_q:
        config = config.model_copy(update={"dep_q": dep_q})
    model = LMModel(config, device="meta", dtype=dtype)
    state = normalize_state_dict(stripped, config, source)
    load_state_dict_strict(model, state, source, dtype)
    return model.to(device).eval()


def save_lm(model: LMModel, path: str | Path) -> None:
    """Write the model's weights in Moshi's split layout: `.safetensors`, or `{"model": state_dict}` for `.pt`."""
    path = Path(path)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if path.suffix == ".safetensors":
        save_file(state, str(path))
    else:
        torch.save({"model": state}, path)
