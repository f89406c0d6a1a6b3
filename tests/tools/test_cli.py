"""`duetaspan tools list | call | serve-mcp` as real subprocesses (a relied-on contract), serve-mcp driven by a
real MCP client over stdio and streamable HTTP, and the export in-process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx2
from mcp import Client, StdioServerParameters

from duetaspan.adapters.mcp import build_mcp_server
from duetaspan.registry import ToolRegistry, tool
from duetaspan.tools import builtin_tools
from tests.support import free_port, has_card

TEST_SERVER = Path(__file__).resolve().parents[1] / "adapters" / "mcp" / "server_app.py"
CLI = [sys.executable, "-m", "duetaspan", "tools"]


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, check=False)


def write_agent(tmp_path: Path, mcp: bool = True) -> Path:
    (tmp_path / "shop_tools.py").write_text(
        "from duetaspan.registry import tool\n\n"
        "@tool(redact=['card'])\n"
        "def order_status(order_id: str, card: str = '') -> dict:\n"
        "    '''Status of an order.\n\n    Args:\n        order_id: the order number\n    '''\n"
        "    return {'order': order_id, 'status': 'shipped'}\n"
    )
    path = tmp_path / ("agent.toml" if mcp else "python_only.toml")
    text = '[tools]\nmodules = ["shop_tools"]\nbuiltins = ["calculate"]\n\n'
    if mcp:
        text += (
            f'[[mcp_servers]]\nname = "test"\ncommand = {json.dumps(sys.executable)}\n'
            f'args = [{json.dumps(str(TEST_SERVER))}]\nallow = ["add", "db.lookup"]\n'
        )
    path.write_text(text)
    return path


def test_list_and_call_builtins_without_config():
    listed = run_cli("list")
    assert listed.returncode == 0, listed.stderr
    names = [line.split()[0] for line in listed.stdout.splitlines()]
    assert names == ["get_time", "get_weather", "web_search", "calculate", "end_call", "transfer_call",
                     "send_dtmf", "opt_out"]  # fmt: skip
    assert "[side effect]" in listed.stdout.splitlines()[-1]
    as_json = json.loads(run_cli("list", "--json").stdout)
    assert as_json[3]["name"] == "calculate" and as_json[3]["parameters"]["required"] == ["expression"]

    called = run_cli("call", "calculate", '{"expression": "6 * 7"}')
    assert called.returncode == 0, called.stderr
    out = json.loads(called.stdout)
    assert (
        out["ok"] is True and out["reference"] == "(tool result) 6 * 7 = 42." and out["data"]["value"] == 42
    )

    bad = run_cli("call", "calculate", '{"expression": "1/0"}')
    assert bad.returncode == 1 and json.loads(bad.stdout)["error"] == "division by zero"
    assert run_cli("call", "nope").returncode == 1
    not_json = run_cli("call", "calculate", "{oops")
    assert not_json.returncode == 2 and "not valid JSON" in not_json.stderr


def test_call_gives_the_tool_a_call_context(tmp_path: Path):
    (tmp_path / "ctx_tools.py").write_text(
        "from duetaspan.registry import CallContext, tool\n\n"
        "@tool\n"
        "def who_is_calling(ctx: CallContext) -> dict:\n"
        '    """The call context the tool sees."""\n'
        "    return {'caller': ctx.caller, 'called': ctx.called, 'dtmf': ctx.dtmf}\n"
    )
    (tmp_path / "agent.toml").write_text('[tools]\nmodules = ["ctx_tools"]\n')
    args = ("call", "who_is_calling", "--config", str(tmp_path / "agent.toml"))
    called = run_cli(*args, "--caller", "+15550001111", "--called", "+15552223333", "--dtmf", "1234")
    assert called.returncode == 0, called.stderr
    data = json.loads(called.stdout)["data"]
    assert data == {"caller": "+15550001111", "called": "+15552223333", "dtmf": "1234"}
    assert json.loads(run_cli(*args).stdout)["data"] == {"caller": None, "called": None, "dtmf": ""}


def test_list_and_call_with_config_modules_and_mcp(tmp_path: Path):
    agent = write_agent(tmp_path)
    listed = run_cli("list", "--config", str(agent))
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line.split()[1] for line in listed.stdout.splitlines()}
    assert rows == {
        "calculate": "python",
        "order_status": "python",
        "add": "mcp:test",
        "db_lookup": "mcp:test",
    }
    python_only = str(write_agent(tmp_path, mcp=False))
    called = run_cli(
        "call", "order_status", '{"order_id": "A17", "card": "4111111111111111"}', "--config", python_only
    )
    out = json.loads(called.stdout)
    assert out["reference"] == "(tool result) order: A17, status: shipped."
    assert out["arguments"]["card"] == "[redacted]" and not has_card(called.stdout)
    mcp_call = json.loads(run_cli("call", "db_lookup", '{"key": "x"}', "--config", str(agent)).stdout)
    assert mcp_call["reference"] == "(tool result) value of x"
    broken = tmp_path / "broken.toml"
    broken.write_text('[[mcp_servers]]\nname = "x"\n')
    failed = run_cli("list", "--config", str(broken))
    assert (
        failed.returncode == 2
        and "mcp_servers[0]: needs `command` (a stdio server) or `url` (a streamable-HTTP server)"
        in failed.stderr
    )


async def test_serve_mcp_stdio_driven_by_mcp_client():
    params = StdioServerParameters(command=sys.executable, args=["-m", "duetaspan", "tools", "serve-mcp"])
    async with Client(params, read_timeout_seconds=20) as client:
        tools = (await client.list_tools()).tools
        by_name = {t.name: t for t in tools}
        assert set(by_name) == {
            "get_time",
            "get_weather",
            "web_search",
            "calculate",
            "end_call",
            "transfer_call",
            "send_dtmf",
            "opt_out",
        }
        assert by_name["calculate"].input_schema["required"] == ["expression"]
        assert by_name["end_call"].annotations.destructive_hint is True
        r = await client.call_tool("calculate", {"expression": "2 ** 8"})
        assert not r.is_error and r.content[0].text == "(tool result) 2 ** 8 = 256."
        assert r.structured_content["value"] == 256
        r = await client.call_tool("get_time", {"place": "Nowhere Land"})
        assert r.is_error and "Nowhere Land" in r.content[0].text
        r = await client.call_tool("end_call", {"reason": "done"})
        assert r.structured_content["actions"] == [{"kind": "end_call", "target": None, "reason": "done"}]


async def test_serve_mcp_http_driven_by_mcp_client(tmp_path: Path):
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *CLI, "serve-mcp", "--http", str(port), "--config", str(write_agent(tmp_path)),
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        deadline = time.monotonic() + 30
        async with httpx2.AsyncClient() as http:
            while True:  # wait for the port
                try:
                    await http.get(url)
                    break
                except httpx2.TransportError:
                    assert proc.returncode is None and time.monotonic() < deadline, "serve-mcp did not start"
                    await asyncio.sleep(0.2)
        async with Client(url, read_timeout_seconds=20) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert names == {"calculate", "order_status", "add", "db_lookup"}
            r = await client.call_tool("order_status", {"order_id": "B2"})
            assert r.content[0].text == "(tool result) order: B2, status: shipped."
            r = await client.call_tool("add", {"a": 1, "b": 2})  # proxied to the stdio MCP server
            assert r.content[0].text == "(tool result) 3"
            r = await client.call_tool("order_status", {})
            assert r.is_error and "order_id" in r.content[0].text
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 15)


async def test_export_in_process_roundtrip():
    @tool(side_effect=True)
    def book(slot: str) -> str:
        """Book a slot."""
        return f"Booked {slot}."

    server = build_mcp_server(ToolRegistry([book, *builtin_tools(names=["calculate"])]))
    async with Client(server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert tools["book"].annotations.destructive_hint and tools["calculate"].annotations.read_only_hint
        r = await client.call_tool("book", {"slot": "9am"})
        assert r.content[0].text == "(tool result) Booked 9am." and r.structured_content == {
            "result": "Booked 9am."
        }
        r = await client.call_tool("missing", {})
        assert r.is_error and "missing" in r.content[0].text
