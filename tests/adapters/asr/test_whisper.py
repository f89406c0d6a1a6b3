"""`[asr] kind = "whisper"` on a real model: the pinned tiny.en (tests/whisper_model.py) on the CPU, loaded once
per test process. It hears the fixture questions with word times (a `Transcript`: the text as a `str`, so
string callers keep working, and each word's start and end); the configuration's mistakes are errors that name
the fix; `duetaspan check --config --no-model` says which ASR is configured and whether it loads."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from duetaspan.adapters.asr import FasterWhisperClient, asr_from_config
from duetaspan.adapters.asr.whisper import DEFAULT_MODEL
from duetaspan.config import AgentConfig, ASRConfig
from duetaspan.errors import ConfigError
from duetaspan.router.ports import Transcript
from tests.support import REPO_ROOT, fixture_phrase, load_wav

BENCH = REPO_ROOT / "benchmarks" / "asr.py"
sys.path.insert(0, str(BENCH.parent))
from asr import wer  # noqa: E402 - benchmarks/asr.py: the scoring users run

sys.path.pop(0)


async def test_the_real_model_hears_the_fixture_questions_with_word_times(whisper_asr):
    for name in ("time_tokyo", "book_table"):
        pcm, rate = load_wav(name)
        heard = await whisper_asr.transcribe(pcm, rate)
        assert isinstance(heard, Transcript) and isinstance(heard, str)
        assert wer(fixture_phrase(name), heard) <= 0.15, heard  # 0.0 for both with tiny.en on this audio
        words = heard.words
        assert [w.word for w in words] == heard.split()  # one timed word per word of the text
        starts = [w.start for w in words]
        assert starts == sorted(starts) and all(w.start <= w.end for w in words)
        assert 0.0 <= words[0].start < 1.5 and words[-1].end <= len(pcm) / rate + 0.1


def test_a_model_bin_that_is_not_the_pinned_one_is_refused(whisper_folder, tmp_path):
    """The suite's model comes from a small third-party package: its model.bin is pinned by SHA-256."""
    from tests.whisper_model import check_folder

    check_folder(whisper_folder)  # the installed one passes
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        (tmp_path / name).write_bytes((whisper_folder / name).read_bytes())
    (tmp_path / "model.bin").write_bytes(b"\0" * 1024)
    with pytest.raises(AssertionError, match=r"not the pinned tiny\.en"):
        check_folder(tmp_path)
    (tmp_path / "model.bin").unlink()
    with pytest.raises(AssertionError, match=r"lacks \['model.bin'\]"):
        check_folder(tmp_path)


def test_whisper_configuration_errors_name_the_fix(tmp_path):
    with pytest.raises(ConfigError, match=r"'whisper-1' is an OpenAI API model name.*tiny\.en, base\.en"):
        asr_from_config(ASRConfig(kind="whisper", model="whisper-1"))
    with pytest.raises(ConfigError, match=r"folder '.*nowhere' does not exist"):
        asr_from_config(ASRConfig(kind="whisper", model=str(tmp_path / "nowhere")))
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.json").write_text("{}")
    with pytest.raises(
        ConfigError, match=r"has no model\.bin, tokenizer\.json: a faster-whisper model folder"
    ):
        asr_from_config(ASRConfig(kind="whisper", model=str(tmp_path / "half")))
    with pytest.raises(ConfigError, match=r"'huge\.en' is no Whisper size"):
        asr_from_config(ASRConfig(kind="whisper", model="huge.en"))
    # unset: a size that exists (the OpenAI default "whisper-1" only for kind "openai")
    client = asr_from_config(ASRConfig(kind="whisper"))
    assert isinstance(client, FasterWhisperClient) and client.model_name == DEFAULT_MODEL == "base.en"
    assert asr_from_config(ASRConfig(kind="openai", url="http://127.0.0.1:9/v1")).model == "whisper-1"
    assert asr_from_config(ASRConfig(kind="whisper", model="Systran/faster-whisper-tiny.en")).model_name == (
        "Systran/faster-whisper-tiny.en"
    )  # a Hugging Face repository id passes through
    # a folder named relative to agent.toml resolves against the file's folder
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    (tmp_path / "agent.toml").write_text('[asr]\nkind = "whisper"\nmodel = "./models/tiny"\n')
    assert AgentConfig.load(tmp_path / "agent.toml").asr.model == str(tmp_path / "models" / "tiny")


async def test_a_folder_that_is_not_a_model_fails_to_load_saying_so(tmp_path):
    for name in ("config.json", "model.bin", "tokenizer.json", "vocabulary.txt"):
        (tmp_path / name).write_text("not a model")
    client = FasterWhisperClient(str(tmp_path), device="cpu")
    with pytest.raises(ConfigError, match=r"could not load .*not a CTranslate2 Whisper model"):
        await client.transcribe(np.zeros(1600, dtype=np.float32), 16000)


def test_check_says_which_asr_is_configured_and_that_it_loads(whisper_asr, whisper_folder, tmp_path, monkeypatch,
                                                              capsys):  # fmt: skip
    """`duetaspan check --config agent.toml --no-model`, in this process (the session's model is loaded once)."""
    from duetaspan.cli import main

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    (tmp_path / "agent.toml").write_text(f'[asr]\nkind = "whisper"\nmodel = "{whisper_folder}"\n')
    out = tmp_path / "check.json"
    assert main(["check", "--config", str(tmp_path / "agent.toml"), "--no-model", "--json", str(out)]) == 0
    screen = capsys.readouterr().out
    assert f"asr           whisper, local folder {whisper_folder}: loaded in" in screen
    assert "router        gpt-4.1-mini at https://api.openai.com/v1: key OPENAI_API_KEY is not set" in screen
    assert "side effects  keywords (unset: keywords+llm only when the router can reach its model)" in screen
    report = json.loads(out.read_text())
    assert report["ok"] and report["agent"]["asr_loaded"] is True and report["agent"]["asr_load_s"] >= 0
    # a size that is not installed and cannot be downloaded here is a failed check, exit status 1
    (tmp_path / "bad.toml").write_text('[asr]\nkind = "whisper"\nmodel = "./no-such-model"\n')
    assert main(["check", "--config", str(tmp_path / "bad.toml"), "--no-model"]) == 1
    assert "FAILED: asr.model folder" in capsys.readouterr().out


def test_the_asr_benchmark_prints_word_error_rate_and_time_per_fixture(whisper_folder):
    done = subprocess.run(
        [sys.executable, str(BENCH), "--model", str(whisper_folder), "--only", "time_tokyo", "--json"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout)
    rows = {r["line"]: r for r in figures["rows"]}
    assert set(rows) == {"24k", "ulaw8k"} and all(r["fixture"] == "time_tokyo" for r in rows.values())
    assert rows["24k"]["wer"] <= 0.15 and rows["24k"]["asr_s"] > 0 and rows["24k"]["words"] > 5
    assert 0.0 <= rows["ulaw8k"]["wer"] and rows["ulaw8k"]["audio_s"] == rows["24k"]["audio_s"]
    assert figures["mean_wer"]["24k"] == rows["24k"]["wer"] and figures["load_s"] > 0


def test_wer_reads_spelled_ids_and_numbers_alike():
    assert wer("The number is A B C one two three.", "the number is ABC123") == 0.0
    assert wer("table for four people", "able for four people") == 0.25
    assert wer("what time is it", "") == 1.0


def test_check_fails_on_an_asr_that_cannot_load(tmp_path, monkeypatch):
    from duetaspan.check_cli import check_agent, render_agent

    monkeypatch.setenv("MY_LLM_KEY", "k")
    config = AgentConfig.from_dict(
        {"asr": {"kind": "whisper", "model": "whisper-1"}, "router": {"api_key_env": "MY_LLM_KEY"}}
    )
    report = check_agent(config, "agent.toml")
    assert report.asr_loaded is False and report.problems and report.router_reachable
    screen = render_agent(report)
    assert (
        "asr           whisper whisper-1: FAILED: asr.model 'whisper-1' is an OpenAI API model name" in screen
    )
    assert "side effects  keywords+llm (unset: keywords+llm because the router can reach its model)" in screen
