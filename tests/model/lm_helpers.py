"""Shared helpers for the LM tests: small seeded configs, Moshi reference models and key-layout rewrites."""

from __future__ import annotations

import os
import re

import torch

from duetaspan.model.generator import LMGenerator
from duetaspan.model.lm import LMModel
from duetaspan.model.lm_config import LMConfig
from duetaspan.model.sampling import SamplingParams

os.environ.setdefault("NO_TORCH_COMPILE", "1")
os.environ.setdefault("NO_CUDA_GRAPH", "1")


def small_config(context: int = 48, dep_q: int = 8, **over) -> LMConfig:
    """A very small Moshi-shaped config (fast on 2 CPU cores)."""
    base = LMConfig.preset("tiny-random")
    upd = {
        "dim": 64,
        "num_heads": 4,
        "context": context,
        "dep_q": dep_q,
        "depformer_dim": 32,
        "depformer_num_heads": 4,
        "depformer_dim_feedforward": int(4.125 * 32),
    }
    upd.update(over)
    return base.model_copy(update=upd)


def random_model(config: LMConfig, seed: int = 0) -> LMModel:
    """Our LMModel with seeded weights scaled like Moshi's init (std 1/sqrt(fan_in)), so logits vary."""
    torch.manual_seed(seed)
    model = LMModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("alpha"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5)
    return model.eval()


def greedy_generator(model: LMModel, batch: int = 1, max_span: int = 16) -> LMGenerator:
    gen = LMGenerator(model, batch, max_span=max_span)
    for slot in range(batch):
        gen.set_sampling(slot, SamplingParams.greedy())
    return gen


def moshi_model(config: LMConfig, seed: int = 0):
    """moshi 0.2.13's LMModel for `config` (seeded random init)."""
    from moshi.models.lm import LMModel as MoshiLM

    torch.manual_seed(seed)
    return MoshiLM(**config.to_lm_kwargs()).eval()


_SPLIT = re.compile(r"^(?P<p>.*self_attn)\.(?P<kind>in|out)_projs\.(?P<i>\d+)\.weight$")


def fuse_attention(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rewrite a split-layout state dict to the older fused names moshi's `_load_hook` accepts
    (`self_attn.in_proj_weight` [mult*3*dim, dim], `self_attn.out_proj.weight` [mult*dim, dim])."""
    groups: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        m = _SPLIT.match(key)
        if m:
            groups.setdefault((m["p"], m["kind"]), {})[int(m["i"])] = value
        else:
            out[key] = value
    for (prefix, kind), parts in groups.items():
        name = "in_proj_weight" if kind == "in" else "out_proj.weight"
        out[f"{prefix}.{name}"] = torch.cat([parts[i] for i in range(len(parts))], dim=0)
    return out
