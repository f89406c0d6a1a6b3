"""The GPU path at full size and across devices, on a CPU (issue 13): one tick, one span prefill and one
persona prefill of the FULL duetaspan-7b shape on the `meta` device in the GPU dtypes; every public entry
given CPU inputs while the model lives elsewhere (`meta`); `load_lm` moves only the final weights."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch.utils._python_dispatch import TorchDispatchMode

from duetaspan.cli import main as cli_main
from duetaspan.model.audio import write_wav
from duetaspan.model.checkpoint import load_lm
from duetaspan.model.engine import DuplexEngine, Persona
from duetaspan.model.graphs import EmulatedGraphBackend
from duetaspan.model.lm import LMModel
from duetaspan.model.lm_config import LMConfig
from duetaspan.model.mimi import MimiModel, MimiStream
from duetaspan.model.mimi.checkpoint import _finish, _resolve_config
from duetaspan.model.tokenizer import TextTokenizer
from tests.model.engine_support import GREEDY
from tests.model.lm_helpers import random_model, small_config

pytestmark = pytest.mark.cuda_logic

META = torch.device("meta")


def meta_engine(lm_preset: str, mimi: str, tmp_path: Path, **kw) -> DuplexEngine:
    """An engine whose weights live on `meta` in the dtypes a GPU load gives (LM bf16, Mimi float32)."""
    lm = LMModel(LMConfig.preset(lm_preset), device=META, dtype=torch.bfloat16).eval()
    with torch.device(META):
        codec = MimiModel(_resolve_config(mimi, 8))
    codec = _finish(codec, META, torch.float32)
    return DuplexEngine(lm, codec, TextTokenizer.tiny(tmp_path), **kw)


@pytest.fixture
def voice_wav(tmp_path: Path) -> Path:
    t = np.arange(24000) / 24000
    path = tmp_path / "voice.wav"
    write_wav(path, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 24000)
    return path


@pytest.mark.timeout(600)
def test_full_7b_tick_span_and_persona_prefill_on_meta(tmp_path, voice_wav):
    backend = EmulatedGraphBackend(META)  # the graph path too, at full size
    eng = meta_engine("duetaspan-7b", "mimi", tmp_path, max_slots=2, max_span=64, graph_backend=backend)
    cfg = eng.lm.config
    assert (cfg.dim, cfg.num_layers, cfg.text_card) == (4096, 32, 32000)
    assert eng.lm.dtype == torch.bfloat16 and eng.lm.kv.kv.dtype == torch.bfloat16
    assert eng.batch.graph_count == 4 and backend.captures == 4
    slot = eng.open_slot(Persona(text="You are Ada, a booking assistant.", voice=voice_wav), seed=1)
    frames, _ = eng.prompt_stats(slot)
    assert frames > 13 and eng.lm.offset(slot) == frames  # voice (1 s = 13 frames) + text, one pass
    assert eng.inject(slot, "It is 22 degrees and sunny in Sydney.")
    out = eng.step({slot: np.zeros(1920, np.float32)})[slot]
    assert [s.kind for s in out.spans] == ["reference"] and out.spans[0].n_frames > 3
    assert out.pcm.shape == (1920,) and backend.replays == 1
    assert eng.lm.offset(slot) == frames + out.spans[0].n_frames + 1


def test_public_entries_take_cpu_inputs_while_the_model_is_elsewhere(tmp_path, voice_wav):
    eng = meta_engine("tiny-random", "tiny", tmp_path, max_slots=2, max_span=32)
    # open_slot with a .wav voice (Mimi offline encode) and a persona text (persona prefill)
    slot = eng.open_slot(Persona(text="You are Ada.", voice=voice_wav), sampling=GREEDY, seed=1)
    assert eng.prompt_stats(slot)[0] > 13
    assert eng.voice_codes(voice_wav).device == META
    assert eng.inject(slot, "Gate 4.")
    eng.force_ret(slot)
    assert eng.step({slot: np.zeros(1920, np.float32)})[slot].spans[0].n_frames > 2
    # the generator's own entries
    gen = eng.lm
    gen.prefill(1, torch.zeros(17, 5, dtype=torch.long))
    gen.force_step(1, torch.zeros(17, dtype=torch.long))
    assert gen.offset(1) == 6
    gen.step(torch.zeros(2, 8, dtype=torch.long), torch.tensor([True, False]))
    # Mimi offline and streaming
    mimi = eng.mimi_model
    assert mimi.encode_offline(torch.zeros(1, 1, 3000)).device == META
    assert mimi.decode_offline(torch.zeros(1, 8, 2, dtype=torch.long)).shape == (1, 1, 3840)
    stream = MimiStream(mimi, batch_size=2)
    assert stream.encode(torch.zeros(2, 1, 1920), [True, False]).shape == (2, 8, 1)
    assert stream.decode(torch.zeros(2, 8, 1, dtype=torch.long)).device == META


def test_infer_cli_with_the_model_elsewhere(tmp_path, voice_wav):
    """`duetaspan infer` reads the caller wav on the CPU and steps a model on another device."""
    caller = tmp_path / "caller.wav"
    write_wav(caller, np.zeros(1920 * 4, np.float32), 24000)
    rc = cli_main([
        "infer", "--model", "tiny-random", "--random-weights", "--device", "meta", "--voice", str(voice_wav),
        "--text-prompt", "You are Ada.", "--input-wav", str(caller), "--output-wav", str(tmp_path / "o.wav"),
        "--output-json", str(tmp_path / "o.json"), "--inject", "1:It is 22 degrees.",
    ])  # fmt: skip
    assert rc == 0
    out = json.loads((tmp_path / "o.json").read_text())
    assert out["input_frames"] == 4 and [e["type"] for e in out["events"]] == ["span"]


class _MovedOnto(TorchDispatchMode):
    """Counts the bytes copied onto one device type (`_to_copy`/`copy_` from elsewhere), and casts there."""

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type, self.moved, self.casts = device_type, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        src = args[1] if name == "copy_" else args[0] if args else None
        if name in ("_to_copy", "copy_") and isinstance(out, torch.Tensor) and isinstance(src, torch.Tensor):
            if out.device.type == self.device_type and src.device.type != self.device_type:
                self.moved += out.numel() * out.element_size()
            elif out.device.type == self.device_type and src.dtype != out.dtype:
                self.casts += 1
        return out


def test_load_lm_reads_slices_and_casts_on_the_cpu_then_moves_only_the_final_weights(tmp_path):
    cfg = small_config()
    state = dict(random_model(cfg, seed=1).state_dict())
    step_key = re.compile(r"^(linears|depformer_in|depformer_emb|depformer\.layers\.\d+\.(?:self_attn\.\w+_projs"
                          r"|gating))\.(\d+)\.(.*)$")  # fmt: skip
    for key, value in list(state.items()):  # a dep_q=16 float32 file: steps 8-15 must never reach the device
        if m := step_key.match(key):
            state[f"{m[1]}.{int(m[2]) + 8}.{m[3]}"] = torch.randn_like(value)
    state["depformer_emb.7.weight"] = torch.randn_like(state["depformer_emb.0.weight"])
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    file_bytes = sum(v.numel() * v.element_size() for v in state.values())

    with _MovedOnto("meta") as spy:
        model = load_lm(path, cfg, device=META, dtype=torch.bfloat16)
    final = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    assert model.dtype == torch.bfloat16 and model.config.dep_q == 16
    assert spy.moved == final, f"moved {spy.moved} bytes onto the device; the final weights are {final}"
    assert spy.casts == 0 and final < file_bytes / 2
