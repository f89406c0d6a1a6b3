"""Presets and downloads: a local model directory, and clear errors from a (loopback) Hub that says no."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from duetaspan.errors import CheckpointError, ConfigError
from duetaspan.model.hub import HubAccessError, fetch_file, fetch_preset_files, fetch_voice, resolve_model_dir
from duetaspan.model.presets import PRESETS, FileSpec, get_preset
from tests.support import free_port, serve_app

GATED = FileSpec(repo="nvidia/personaplex-7b-v1", filename="tokenizer_spm_32k_3.model", gated=True)


def test_presets_cover_the_contract():
    assert {"tiny-random", "duetaspan-7b", "personaplex-7b", "moshi-7b"} <= set(PRESETS)
    tiny = get_preset("tiny-random")
    assert tiny.lm is None and tiny.mimi is None and tiny.tokenizer is None
    ds = get_preset("duetaspan-7b")
    assert (ds.lm.repo, ds.lm.filename) == ("mindlogicinc/context-spanning-7b", "context_spanning_7b.pt")
    assert ds.mimi.filename == "tokenizer-e351c8d8-checkpoint125.safetensors" and ds.mimi.gated
    assert ds.tokenizer.filename == "tokenizer_spm_32k_3.model"
    with pytest.raises(ConfigError, match="choose one of"):
        get_preset("gpt-9")


def test_local_model_dir_flat_and_by_repo(tmp_path, monkeypatch):
    (tmp_path / "context_spanning_7b.pt").write_bytes(b"lm")
    (tmp_path / "personaplex-7b-v1").mkdir()
    for name in ("tokenizer-e351c8d8-checkpoint125.safetensors", "tokenizer_spm_32k_3.model"):
        (tmp_path / "personaplex-7b-v1" / name).write_bytes(b"x")
    (tmp_path / "voices").mkdir()
    (tmp_path / "voices" / "main.pt").write_bytes(b"v")
    files = fetch_preset_files("duetaspan-7b", model_dir=tmp_path)
    assert files.lm == tmp_path / "context_spanning_7b.pt"
    assert files.tokenizer == tmp_path / "personaplex-7b-v1" / "tokenizer_spm_32k_3.model"
    monkeypatch.setenv("DUETASPAN_MODEL_DIR", str(tmp_path))
    assert resolve_model_dir() == tmp_path
    assert fetch_voice("duetaspan-7b", "main") == tmp_path / "voices" / "main.pt"
    with pytest.raises(ConfigError, match="letters, digits"):
        fetch_voice("duetaspan-7b", "../etc/passwd")
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_model_dir(tmp_path / "nope")
    assert fetch_preset_files("tiny-random").lm is None


async def _hub(status: int, headers: dict[str, str]):
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=status, headers=headers, text="no")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    return app


async def test_gated_repo_message(tmp_path):
    app = await _hub(401, {"X-Error-Code": "GatedRepo", "X-Error-Message": "Access to model is restricted"})
    async with serve_app(app) as url:
        with pytest.raises(HubAccessError) as info:
            await asyncio.to_thread(fetch_file, GATED, tmp_path, "hf_fake", url, tmp_path / "cache")
    msg = str(info.value)
    assert "gated" in msg and "HF_TOKEN" in msg and "https://huggingface.co/nvidia/personaplex-7b-v1" in msg
    assert str(tmp_path) in msg  # it says where a manual copy would be picked up
    assert isinstance(info.value, CheckpointError)


async def test_missing_file_and_denied(tmp_path):
    app = await _hub(404, {"X-Error-Code": "EntryNotFound"})
    async with serve_app(app) as url:
        with pytest.raises(HubAccessError, match="no such file"):
            await asyncio.to_thread(fetch_file, GATED, None, None, url, tmp_path / "c1")
    app = await _hub(403, {})
    async with serve_app(app) as url:
        with pytest.raises(HubAccessError, match=r"HTTP 403.*HF_TOKEN"):
            await asyncio.to_thread(fetch_file, GATED, None, None, url, tmp_path / "c2")


def test_offline_message(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    endpoint = f"http://127.0.0.1:{free_port()}"  # never contacted
    with pytest.raises(HubAccessError, match=r"cannot be reached.*--model-dir"):
        fetch_file(GATED, None, None, endpoint, tmp_path / "cache")
