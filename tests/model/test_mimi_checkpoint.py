"""Mimi checkpoint files: the released layout round-trips, and broken files fail with the file and key named."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from duetaspan.errors import CheckpointError
from duetaspan.model.mimi import MimiStream, load_mimi, random_mimi, save_mimi

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model = random_mimi("tiny", seed=9)
    path = save_mimi(model, tmp_path_factory.mktemp("ckpt") / "mimi.safetensors")
    return model, path


def _codes(model, seed=0):
    pcm = 0.3 * torch.randn(2, 1, 2 * 1920, generator=torch.Generator().manual_seed(seed))
    stream = MimiStream(model, 2)
    codes = stream.encode(pcm)
    return codes, stream.decode(codes)


def test_released_layout_round_trips(saved):
    model, path = saved
    keys = set(load_file(str(path)))
    assert "encoder_transformer.transformer.layers.0.self_attn.in_proj_weight" in keys
    assert "decoder_transformer.transformer.layers.0.self_attn.out_proj.weight" in keys
    assert "quantizer.rvq_rest.vq.layers.6._codebook.embedding_sum" in keys
    loaded = load_mimi(path, "tiny")
    assert set(loaded.state_dict()) == set(model.state_dict())
    want, got = _codes(model), _codes(loaded)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


def test_split_projection_names_also_load(saved, tmp_path):
    model, _ = saved
    path = tmp_path / "split.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    assert torch.equal(_codes(load_mimi(path, "tiny"))[0], _codes(model)[0])


def test_num_codebooks_is_configurable(saved):
    _, path = saved
    model = load_mimi(path, "tiny", num_codebooks=4)
    assert MimiStream(model, 1).encode(torch.zeros(1, 1, 1920)).shape == (1, 4, 1)


def _rewrite(path, tmp_path, edit) -> str:
    state = load_file(str(path))
    edit(state)
    out = tmp_path / "edited.safetensors"
    save_file(state, str(out))
    return out


def test_missing_key_is_named(saved, tmp_path):
    key = "decoder.model.0.conv.conv.bias"
    bad = _rewrite(saved[1], tmp_path, lambda s: s.pop(key))
    with pytest.raises(CheckpointError, match=rf"edited\.safetensors: missing key '{key}'"):
        load_mimi(bad, "tiny")


def test_wrong_shape_is_named(saved, tmp_path):
    key = "quantizer.rvq_first.input_proj.weight"
    bad = _rewrite(saved[1], tmp_path, lambda s: s.update({key: torch.zeros(3, 3, 1)}))
    with pytest.raises(CheckpointError, match=rf"edited\.safetensors: key '{key}' has shape \[3, 3, 1\]"):
        load_mimi(bad, "tiny")


def test_unexpected_key_is_named(saved, tmp_path):
    bad = _rewrite(saved[1], tmp_path, lambda s: s.update({"encoder.extra.weight": torch.zeros(1)}))
    with pytest.raises(CheckpointError, match=r"unexpected key 'encoder\.extra\.weight'"):
        load_mimi(bad, "tiny")


def test_wrong_architecture_is_reported(saved):
    with pytest.raises(CheckpointError, match=r"mimi\.safetensors: (missing key|key .* has shape)"):
        load_mimi(saved[1], "mimi")


def test_truncated_file_names_file_and_key(saved, tmp_path):
    data = saved[1].read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(data[:-100])
    with pytest.raises(
        CheckpointError, match=r"cut\.safetensors: truncated: key '[\w.]+' needs 100 more bytes"
    ):
        load_mimi(cut, "tiny")
    cut.write_bytes(data[:20])
    with pytest.raises(CheckpointError, match=r"cut\.safetensors: not a readable safetensors file"):
        load_mimi(cut, "tiny")


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match=r"nope\.safetensors: Mimi checkpoint not found"):
        load_mimi(tmp_path / "nope.safetensors")
