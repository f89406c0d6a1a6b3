"""ChatClient against the scripted chat server over real loopback HTTP."""

from __future__ import annotations

import json
import time

import pytest

from duetaspan.adapters.llm import ChatClient, LLMError, LLMTimeout
from tests.fakes.llm_server import ScriptedLLMServer


async def test_tool_call_and_text_replies_are_flattened():
    server = ScriptedLLMServer(
        {
            "steps": [
                {"tool_call": {"name": "get_weather", "arguments": {"city": "Sydney"}}},
                {"content": '{"answer": "Paris is the capital of France."}'},
            ]
        }
    )
    async with server.serve() as url:
        client = ChatClient(url, "fake", api_key="k", timeout_s=5)
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
        reply = await client.complete([{"role": "user", "content": "weather?"}], tools=tools)
        assert reply.tool_calls[0].name == "get_weather"
        assert json.loads(reply.tool_calls[0].arguments_json) == {"city": "Sydney"}
        assert reply.elapsed_ms > 0
        reply = await client.complete([{"role": "user", "content": "capital?"}], json_object=True)
        assert reply.tool_calls == [] and "Paris" in reply.content
        await client.aclose()
    first, second = server.requests
    assert first["tools"] == tools and first["tool_choice"] == "auto" and first["temperature"] == 0.0
    assert second["response_format"] == {"type": "json_object"} and "tools" not in second


async def test_http_500_is_an_llm_error_without_retry():
    server = ScriptedLLMServer({"default": {"status": 500}})
    async with server.serve() as url:
        client = ChatClient(url + "/v1", "fake", api_key="k")
        with pytest.raises(LLMError, match="HTTP 500"):
            await client.complete([{"role": "user", "content": "x"}])
        await client.aclose()
    assert len(server.requests) == 1  # no hidden retries


async def test_hanging_server_times_out_on_time():
    server = ScriptedLLMServer({"default": {"hang": True}})
    async with server.serve() as url:
        client = ChatClient(url, "fake", api_key="k", timeout_s=0.3)
        start = time.perf_counter()
        with pytest.raises(LLMTimeout):
            await client.complete([{"role": "user", "content": "x"}])
        assert time.perf_counter() - start < 1.5
        await client.aclose()


async def test_garbage_body_and_refused_connection_are_llm_errors(free_port):
    server = ScriptedLLMServer({"default": {"body": "<html>not json"}})
    async with server.serve() as url:
        client = ChatClient(url, "fake", api_key="k")
        with pytest.raises(LLMError):
            await client.complete([{"role": "user", "content": "x"}])
        await client.aclose()
    client = ChatClient(f"http://127.0.0.1:{free_port}", "fake", api_key="k", timeout_s=2)
    with pytest.raises(LLMError):
        await client.complete([{"role": "user", "content": "x"}])
    await client.aclose()


def test_cli_serves_a_script_file(tmp_path, free_port):
    import subprocess
    import sys
    import urllib.request

    from tests.support import REPO_ROOT

    script = tmp_path / "script.json"
    script.write_text(json.dumps({"default": {"content": "hello"}}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.llm_server", "--port", str(free_port), "--script", str(script)],
        cwd=REPO_ROOT,
    )
    try:
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
        deadline = time.monotonic() + 20
        while True:
            try:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{free_port}/v1/chat/completions",
                    data=body,
                    headers={"Content-Type": "application/json"},
                )
                with urllib.request.urlopen(request, timeout=2) as response:
                    reply = json.loads(response.read())
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert reply["choices"][0]["message"]["content"] == "hello"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
