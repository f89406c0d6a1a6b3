"""`duetaspan infer` end to end: presets and explicit files, spans by frame, trace, and clear one-line errors.

The flags and JSON fields checked here are a relied-on contract (see duetaspan.model.infer).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from duetaspan import cli
from duetaspan.model.audio import read_wav, to_model_rate, write_wav
from duetaspan.model.checkpoint import save_lm
from duetaspan.model.lm import LMModel
from duetaspan.model.lm_config import LMConfig
from duetaspan.model.mimi import random_mimi, save_mimi
from duetaspan.model.tokenizer import TextTokenizer, tiny_tokenizer_path

pytestmark = pytest.mark.usefixtures("one_thread")
# the same for the subprocesses
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}


def _caller_wav(path, rate=16000, seconds=1.0, channels=2):
    t = np.arange(int(rate * seconds)) / rate
    x = (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(3 * t))).astype(np.float32) / 2
    write_wav(path, np.stack([x] * channels, axis=1), rate)
    return path


def _args(tmp, *extra):
    return [
        "infer",
        "--input-wav", str(tmp / "in.wav"),
        "--output-wav", str(tmp / "out.wav"),
        "--output-json", str(tmp / "out.json"),
        "--device", "cpu",
        *extra,
    ]  # fmt: skip


def _check_outputs(tmp, n_frames):
    pcm, rate = read_wav(tmp / "out.wav")
    caller = to_model_rate(*read_wav(tmp / "in.wav"))
    assert rate == 24000 and pcm.shape == (len(caller), 2)
    assert np.abs(pcm[:, 0] - caller).max() < 1e-3  # left is the caller as the model heard it
    out = json.loads((tmp / "out.json").read_text())
    assert out["input_frames"] == n_frames == -(-len(caller) // 1920)
    return pcm, out


def test_tiny_random_end_to_end_subprocess(tmp_path):
    _caller_wav(tmp_path / "in.wav", rate=16000, seconds=1.0)  # 16 kHz stereo -> 24 kHz mono, 13 frames
    cmd = [sys.executable, "-m", "duetaspan", *_args(tmp_path, "--model", "tiny-random", "--seed", "3", "--trace",
           "--inject", "2:(tool result) it is 22 degrees in Sydney.", "--inject", "7:The store opens at nine.",
           "--inject", "9:   ")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ONE_THREAD)
    assert proc.returncode == 0, proc.stderr
    pcm, out = _check_outputs(tmp_path, 13)
    assert np.abs(pcm[:, 1]).max() > 0  # the agent channel has audio
    frames = out["frames"]
    assert [f["i"] for f in frames] == list(range(13))
    assert all(isinstance(f["text_token"], int) and len(f["agent_codes"]) == 8 for f in frames)
    spans = [e for e in out["events"] if e["type"] == "span"]
    assert [(s["frame"], s["reference"]) for s in spans] == [
        (2, "(tool result) it is 22 degrees in Sydney."),
        (7, "The store opens at nine."),
    ]
    assert all(s["n"] >= 3 and s["prefill_ms"] > 0 for s in spans)
    assert [e["frame"] for e in out["events"] if e["type"] == "span_skipped"] == [9]
    assert out["prompt"]["persona"] and out["prompt"]["frames"] > 12
    assert isinstance(out["transcript"], str)


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    """Tiny random checkpoints in the real layouts: .pt {"model": sd}, safetensors, lm_kwargs JSON, Mimi, spm."""
    d = tmp_path_factory.mktemp("model")
    cfg = LMConfig.preset("tiny-random")
    torch.manual_seed(0)
    lm = LMModel(cfg)
    save_lm(lm, d / "context_spanning_tiny.pt")
    save_lm(lm, d / "model.safetensors")
    (d / "config.json").write_text(json.dumps(cfg.to_lm_kwargs()))
    save_mimi(random_mimi("tiny", seed=0), d / "mimi.safetensors")
    shutil.copy(tiny_tokenizer_path(d / "cache"), d / "tokenizer.model")
    (d / "voices").mkdir()
    torch.save({"codes": torch.randint(0, 2048, (8, 5))}, d / "voices" / "ada.pt")
    return d


@pytest.mark.parametrize("weights", ["context_spanning_tiny.pt", "model.safetensors"])
def test_infer_from_files(tmp_path, model_files, weights, capsys):
    _caller_wav(tmp_path / "in.wav", rate=24000, seconds=0.5, channels=1)  # 12000 samples -> 7 frames
    d = model_files
    rc = cli.main(_args(tmp_path, "--checkpoint", str(d / weights), "--lm-config", str(d / "config.json"),
                        "--mimi", str(d / "mimi.safetensors"), "--tokenizer", str(d / "tokenizer.model"),
                        "--voice", "ada", "--text-prompt", "You are Ada.", "--trace",
                        "--inject", "3:(tool result) booked.", "--temperature", "0", "--temperature-text", "0"))  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    _, out = _check_outputs(tmp_path, 7)
    assert len(out["frames"]) == 7
    prompt_tokens = TextTokenizer.from_file(d / "tokenizer.model").encode("<system> You are Ada. <system>")
    assert out["prompt"]["frames"] == 5 + 6 + len(prompt_tokens) + 6  # voices/ada.pt beside the checkpoint
    assert [e["frame"] for e in out["events"] if e["type"] == "span"] == [3]


def test_no_prompt(tmp_path, model_files, capsys):
    _caller_wav(tmp_path / "in.wav", rate=8000, seconds=0.3, channels=1)
    d = model_files
    rc = cli.main(_args(tmp_path, "--checkpoint", str(d / "model.safetensors"), "--mimi", str(d / "mimi.safetensors"),
                        "--tokenizer", str(d / "tokenizer.model"), "--no-prompt", "--trace"))  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    _, out = _check_outputs(tmp_path, 4)
    assert out["prompt"] == {"frames": 0, "prefill_ms": 0.0, "persona": False}
    assert out["frames"][0]["text_token"] == -2  # nothing before it: the first frame is still warming up


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_clear_errors(tmp_path, model_files, capsys):
    d = model_files
    files = ["--checkpoint", str(d / "model.safetensors"), "--lm-config", str(d / "config.json"),
             "--mimi", str(d / "mimi.safetensors"), "--tokenizer", str(d / "tokenizer.model")]  # fmt: skip
    write_wav(tmp_path / "in.wav", np.zeros(0, np.float32), 24000)
    assert cli.main(_args(tmp_path, *files)) == 2
    assert "holds no audio" in _error_line(capsys)
    write_wav(tmp_path / "in.wav", np.zeros(500, np.float32), 24000)
    assert cli.main(_args(tmp_path, *files)) == 2
    assert "too short" in _error_line(capsys)
    _caller_wav(tmp_path / "in.wav", seconds=0.3)
    missing = [*files[:6], "--tokenizer", str(tmp_path / "nope.model")]
    assert cli.main(_args(tmp_path, *missing)) == 2
    assert "tokenizer not found" in _error_line(capsys)
    assert cli.main(_args(tmp_path, *files, "--inject", "99:late")) == 2
    assert "past the end" in _error_line(capsys)
    assert cli.main(_args(tmp_path, "--model", "gpt-9")) == 2
    assert "unknown model preset" in _error_line(capsys)
    assert not (tmp_path / "out.wav").exists()


def test_bad_checkpoint_subprocess(tmp_path, model_files):
    d = model_files
    (tmp_path / "junk.pt").write_bytes(b"this is not a checkpoint")
    _caller_wav(tmp_path / "in.wav", seconds=0.3)
    cmd = [sys.executable, "-m", "duetaspan", *_args(tmp_path, "--checkpoint", str(tmp_path / "junk.pt"),
           "--lm-config", str(d / "config.json"), "--mimi", str(d / "mimi.safetensors"),
           "--tokenizer", str(d / "tokenizer.model"))]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ONE_THREAD)
    assert proc.returncode != 0
    err = proc.stderr.strip()
    ours = [line for line in err.splitlines() if line.startswith("duetaspan infer:")]
    assert "Traceback" not in err and len(ours) == 1 and "junk.pt" in ours[0]
    assert err.splitlines()[-1] == ours[0]
