"""MCP client: real servers over stdio (subprocess) and streamable HTTP (on a free port), into the registry."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from duetaspan.adapters.mcp import MCPConnectionError, MCPToolset, llm_tool_name, stdio_environment
from duetaspan.config import MCPServerConfig
from duetaspan.registry import NO_INFO, ToolArgumentsInvalid, ToolFailed, ToolRegistry, ToolTimeout
from duetaspan.tools import builtin_tools
from tests.support import free_port

SERVER = str(Path(__file__).with_name("server_app.py"))


def stdio_config(**overrides) -> MCPServerConfig:
    return MCPServerConfig(name="test", command=sys.executable, args=[SERVER], **overrides)


async def test_stdio_tools_in_registry_results_errors_and_names():
    registry = ToolRegistry(builtin_tools(names=["get_time"]))
    async with MCPToolset([stdio_config(timeout_s=5)]) as mcp:
        added = mcp.register(registry)
        names = [t.name for t in added]
        # '.' is not accepted by chat APIs; get_time collides with the built-in -> server__tool
        assert names == ["add", "weather", "echo", "fail", "slow", "crash_once", "env_report", "db_lookup",
                         "test__get_time", "pid"]  # fmt: skip
        spec = registry.get("db_lookup").spec
        assert spec.source == "mcp:test" and spec.meta["mcp_name"] == "db.lookup" and spec.timeout == 5
        assert spec.parameters["required"] == ["key"]
        assert {t["function"]["name"] for t in registry.openai_tools()} >= {"add", "db_lookup", "get_time"}

        r = await registry.call("add", {"a": 2, "b": 3})
        assert r.ok and r.data == {"result": 5} and r.reference == "(tool result) 5"
        r = await registry.call("weather", {"city": "Oslo"})  # structured_content preferred as data
        assert (
            r.data == {"city": "Oslo", "temp_c": 21.5}
            and r.reference == "(tool result) city: Oslo, temp c: 21.5."
        )
        r = await registry.call("db_lookup", {"key": "k1"})
        assert r.reference == "(tool result) value of k1"
        assert (await registry.call("test__get_time", {})).reference == "(tool result) server time"
        assert (await registry.call("get_time", {"place": "Tokyo"})).data["timezone"] == "Asia/Tokyo"

        r = await registry.call("fail", {"reason": "no such booking"})
        assert not r.ok and isinstance(r.exception, ToolFailed) and "no such booking" in r.error
        assert r.reference == NO_INFO
        r = await registry.call("add", {"a": "two"})  # validated locally against the listed schema
        assert not r.ok and isinstance(r.exception, ToolArgumentsInvalid) and "'b' is a required" in r.error
        r = await registry.call("not_a_tool", {})
        assert not r.ok and "not_a_tool" in r.error


async def test_timeout_cancels_and_connection_stays_usable():
    registry = ToolRegistry()
    async with MCPToolset([stdio_config(timeout_s=0.5)]) as mcp:
        mcp.register(registry)
        t0 = time.perf_counter()
        r = await registry.call("slow", {"seconds": 30})
        assert not r.ok and isinstance(r.exception, ToolTimeout)
        assert time.perf_counter() - t0 < 2.0
        r = await registry.call("slow", {"seconds": 0.05})
        assert r.ok and r.reference == "(tool result) slept 0.05"
        # cancelling the caller (the router's deadline) cancels the call
        task = asyncio.create_task(registry.call("slow", {"seconds": 0.4}, timeout_s=10))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await registry.call("add", {"a": 1, "b": 1})).data == {"result": 2}
        assert mcp.connections[0].restarts == 0


async def test_crash_mid_call_restarts_server_and_retries_once(tmp_path: Path):
    registry = ToolRegistry()
    async with MCPToolset([stdio_config(timeout_s=15)]) as mcp:
        mcp.register(registry)
        first_pid = (await registry.call("pid", {})).data["result"]
        marker = tmp_path / "crashed"
        r = await registry.call("crash_once", {"marker": str(marker)})
        assert r.ok, r.error
        assert r.reference == f"(tool result) survived after {first_pid}"  # the first process died mid-call
        second_pid = (await registry.call("pid", {})).data["result"]
        assert second_pid != first_pid and mcp.connections[0].restarts == 1


async def test_stdio_server_gets_only_allowed_environment(monkeypatch):
    monkeypatch.setenv("DUETASPAN_FAKE_SECRET", "sk-live-do-not-leak")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-also-secret")
    monkeypatch.setenv("CRM_REGION", "eu-west")
    config = stdio_config(env_allow=["CRM_REGION", "NOT_SET_ANYWHERE"], env={"CRM_MODE": "test"},
                          allow=["env_report"])  # fmt: skip
    assert stdio_environment(config) == {"CRM_REGION": "eu-west", "CRM_MODE": "test"}
    registry = ToolRegistry()
    async with MCPToolset([config]) as mcp:
        assert [t.name for t in mcp.register(registry)] == ["env_report"]  # allow-list of tools
        env = (await registry.call("env_report", {})).data
    assert env["CRM_REGION"] == "eu-west" and env["CRM_MODE"] == "test"
    assert "PATH" in env
    assert "DUETASPAN_FAKE_SECRET" not in env and "OPENAI_API_KEY" not in env
    assert "sk-live-do-not-leak" not in repr(env)


async def test_streamable_http_server_deny_list_and_prefix():
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, SERVER, "--http", str(port), stderr=asyncio.subprocess.DEVNULL
    )
    try:
        config = MCPServerConfig(name="remote", url=f"http://127.0.0.1:{port}/mcp", headers={"X-Test": "1"},
                                 deny=["crash_once", "env_report"], prefix=True)  # fmt: skip
        registry = ToolRegistry()
        deadline = time.monotonic() + 20
        while True:
            try:
                mcp = MCPToolset([config])
                await mcp.start()
                break
            except MCPConnectionError:
                if time.monotonic() > deadline or proc.returncode is not None:
                    raise
                await asyncio.sleep(0.2)
        try:
            names = [t.name for t in mcp.register(registry)]
            assert "remote__add" in names and "remote__db_lookup" in names
            assert not any("crash_once" in n or "env_report" in n for n in names)
            r = await registry.call("remote__add", {"a": 20, "b": 22})
            assert r.ok and r.data == {"result": 42}
            r = await registry.call("remote__fail", {})
            assert not r.ok and "bad input" in r.error
        finally:
            await mcp.close()
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 10)


async def test_third_party_mcp_server_time():
    config = MCPServerConfig(name="time", command=sys.executable, args=["-m", "mcp_server_time",
                             "--local-timezone", "UTC"])  # fmt: skip
    registry = ToolRegistry(builtin_tools(names=["get_time"]))
    async with MCPToolset([config]) as mcp:
        names = [t.name for t in mcp.register(registry)]
        assert "get_current_time" in names
        r = await registry.call("get_current_time", {"timezone": "Asia/Tokyo"})
        assert r.ok, r.error
        assert r.data["timezone"] == "Asia/Tokyo" and "datetime" in r.data
        assert r.reference.startswith("(tool result) ") and "Asia/Tokyo" in r.reference
        r = await registry.call("get_current_time", {"timezone": "Mars/Olympus"})
        assert not r.ok and r.reference == NO_INFO


async def test_connect_failure_names_the_server():
    config = MCPServerConfig(name="ghost", command="/nonexistent/mcp-server", connect_timeout_s=5)
    with pytest.raises(
        MCPConnectionError, match=r"mcp_servers 'ghost': cannot connect to `/nonexistent/mcp-server`"
    ):
        async with MCPToolset([config]):
            pass


async def test_connect_failures_say_what_failed():
    missing = MCPServerConfig(name="nope", command="no-such-mcp-server-xyz", connect_timeout_s=10)
    with pytest.raises(
        MCPConnectionError, match=r"the command 'no-such-mcp-server-xyz' is not found"
    ) as info:
        async with MCPToolset([missing]):
            pass
    assert "ExceptionGroup" not in str(info.value) and "PATH" in str(info.value)
    exits = MCPServerConfig(
        name="dies", command=sys.executable, args=["-c", "import sys; sys.exit(3)"], connect_timeout_s=20
    )
    with pytest.raises(
        MCPConnectionError, match=r"the server process exited .* before the MCP handshake"
    ) as info:
        async with MCPToolset([exits]):
            pass
    assert "Connection closed" not in str(info.value)


def test_llm_tool_names():
    assert llm_tool_name("db.lookup") == "db_lookup"
    assert llm_tool_name("a" * 100) == "a" * 64
    assert llm_tool_name("café/menu") == "caf__menu"
