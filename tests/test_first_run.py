"""The first run without keys says what will not work, once, at start: a real `duetaspan serve` subprocess
whose router key variable is unset warns once (and the ASR, following the router's base URL, follows its key
variable too); the serve command's ready line is INFO and shows without `-v`; the warning rules."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from duetaspan.agent.wiring import missing_key_warnings, router_asr_config
from duetaspan.config import AgentConfig
from tests.adapters.twilio.peer import ACCOUNT_SID, AUTH_TOKEN, PUBLIC_URL
from tests.support import REPO_ROOT, free_port, stop_process, wait_until_healthy

WARNING = "[router] api_key_env {env} is not set: the model's own <ret> will get no span; the tool console still works"


async def test_serve_without_the_router_key_warns_once_at_start(tmp_path):
    (tmp_path / "agent.toml").write_text('[router]\napi_key_env = "MY_ROUTER_KEY"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "TWILIO_", "MY_ROUTER"))}
    env |= {"PYTHONPATH": str(REPO_ROOT), "TWILIO_ACCOUNT_SID": ACCOUNT_SID, "TWILIO_AUTH_TOKEN": AUTH_TOKEN}
    port = free_port()
    cmd = [
        sys.executable, "-m", "duetaspan", "serve", "--twilio", "--webrtc", "--host", "127.0.0.1",
        "--port", str(port), "--public-url", PUBLIC_URL, "--config", str(tmp_path / "agent.toml"),
        "--model", "tiny-random",
    ]  # fmt: skip
    with (tmp_path / "serve.log").open("wb") as log:
        proc = _popen(cmd, env, log, tmp_path)
        try:
            await wait_until_healthy(f"http://127.0.0.1:{port}", proc, tmp_path / "serve.log", what="serve")
        finally:
            stop_process(proc)
    lines = (tmp_path / "serve.log").read_text().splitlines()
    warned = [line for line in lines if "is not set" in line]
    # once, naming the router's variable; the ASR (on the router's base URL) uses that variable too, so no
    # second line about OPENAI_API_KEY
    assert len(warned) == 1 and warned[0].endswith(WARNING.format(env="MY_ROUTER_KEY")), warned
    assert " WARNING " in warned[0]
    ready = [line for line in lines if "ready: Twilio voice webhook" in line]
    assert len(ready) == 1 and " INFO " in ready[0], ready  # shown without -v, at the level it means


def _popen(cmd: list[str], env: dict[str, str], log, cwd) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log, cwd=cwd)


def _config(**sections) -> AgentConfig:
    return AgentConfig.model_validate(sections)


def test_warnings_name_each_unset_variable_once(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ASR_KEY", raising=False)
    config = _config()
    assert missing_key_warnings(config, router_asr_config(config)) == [WARNING.format(env="OPENAI_API_KEY")]
    config = _config(asr={"kind": "openai", "url": "https://asr.example.com/v1", "api_key_env": "ASR_KEY"})
    lines = missing_key_warnings(config, router_asr_config(config))
    assert lines == [
        WARNING.format(env="OPENAI_API_KEY"),
        WARNING.format(env="ASR_KEY").replace("[router]", "[asr]"),
    ]
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ASR_KEY", "k")
    assert missing_key_warnings(config, router_asr_config(config)) == []


def test_no_warning_for_a_loopback_server_or_no_key_variable(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    local = _config(router={"base_url": "http://127.0.0.1:8000/v1"})
    assert missing_key_warnings(local, router_asr_config(local)) == []
    keyless = _config(router={"api_key_env": None}, asr={"kind": "none"})
    assert missing_key_warnings(keyless, router_asr_config(keyless)) == []


def test_the_asr_follows_the_routers_key_variable_unless_it_names_its_own():
    follows = router_asr_config(
        _config(router={"base_url": "https://llm.example/v1", "api_key_env": "LLM_KEY"})
    )
    assert follows.url == "https://llm.example/v1" and follows.api_key_env == "LLM_KEY"
    own = router_asr_config(_config(router={"api_key_env": "LLM_KEY"}, asr={"api_key_env": "ASR_KEY"}))
    assert own.api_key_env == "ASR_KEY"
    explicit_url = router_asr_config(_config(router={"api_key_env": "LLM_KEY"}, asr={"url": "https://a/v1"}))
    assert explicit_url.api_key_env == "OPENAI_API_KEY"  # an ASR of its own keeps its own default


def _serve_once(tmp_path, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """`duetaspan serve` that is expected to fail at start (offline: the Hub is never contacted)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "TWILIO_", "DUETASPAN_MODEL"))}
    env |= {"PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    cmd = [sys.executable, "-m", "duetaspan", "serve", "--webrtc", "--port", str(free_port()), *args]
    return subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=timeout_s)


def test_missing_weights_name_fixes_that_exist_for_serve(tmp_path):
    done = _serve_once(tmp_path, "--model", "duetaspan-7b")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    [line] = [line for line in done.stderr.splitlines() if "error:" in line]
    assert "--model-dir DIR (serve, infer, check" in line and "--model tiny-random" in line, line
    # serve has the option the message names, and the folder it gets is where the weights are looked for
    weights = tmp_path / "weights"
    weights.mkdir()
    done = _serve_once(tmp_path, "--model", "duetaspan-7b", "--model-dir", str(weights))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"put it in {weights}" in done.stderr, done.stderr
    # ... and so is `[model] dir` of agent.toml (relative to the file)
    (tmp_path / "agent.toml").write_text('[model]\npreset = "duetaspan-7b"\ndir = "weights"\n')
    done = _serve_once(tmp_path, "--config", str(tmp_path / "agent.toml"))
    assert done.returncode == 1 and f"put it in {weights}" in done.stderr, done.stderr
    done = _serve_once(tmp_path, "--model-dir", str(tmp_path / "nowhere"))
    assert done.returncode == 1 and "--model-dir" in done.stderr and "no such folder" in done.stderr


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_what_example_runs_leave_behind_is_ignored_by_git():
    inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=REPO_ROOT, capture_output=True)
    if inside.returncode != 0:
        pytest.skip("not a git checkout")
    left = ["restaurant.sqlite3", "bank.sqlite3", "examples/browser_demo/calls/web-1.json", "calls/CA1.wav"]
    done = subprocess.run(["git", "check-ignore", *left], cwd=REPO_ROOT, capture_output=True, text=True)
    assert done.stdout.split() == left, done.stdout
    kept = subprocess.run(["git", "check-ignore", "examples/browser_demo/agent.toml"], cwd=REPO_ROOT)
    assert kept.returncode == 1  # the examples themselves stay tracked
