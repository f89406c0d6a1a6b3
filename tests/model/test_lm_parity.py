"""Parity of our LM with Kyutai's moshi==0.2.13: checkpoint layouts (split/fused, dep_q 8/16, 7B on meta)
load strictly, and greedy generation matches moshi's `LMGen` token for token."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from duetaspan.model.checkpoint import build_lm, load_lm, normalize_state_dict
from duetaspan.model.lm_config import LMConfig
from tests.model.lm_helpers import fuse_attention, greedy_generator, moshi_model, small_config

pytestmark = [pytest.mark.parity, pytest.mark.usefixtures("one_thread")]
moshi = pytest.importorskip("moshi")

FRAMES = 100


def _moshi_reference(sd: dict[str, torch.Tensor], config: LMConfig, user: torch.Tensor) -> torch.Tensor:
    """moshi LMGen (greedy, same-tick, out-of-sync warm-up) on the first 8 depformer steps of `sd`."""
    from moshi.models.lm import LMGen

    ref = moshi_model(config.model_copy(update={"dep_q": 8}))
    # Split-layout names are identical for steps 0-7, so slicing is just taking the keys an 8-step model has.
    ref.load_state_dict({k: sd[k] for k in ref.state_dict()}, strict=True)
    gen = LMGen(ref, use_sampling=False, support_out_of_sync=True)
    rows = []
    with gen.streaming(1):
        for t in range(user.shape[0]):
            rows.append(gen.step(user[t][None, :, None])[0, :, 0])
    return torch.stack(rows)


def _ours(path: Path, config: LMConfig, user: torch.Tensor) -> torch.Tensor:
    model = load_lm(path, config, device="cpu", dtype=torch.float32)
    gen = greedy_generator(model)
    rows = []
    for t in range(user.shape[0]):
        out = gen.step(user[t][None])
        rows.append(torch.cat([out.text, out.agent_codes[0]]))
    return torch.stack(rows)


@pytest.mark.parametrize(
    ("dep_q", "layout"), [(8, "split"), (8, "fused"), (16, "split"), (16, "fused")], ids=lambda v: str(v)
)
def test_greedy_generation_matches_moshi(tmp_path: Path, dep_q: int, layout: str) -> None:
    # context 48 < 100 frames: the KV ring wraps during the comparison.
    config = small_config(context=48, dep_q=dep_q)
    sd = moshi_model(config, seed=dep_q).state_dict()
    saved = fuse_attention(sd) if layout == "fused" else sd
    if layout == "fused":
        # The fused names are the ones moshi's own _load_hook accepts.
        moshi_model(config).load_state_dict(dict(saved), strict=True)
        path = tmp_path / "model.pt"
        torch.save({"model": {f"_orig_mod.{k}": v for k, v in saved.items()}}, path)
    else:
        path = tmp_path / "model.safetensors"
        save_file({k: v.contiguous() for k, v in saved.items()}, str(path))

    user = torch.randint(0, 2048, (FRAMES, 8), generator=torch.Generator().manual_seed(7))
    expected = _moshi_reference(sd, config, user)
    got = _ours(path, config, user)
    assert (expected[:1] == -2).all() and (expected[1:] >= 0).all()
    # A random model must still say something varied, or the comparison would be vacuous.
    assert len(set(expected[:, 0].tolist())) > 3 and len(set(expected[:, 1].tolist())) > 3
    assert torch.equal(got, expected), (got != expected).nonzero()[:5]


def test_tiny_preset_matches_moshi_at_full_context(tmp_path: Path) -> None:
    config = LMConfig.preset("tiny-random")
    sd = moshi_model(config, seed=3).state_dict()
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    user = torch.randint(0, 2048, (40, 8), generator=torch.Generator().manual_seed(1))
    assert torch.equal(_ours(path, config, user), _moshi_reference(sd, config, user))


@pytest.mark.parametrize(
    ("preset", "fused"), [("duetaspan-7b", False), ("personaplex-7b", True), ("moshi-7b", False)]
)
def test_full_7b_layout_on_meta_loads_without_missing_or_unexpected_keys(preset: str, fused: bool) -> None:
    from moshi.models.lm import LMModel as MoshiLM

    config = LMConfig.preset(preset)
    theirs = MoshiLM(**config.to_lm_kwargs(), device="meta", dtype=torch.bfloat16).state_dict()
    if fused:
        theirs = fuse_attention(theirs)
    mapped = normalize_state_dict(theirs, config, preset)
    ours = build_lm(config).state_dict()
    assert set(mapped) == set(ours)
    assert {k: tuple(v.shape) for k, v in mapped.items()} == {k: tuple(v.shape) for k, v in ours.items()}
    n_params = sum(v.numel() for v in ours.values())
    assert 7.6e9 < n_params < 7.8e9  # the dep_q=8 slice of the 7B (moshi.md §5.6: 7.6877 B)
