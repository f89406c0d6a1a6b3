"""agent.toml: sections, defaults, path resolution and errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from duetaspan.config import (
    AgentConfig,
    ASRConfig,
    CaptureConfig,
    MCPServerConfig,
    RetrievalConfig,
    RouterConfig,
)
from duetaspan.errors import ConfigError

FULL = """
profile = { city = "Seoul", timezone = "Asia/Seoul" }

[persona]
name = "Ava"
prompt_file = "prompts/ava.txt"

[voice]
name = "NATF2"

[model]
preset = "duetaspan-7b"
checkpoint = "weights/model.safetensors"
device = "cuda:0"
dtype = "bfloat16"

[router]
base_url = "http://127.0.0.1:8004/v1"
model = "gemma"
mode = "json"
timeout_s = 4
max_tokens = 120

[asr]
kind = "transcribe"
url = "http://127.0.0.1:9000/transcribe"

[capture]
wait_s = 0.5

[retrieval]
deadline_s = 3.0

[tools]
modules = ["my_tools"]
builtins = ["get_time", "end_call"]
[tools.settings]
geocoding_url = "http://127.0.0.1:1/geo"
transfer_targets = { sales = "+15550001111" }

[[mcp_servers]]
name = "time"
command = "python"
args = ["-m", "mcp_server_time"]
cwd = "servers"
env_allow = ["TZ"]
deny = ["convert_time"]

[[mcp_servers]]
name = "crm"
url = "http://127.0.0.1:8931/mcp"
headers = { Authorization = "Bearer x" }
allow = ["lookup_customer"]

[twilio]
public_url = "https://example.ngrok.app"

[recording]
enabled = true
dir = "calls"
"""


def test_full_file_loads_with_paths_resolved(tmp_path: Path):
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "ava.txt").write_text("You are Ava.\n")
    path = tmp_path / "agent.toml"
    path.write_text(FULL)
    cfg = AgentConfig.load(path)
    assert cfg.base_dir == tmp_path.resolve()
    assert cfg.persona.text() == "You are Ava."
    assert cfg.model.checkpoint == tmp_path.resolve() / "weights/model.safetensors"
    assert cfg.router == RouterConfig(
        base_url="http://127.0.0.1:8004/v1", model="gemma", mode="json", timeout_s=4.0, max_tokens=120
    )
    assert cfg.asr.kind == "transcribe" and cfg.asr.timeout_s == 5.0
    assert cfg.capture == CaptureConfig(final_window_s=3, wait_s=0.5, silence_s=0.4, fallback_window_s=12)
    assert cfg.retrieval == RetrievalConfig(deadline_s=3.0, max_reference_tokens=250)
    assert cfg.tools.settings.transfer_targets == {"sales": "+15550001111"}
    time_srv, crm = cfg.mcp_servers
    assert time_srv.transport == "stdio" and time_srv.cwd == tmp_path.resolve() / "servers"
    assert crm.transport == "http" and crm.command is None and crm.allow == ["lookup_customer"]
    assert cfg.recording.dir == tmp_path.resolve() / "calls"
    assert cfg.profile["timezone"] == "Asia/Seoul"


def test_defaults_router_engineer_relies_on(monkeypatch):
    r = RouterConfig()
    assert (r.api_key_env, r.mode, r.timeout_s, r.temperature) == ("OPENAI_API_KEY", "native", 8.0, 0.0)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert r.api_key() == "sk-test"
    assert ASRConfig().kind == "openai"
    c = CaptureConfig()
    assert (c.final_window_s, c.wait_s, c.silence_s, c.fallback_window_s) == (3, 1, 0.4, 12)
    assert (RetrievalConfig().deadline_s, RetrievalConfig().max_reference_tokens) == (2.5, 250)
    assert AgentConfig.from_toml("").tools.builtins == ["get_time", "get_weather", "web_search", "calculate"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[[mcp_servers]]\nname = "x"\nargs = ["a"]',
            "agent.toml: mcp_servers[0]: needs `command` (a stdio server) or `url` (a streamable-HTTP server)",
        ),
        ('[router]\nmode = "tools"', "agent.toml: router.mode: input should be 'native' or 'json'"),
        ("[router]\ntimeout_s = -1", "agent.toml: router.timeout_s: input should be greater than 0"),
        ('[asr]\nkind = "deepgram"', "agent.toml: asr.kind:"),
        ("[routr]\nmodel = 'x'", "agent.toml: routr: extra inputs are not permitted"),
        (
            '[[mcp_servers]]\nname = "a"\ncommand = "p"\nurl = "http://h"',
            "mcp_servers[0]: give either command",
        ),
        ('[[mcp_servers]]\nname = "a b"\ncommand = "p"', "mcp_servers[0].name: use 1-32 letters"),
        (
            '[[mcp_servers]]\nname = "a"\ncommand = "p"\n[[mcp_servers]]\nname = "a"\nurl = "http://h"',
            "duplicate names ['a']",
        ),
        ("[router\n", "agent.toml: invalid TOML"),
    ],
)
def test_errors_name_the_field(text: str, message: str):
    with pytest.raises(ConfigError) as info:
        AgentConfig.from_toml(text)
    assert message in str(info.value)


def test_missing_file_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="cannot read"):
        AgentConfig.load(tmp_path / "nope.toml")


def test_mcp_server_model_standalone():
    s = MCPServerConfig(name="t", command="python", args=["-m", "x"])
    assert s.transport == "stdio" and s.env == {} and s.env_allow == []


@pytest.mark.parametrize(
    "text",
    [
        '[router]\napi_key = "sk-in-the-file"',
        '[asr]\napi_key = "sk-in-the-file"',
        '[twilio]\nauth_token = "sk-in-the-file"',
        '[twilio]\naccount_sid = "AC1"',
    ],
)
def test_credentials_in_agent_toml_are_refused(text: str):
    """Secrets come from the environment (`api_key_env`, `auth_token_env`): a key written into agent.toml is
    an error naming the field, never silently used or ignored."""
    with pytest.raises(ConfigError) as info:
        AgentConfig.from_toml(text)
    assert "extra inputs are not permitted" in str(info.value)
    assert "sk-in-the-file" not in str(info.value)
