"""Checkpoint loading (layouts, prefixes, config discovery) and its refusals, plus `LMConfig` validation."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from duetaspan.errors import CheckpointError, ConfigError
from duetaspan.model.checkpoint import build_lm, detect_dep_q, load_lm, read_state_dict, save_lm
from duetaspan.model.lm import LMModel
from duetaspan.model.lm_config import LMConfig
from tests.model.lm_helpers import fuse_attention, random_model, small_config


class _RunsCode:
    """Unpickling this calls a function: exactly what weights_only=True must refuse."""

    def __reduce__(self):
        return (print, ("this pickle ran code",))


@pytest.fixture
def cfg() -> LMConfig:
    return small_config()


@pytest.fixture
def model(cfg: LMConfig) -> LMModel:
    return random_model(cfg, seed=7)


def _same_weights(a: LMModel, b: LMModel) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_round_trip_in_both_formats(tmp_path: Path, cfg: LMConfig, model: LMModel, suffix: str) -> None:
    path = tmp_path / f"model{suffix}"
    save_lm(model, path)
    if suffix == ".pt":
        assert set(torch.load(path, weights_only=True)) == {"model"}
    assert _same_weights(load_lm(path, cfg), model)


def test_prefixes_fused_keys_and_16_step_depformer_are_normalised(tmp_path: Path, cfg: LMConfig) -> None:
    cfg16 = cfg.model_copy(update={"dep_q": 16})
    big = random_model(cfg16.model_copy(update={"dep_q": 8}), seed=1).state_dict()
    # Fabricate steps 8-15 (they must be dropped) and write the fused, prefixed layout of a dep_q=16 file.
    state = dict(big)
    for key, value in big.items():
        m = re.match(
            r"^(linears|depformer_in|depformer_emb|depformer\.layers\.\d+\.(?:self_attn\.\w+_projs|gating))\.(\d+)\.(.*)$",
            key,
        )
        if m:
            state[f"{m[1]}.{int(m[2]) + 8}.{m[3]}"] = torch.randn_like(value)
    state["depformer_emb.7.weight"] = torch.randn_like(big["depformer_emb.0.weight"])
    fused = {f"module._orig_mod.{k}": v for k, v in fuse_attention(state).items()}
    assert detect_dep_q({k.split("_orig_mod.")[1]: v for k, v in fused.items()}) == 16
    path = tmp_path / "duetaspan.pt"
    torch.save({"model": fused}, path)
    loaded = load_lm(path, cfg)
    assert loaded.config.dep_q == 16 and len(loaded.linears) == 8
    reference = random_model(cfg, seed=1)
    assert _same_weights(loaded, reference)


def test_config_json_beside_the_file_or_a_matching_preset(
    tmp_path: Path, cfg: LMConfig, model: LMModel
) -> None:
    save_lm(model, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(
        json.dumps({"moshi_name": "model.safetensors", **cfg.to_lm_kwargs()})
    )
    assert load_lm(tmp_path).config.dim == cfg.dim  # a folder with one weights file
    tiny = LMModel(LMConfig.preset("tiny-random"))
    save_lm(tiny, tmp_path / "tiny.safetensors")
    (tmp_path / "config.json").unlink()
    assert load_lm(tmp_path / "tiny.safetensors").config == LMConfig.preset("tiny-random")
    with pytest.raises(CheckpointError, match="no preset matches"):
        load_lm(tmp_path / "model.safetensors")


def test_truncated_files_raise_checkpoint_error_naming_the_file(tmp_path: Path, model: LMModel) -> None:
    for suffix in (".safetensors", ".pt"):
        path = tmp_path / f"model{suffix}"
        save_lm(model, path)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        with pytest.raises(CheckpointError, match=r"model\.\w+.*truncated or corrupt"):
            read_state_dict(path)


def test_pickle_with_code_is_refused(tmp_path: Path, capsys) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"model": {"text_emb.weight": torch.zeros(2, 2)}, "payload": _RunsCode()}, path)
    with pytest.raises(CheckpointError, match=r"evil\.pt: refused.*weights_only"):
        load_lm(path, "tiny-random")
    assert "ran code" not in capsys.readouterr().out
    plain = tmp_path / "plain.pt"
    plain.write_bytes(pickle.dumps({"model": 1}))
    with pytest.raises(CheckpointError, match=r"plain\.pt"):
        load_lm(plain, "tiny-random")


def test_shape_mismatch_and_missing_or_unexpected_keys(tmp_path: Path, cfg: LMConfig, model: LMModel) -> None:
    path = tmp_path / "model.safetensors"
    save_lm(model, path)
    wider = cfg.model_copy(update={"dim": 128})
    with pytest.raises(
        CheckpointError, match=r"model\.safetensors: key 'emb\.0\.weight' has shape \(2049, 64\)"
    ):
        load_lm(path, wider)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    missing = dict(state)
    del missing["transformer.layers.1.gating.linear_out.weight"]
    save_file(missing, str(tmp_path / "missing.safetensors"))
    with pytest.raises(
        CheckpointError, match=r"missing.safetensors.*missing key.*layers\.1\.gating\.linear_out"
    ):
        load_lm(tmp_path / "missing.safetensors", cfg)
    save_file({**state, "extra_heads.0.weight": torch.zeros(6, 64)}, str(tmp_path / "extra.safetensors"))
    with pytest.raises(CheckpointError, match=r"extra.safetensors.*unexpected key.*extra_heads\.0\.weight"):
        load_lm(tmp_path / "extra.safetensors", cfg)
    with pytest.raises(CheckpointError, match="not found"):
        load_lm(tmp_path / "nope.pt", cfg)


def test_lm_config_presets_and_validation(tmp_path: Path) -> None:
    dp = LMConfig.preset("duetaspan-7b")
    assert (dp.ffn_hidden, dp.depformer_ffn_hidden, dp.norm_eps, dp.dep_q) == (11264, 2816, 1e-8, 16)
    assert LMConfig.preset("moshi-7b").dep_q == 8
    tiny = LMConfig.preset("tiny-random")
    assert tiny.text_card == 1024 and tiny.context == 3000 and tiny.num_layers == 2
    assert LMConfig.from_lm_kwargs(dp.to_lm_kwargs()) == dp
    with pytest.raises(ConfigError, match="bogus"):
        LMConfig.from_lm_kwargs({**dp.to_lm_kwargs(), "bogus": 1})
    with pytest.raises(ConfigError, match="layer_scale"):
        LMConfig.from_lm_kwargs({**dp.to_lm_kwargs(), "layer_scale": 0.01})
    with pytest.raises(ConfigError, match="delays"):
        LMConfig.from_lm_kwargs({**dp.to_lm_kwargs(), "delays": [0, 1]})
    with pytest.raises(ConfigError, match="dim"):
        LMConfig.from_lm_kwargs({**dp.to_lm_kwargs(), "dim": "wide"})
    with pytest.raises(ConfigError, match="unknown LM preset"):
        LMConfig.preset("gpt-5")
    (tmp_path / "config.json").write_text(json.dumps({"lm_kwargs": tiny.to_lm_kwargs()}))
    assert LMConfig.from_json(tmp_path / "config.json") == tiny
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match=r"bad\.json"):
        LMConfig.from_json(tmp_path / "bad.json")
    assert build_lm("moshi-7b").linears[0].weight.device.type == "meta"
