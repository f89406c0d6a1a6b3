"""Secrets never reach the logs (issue #9): a full call served by the real `duetaspan -vv serve --twilio`
(debug logging on everywhere: duetaspan, uvicorn, aiohttp, openai/httpx, Pipecat) with the router, ASR and a
tool with a redacted argument, then every line of the server's log and every artifact file is searched for the
Twilio auth token, the stream token, the router's API key and the redacted tool argument.

The other defences SECURITY.md lists are proven where they live (see its table); `test_checkpoints_*` below
adds the static check that no `torch.load` in the package runs without `weights_only=True`.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from duetaspan.pipeline.artifacts import load_call_record
from tests.adapters.twilio.peer import AUTH_TOKEN, TwilioPeer
from tests.fakes.asr_server import ScriptedASRServer
from tests.fakes.llm_server import ScriptedLLMServer
from tests.reliability.load_driver import ROUTER_API_KEY, ServeProcess, agent_toml, call_messages
from tests.reliability.secret_tools import PIN
from tests.support import REPO_ROOT


@pytest.mark.serial  # a real-time served call whose span must land: CPU quiet
async def test_a_served_call_with_debug_logging_leaks_no_secret(tmp_path):
    llm = ScriptedLLMServer(
        {"default": {"tool_call": {"name": "account_balance", "arguments": {"account": "12345", "pin": PIN}}}}
    )
    asr = ScriptedASRServer({"default": "What is the balance of my account?"})
    async with llm.serve() as llm_url, asr.serve() as asr_url:
        server = ServeProcess(
            tmp_path,
            max_calls=2,
            config=agent_toml(llm_url, asr_url, modules=["tests.reliability.secret_tools"]),
            verbose=2,
            force_ret_every=1.5,
        )
        async with server.running():
            peer = TwilioPeer(server.base_url)
            url = await peer.stream_url("CA-secrets")
            token = url.rsplit("/", 1)[1]
            async with peer.open_stream(url) as ws:
                got = await peer.play(ws, call_messages("CA-secrets", 6.0), linger_s=0.3)
            for _ in range(200):
                if (server.record_dir / "CA-secrets.json").exists():
                    break
                await asyncio.sleep(0.05)
        log = server.log_text()
    assert got.close_code == 1000
    record = load_call_record(server.record_dir, "CA-secrets")
    # the call really exercised every secret: the tool ran with the PIN, the router used its key
    [called] = [e for e in record["retrieval_events"] if e.get("kind") == "tool"][:1]
    assert called["tool"] == "account_balance" and called["arguments"] == {
        "account": "12345",
        "pin": "[redacted]",
    }
    assert any("42 dollars" in s["reference"] for s in record["spans"])
    assert llm.requests and asr.requests
    assert " DEBUG " in log and "uvicorn" in log  # debug logging was really on
    artifacts = "".join(p.read_text(errors="replace") for p in server.record_dir.glob("*.json*"))
    for name, secret in {
        "Twilio auth token": AUTH_TOKEN,
        "stream token": token,
        "router API key": ROUTER_API_KEY,
        "redacted tool argument": PIN,
    }.items():
        assert secret not in log, f"{name} in the server log: " + _context(log, secret)
        assert secret not in artifacts, f"{name} in the call's artifacts"
    assert "/twilio/stream/<token>" in log


def _context(text: str, secret: str) -> str:
    i = text.find(secret)
    return text[max(0, i - 300) : i + 100]


def test_checkpoints_and_voice_prompts_are_loaded_with_weights_only():
    """Every `torch.load` in the package passes `weights_only=True` (pickles with code are refused; proven at
    run time by tests/model/test_checkpoint.py::test_pickle_with_code_is_refused)."""
    calls = []
    for folder in ("sdk", "adapters", "tools"):
        for path in (REPO_ROOT / folder).rglob("*.py"):
            text = path.read_text()
            for match in re.finditer(r"torch\.load\(", text):
                depth, end = 0, match.end() - 1
                for end in range(match.end() - 1, len(text)):
                    depth += {"(": 1, ")": -1}.get(text[end], 0)
                    if depth == 0:
                        break
                calls.append((path.relative_to(REPO_ROOT), text[match.start() : end + 1]))
    assert calls, "no torch.load found: the check is looking in the wrong place"
    unsafe = [(str(p), c) for p, c in calls if not re.search(r"weights_only\s*=\s*True", c)]
    assert unsafe == [], json.dumps(unsafe, indent=1)
