"""`Agent.serve` (`duetaspan.serving`), the one code path behind `duetaspan serve`: arguments override
`agent.toml` (`[server] host/port`, `[twilio] public_url` and credential variable names), errors come before
the model loads, and a real server answers a signed Twilio call recorded as `[recording] audio` says."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re

import aiohttp
import pytest

from duetaspan.agent import Agent
from duetaspan.config import AgentConfig
from duetaspan.errors import ConfigError
from duetaspan.serving import plan_server
from tests.adapters.twilio.peer import ACCOUNT_SID, AUTH_TOKEN, PUBLIC_URL, TwilioPeer, renumber
from tests.pipeline.scripted_engine import ScriptedEngine
from tests.support import free_port, load_twilio_stream

ENV = {"MY_SID": ACCOUNT_SID, "MY_TOKEN": AUTH_TOKEN}


def _config(tmp_path, port: int = 9123, audio: bool = True) -> AgentConfig:
    text = f"""
[persona]
prompt = "You answer the phone for a test."

[twilio]
public_url = "{PUBLIC_URL}"
account_sid_env = "MY_SID"
auth_token_env = "MY_TOKEN"

[server]
host = "127.0.0.1"
port = {port}

[recording]
enabled = true
dir = "calls"
audio = {str(audio).lower()}
"""
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return AgentConfig.load(path)


def test_settings_come_from_the_file_and_arguments_override_them(tmp_path):
    config = _config(tmp_path)
    plan = plan_server(config, twilio=True, env=ENV)
    assert (plan.host, plan.port) == ("127.0.0.1", 9123)
    assert plan.twilio.voice_url == f"{PUBLIC_URL}/twilio/voice"
    assert plan.twilio.credentials.account_sid == ACCOUNT_SID  # read from the variables [twilio] names
    assert plan.twilio.credentials.auth_token.get_secret_value() == AUTH_TOKEN
    plan = plan_server(
        config, twilio=True, host="0.0.0.0", port=0, public_url="https://other.example/", env=ENV
    )
    assert (plan.host, plan.port, plan.twilio.public_url) == ("0.0.0.0", 0, "https://other.example")
    assert plan_server(AgentConfig(), webrtc=True).port == 8080  # defaults without a file
    assert plan_server(AgentConfig(), webrtc=True).host == "127.0.0.1"


@pytest.mark.parametrize(
    ("kwargs", "env", "message"),
    [
        ({}, ENV, "choose a transport"),
        ({"twilio": True, "public_url": None}, ENV, r"--public-url .*\[twilio\] public_url"),
        ({"twilio": True, "public_url": PUBLIC_URL}, {"MY_SID": ACCOUNT_SID}, "MY_TOKEN not set"),  # its name
        ({"twilio": True, "public_url": "ftp://x"}, ENV, "--public-url: .*public URL must look like"),
        (
            {"twilio": True, "public_url": "http://agent.example"},
            ENV,
            r"--public-url: .*wss:// \(error 31922\)",
        ),
        (
            {"twilio": True, "public_url": PUBLIC_URL},
            ENV | {"TWILIO_WEBHOOK_KEY_ID": "k"},
            "KEY_SECRET not set",
        ),
        ({"webrtc": True, "port": 70000}, ENV, "not a TCP port"),
    ],
)
def test_configuration_errors_name_what_to_fix(kwargs, env, message):
    config = AgentConfig.from_dict({"twilio": {"account_sid_env": "MY_SID", "auth_token_env": "MY_TOKEN"}})
    with pytest.raises(ConfigError, match=message):
        plan_server(config, env=env, **kwargs)


def test_webhook_shared_key_comes_from_the_environment():
    config = AgentConfig.from_dict({"twilio": {"account_sid_env": "MY_SID", "auth_token_env": "MY_TOKEN"}})
    env = ENV | {"TWILIO_WEBHOOK_KEY_ID": "webhooks_sharedkey_1", "TWILIO_WEBHOOK_KEY_SECRET": "sk-shared"}
    settings = plan_server(config, twilio=True, public_url=PUBLIC_URL, env=env).twilio
    keys = settings.signing_keys
    assert (keys.shared_key_id, keys.shared_key_secret) == ("webhooks_sharedkey_1", "sk-shared")
    assert "sk-shared" not in repr(settings)
    assert plan_server(config, twilio=True, public_url=PUBLIC_URL, env=ENV).twilio.webhook_key is None


def test_removed_fields_are_refused_with_the_reason():
    with pytest.raises(ConfigError, match="validate_signatures was removed: Twilio signatures are always"):
        AgentConfig.from_toml("[twilio]\nvalidate_signatures = false\n")
    with pytest.raises(ConfigError, match=r"enabled was removed: .*serve --webrtc"):
        AgentConfig.from_toml("[webrtc]\nenabled = true\n")


async def _wait_ready(base: str, task: asyncio.Task) -> dict:
    async with aiohttp.ClientSession() as http:
        for _ in range(300):
            assert not task.done(), task.exception()
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(base + "/health") as resp:
                    if resp.status == 200:
                        return await resp.json()
            await asyncio.sleep(0.05)
    raise AssertionError("agent.serve never became ready")


@pytest.mark.parametrize("audio", [False, True])
async def test_agent_serve_answers_a_signed_call_from_the_file_settings(tmp_path, monkeypatch, audio):
    monkeypatch.setenv("MY_SID", ACCOUNT_SID)
    monkeypatch.setenv("MY_TOKEN", AUTH_TOKEN)
    port = free_port()
    agent = Agent(
        config=_config(tmp_path, port, audio=audio), engine=ScriptedEngine(max_slots=2), builtins=[]
    )
    task = asyncio.create_task(agent.serve(twilio=True))  # host, port, public URL, credentials: the file's
    base = f"http://127.0.0.1:{port}"
    try:
        health = await _wait_ready(base, task)
        assert health["transports"] == {"twilio": {"free_slots": 2}}
        peer = TwilioPeer(base)  # signs with AUTH_TOKEN over PUBLIC_URL: both came from the file
        assert (await peer.voice("CA-forged", signature="forged"))[0] == 403
        url = await peer.stream_url("CA-serve")
        assert re.fullmatch(r"wss://agent\.example\.test/twilio/stream/[\w-]+", url)
        recorded = renumber(load_twilio_stream("time_tokyo"), "CA-serve")
        start = [m for m in recorded if m["event"] in ("connected", "start")]
        media = [m for m in recorded if m["event"] == "media"][:40]
        stop = [m for m in recorded if m["event"] == "stop"]
        async with peer.open_stream(url) as ws:
            got = await peer.play(ws, [*start, *media, *stop], linger_s=0.2)
        assert got.of("media")  # the agent spoke back
        record_path = tmp_path / "calls" / "CA-serve.json"
        for _ in range(100):
            if record_path.exists():
                break
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert not agent.started  # serve started the agent, so it stopped it
    record = json.loads(record_path.read_text())
    assert record["complete"] and record["summary"]["frames"] > 0
    assert (tmp_path / "calls" / "CA-serve.wav").exists() is audio  # [recording] audio
    assert (tmp_path / "calls" / "CA-serve.jsonl").exists()


async def test_agent_serve_leaves_an_agent_it_did_not_start_running(tmp_path):
    agent = Agent(persona="Hi", engine=ScriptedEngine(max_slots=1), builtins=[])
    port = free_port()
    async with agent:
        task = asyncio.create_task(agent.serve(webrtc=True, port=port))
        try:
            health = await _wait_ready(f"http://127.0.0.1:{port}", task)
            assert set(health["transports"]) == {"webrtc"}
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert agent.started  # its owner stops it
    assert not agent.started


async def test_configuration_errors_come_before_the_model_loads(monkeypatch):
    monkeypatch.delenv("TWILIO_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("TWILIO_ACCOUNT_SID", ACCOUNT_SID)
    agent = Agent(persona="Hi", model="no-such-preset", builtins=[])  # loading it would fail differently
    with pytest.raises(ConfigError, match="TWILIO_AUTH_TOKEN not set"):
        await agent.serve(twilio=True, public_url=PUBLIC_URL)
    assert agent.engine is None and not agent.started
