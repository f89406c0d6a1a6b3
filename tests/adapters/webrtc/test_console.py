"""The page's tool console on a real loopback server with a real tiny-random agent: the admin token (never
the page token, never a query string) guards every console and recent-calls endpoint, bodies are bounded, a side-effect tool never runs without an explicit confirmation, results
carry redacted arguments, and a result lands as a Context Span in a live call made by an aiortc peer (the
span comes back over the data channel and is in the call's record, which the server then lists and shows in
the call viewer). In Chromium: the first-run server's page does the same by hand."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from pydantic import SecretStr

from duetaspan.access import ADMIN_TOKEN_ENV, BearerRole
from duetaspan.adapters.webrtc.service import WebRTCService, WebRTCSettings
from duetaspan.agent import Agent
from duetaspan.registry import tool
from duetaspan.server import create_app, mount, serve
from tests.adapters.webrtc.browser import CHROMIUM, Chromium, fake_mic_wav
from tests.adapters.webrtc.test_service import Peer, _port_open, _until
from tests.support import REPO_ROOT, free_port, has_number, stop_process, wait_until_healthy

TOKEN = "console-test-token-0123456789"
ADMIN = "console-test-admin-token-9876543210"
PAGE_AUTH = {"Authorization": f"Bearer {TOKEN}"}  # the page token: places a call, nothing else
AUTH = {"Authorization": f"Bearer {ADMIN}"}
OPENED: list[str] = []


@tool(side_effect=True, redact=["pin"])
def open_door(door: str, pin: str) -> str:
    """Open a door of the building.

    Args:
        door: which door
        pin: the door's PIN code
    """
    OPENED.append(door)
    return f"The {door} door is open."


@contextlib.asynccontextmanager
async def _calls_ended(service: WebRTCService, peer: Peer) -> AsyncIterator[None]:
    """On the way out (a failed assertion too), hang up and end the service's calls before the agent stops."""
    try:
        yield
    finally:
        await peer.close()
        await service.aclose()


async def test_console_guards_confirms_and_lands_a_result_in_a_live_call(tmp_path):
    OPENED.clear()
    admin = BearerRole("admin", ADMIN, ADMIN_TOKEN_ENV, open_without_token=False)
    service = WebRTCService(WebRTCSettings(token=SecretStr(TOKEN)), admin=admin)
    app = create_app()
    mount(app, service, "webrtc")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = asyncio.create_task(serve(app, host="127.0.0.1", port=port))
    agent = Agent(
        model="tiny-random", device="cpu", max_calls=1, seed=0, router=False, builtins=["get_time"],
        tools=[open_door], record_dir=tmp_path / "calls",
    )  # fmt: skip
    peer = Peer()
    try:
        async with aiohttp.ClientSession() as http:

            async def call(method: str, path: str, body=None, headers=AUTH, **kw):
                async with http.request(method, base + path, json=body, headers=headers, **kw) as resp:
                    return resp.status, await resp.json()

            await _until(lambda: server.done() or _port_open(port), 10, "the server")
            # the admin token guards every console endpoint: not the page token, not in a query string
            for method, path in (("GET", "/webrtc/tools"), ("POST", "/webrtc/tools/run"),
                                 ("POST", "/webrtc/tools/land"), ("GET", "/webrtc/calls")):  # fmt: skip
                assert (await call(method, path, {}, headers={}))[0] == 401
                bad = {"Authorization": "Bearer not-the-token-at-all"}
                assert (await call(method, path, {}, headers=bad))[0] == 401
                assert (await call(method, path, {}, headers=PAGE_AUTH))[0] == 401, path
                assert (await call(method, f"{path}?token={ADMIN}", {}, headers={}))[0] == 401, path
            status, body = await call("GET", "/webrtc/tools")
            assert status == 503 and "loading" in body["error"]  # no agent yet

            async with agent, _calls_ended(service, peer):
                service.agent = agent
                status, body = await call("GET", "/webrtc/config", headers=PAGE_AUTH)
                assert body["tools"] is True and body["admin"] == "token"
                status, body = await call("GET", "/webrtc/tools")
                tools = {t["name"]: t for t in body["tools"]}
                assert set(tools) == {"get_time", "open_door"}
                assert tools["open_door"]["side_effect"] and not tools["get_time"]["side_effect"]
                assert tools["open_door"]["parameters"]["required"] == ["door", "pin"]
                assert tools["get_time"]["source"] == "python"

                # bounded, validated bodies
                huge = {"name": "get_time", "arguments": {"place": "x" * 20_000}}
                status, body = await call("POST", "/webrtc/tools/run", huge)
                assert status == 413 and "larger than" in body["error"]

                async def chunked():  # no Content-Length: the limit holds while reading
                    yield b'{"name": "get_time", "arguments": {"place": "'
                    for _ in range(10):
                        yield b"x" * 4096
                    yield b'"}}'

                async with http.post(base + "/webrtc/tools/run", data=chunked(), headers=AUTH) as resp:
                    assert resp.status == 413 and "larger than" in (await resp.json())["error"]
                async with http.post(base + "/webrtc/tools/run", data=b"{nope", headers=AUTH) as resp:
                    assert resp.status == 400 and "not JSON" in (await resp.json())["error"]
                status, body = await call("POST", "/webrtc/tools/run", {"name": "get_time", "confirm": "yes"})
                assert status == 400 and "confirm" in body["error"]
                status, body = await call("POST", "/webrtc/tools/run", {"name": "nope"})
                assert status == 404 and "get_time" in body["error"]

                # a side-effect tool asks for confirmation and does not run without it
                door = {"name": "open_door", "arguments": {"door": "front", "pin": "1234"}}
                status, body = await call("POST", "/webrtc/tools/run", door)
                assert status == 409 and body["confirm_required"] and OPENED == []
                status, opened = await call("POST", "/webrtc/tools/run", {**door, "confirm": True})
                assert status == 200 and opened["ok"] and OPENED == ["front"]
                assert opened["arguments"] == {"door": "front", "pin": "[redacted]"}
                assert opened["reference"] == "(tool result) The front door is open."

                status, ran = await call(
                    "POST", "/webrtc/tools/run", {"name": "get_time", "arguments": {"place": "Tokyo"}}
                )
                assert status == 200 and ran["ok"] and "Tokyo" in ran["reference"] and ran["data"]
                status, body = await call(
                    "POST", "/webrtc/tools/land", {"result_id": ran["result_id"], "call_id": "web-x"}
                )
                assert status == 404 and "no live page call" in body["error"]

                # a live call: the result lands as a span in it
                async with http.post(
                    base + "/webrtc/offer", json=await peer.offer(), headers=PAGE_AUTH
                ) as resp:
                    answer = await resp.json()
                await peer.answer(answer)
                await _until(lambda: peer.of("hello"), 20, "the hello message")
                status, body = await call(
                    "POST", "/webrtc/tools/land", {"result_id": "0" * 16, "call_id": answer["call_id"]}
                )
                assert status == 404 and "no such tool result" in body["error"]
                land = {"result_id": ran["result_id"], "call_id": answer["call_id"]}
                status, body = await call("POST", "/webrtc/tools/land", land)
                assert status == 200 and body == {
                    "landed": True,
                    "call_id": answer["call_id"],
                    "reference": ran["reference"],
                }
                await _until(lambda: peer.of("span"), 20, "the span")
                span = peer.of("span")[0]
                assert span["reference"] == ran["reference"] and span["tool"] == "get_time"
                assert span["arguments"] == {"place": "Tokyo"} and span["n_frames"] > 0
                # a span's arguments are redacted on the page and in the record
                land = {"result_id": opened["result_id"], "call_id": answer["call_id"]}
                assert (await call("POST", "/webrtc/tools/land", land))[0] == 200
                await _until(lambda: len(peer.of("span")) == 2, 20, "the second span")
                assert peer.of("span")[1]["arguments"] == {"door": "front", "pin": "[redacted]"}
                await peer.close()
                await _until(lambda: not service.calls, 15, "the call to end after the hang-up")

                # recent calls behind the admin token: the list, and the call's viewer page
                assert (await call("GET", "/webrtc/calls", headers={}))[0] == 401
                assert (await call("GET", "/webrtc/calls?format=json", headers=PAGE_AUTH))[0] == 401
                status, listed = await call("GET", "/webrtc/calls?format=json")
                assert status == 200 and [c["call_id"] for c in listed["calls"]] == [answer["call_id"]]
                assert listed["calls"][0]["spans"] == 2 and listed["calls"][0]["transport"] == "webrtc"
                async with http.get(f"{base}/webrtc/calls", headers=AUTH) as resp:
                    assert f"/webrtc/calls/{answer['call_id']}'" in await resp.text()  # no token in links
                viewer_path = f"{base}/webrtc/calls/{answer['call_id']}"
                for headers in ({}, PAGE_AUTH):
                    async with http.get(viewer_path, headers=headers) as resp:
                        assert resp.status == 401
                async with http.get(viewer_path, headers=AUTH) as resp:
                    viewer = await resp.text()
                assert resp.status == 200 and f'"call_id":"{answer["call_id"]}"' in viewer
                assert "data:audio/ogg;base64," in viewer and ran["reference"] in viewer
                for bad in ("..%2Fsecret", ".hidden", "web-nope"):
                    async with http.get(f"{base}/webrtc/calls/{bad}", headers=AUTH) as resp:
                        assert resp.status == 404, bad
        record = json.loads((tmp_path / "calls" / f"{answer['call_id']}.json").read_text())
        assert [s["reference"] for s in record["spans"]] == [ran["reference"], opened["reference"]]
        assert not has_number(json.dumps(record), "1234")  # the PIN, not a timing's digits
    finally:
        await peer.close()
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)


DOOR_TOOLS = '''
from pathlib import Path

from duetaspan.registry import tool


@tool(side_effect=True, redact=["pin"])
def open_door(door: str, pin: str) -> str:
    """Open a door of the building.

    Args:
        door: which door
        pin: the door's PIN code
    """
    Path(__file__).with_name("opened.txt").write_text(door)
    return f"The {door} door is open."
'''
FIRST_RUN_TOML = """
[persona]
prompt = "You are Ada. You answer questions on a web page."

[tools]
builtins = ["get_time"]
modules = ["door_tools"]

[[mcp_servers]]
name = "clock"
command = {python}
args = ["-m", "mcp_server_time", "--local-timezone", "Europe/Paris"]

[webrtc]
ice_servers = []
"""


@contextlib.contextmanager
def _spawn(cmd: list[str], env: dict[str, str], folder: Path) -> Iterator[subprocess.Popen]:
    """The server as a subprocess, its stdout and stderr in `folder` (serve.out, serve.log)."""
    with (folder / "serve.out").open("wb") as out, (folder / "serve.log").open("wb") as err:
        yield subprocess.Popen(cmd, env=env, stdout=out, stderr=err, cwd=folder)


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/test.sh installs it)")
async def test_console_in_chromium_runs_a_tool_and_lands_its_span_in_the_call(tmp_path):
    """The first run, as the docs show it (no router, no API key): the page lists built-in, @tool and MCP
    tools, runs get_time, lands its reference in the live call and shows the span; the side-effect tool asks
    before it runs."""
    (tmp_path / "door_tools.py").write_text(DOOR_TOOLS)
    (tmp_path / "agent.toml").write_text(FIRST_RUN_TOML.format(python=json.dumps(sys.executable)))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "TWILIO_"))}
    env |= {"PYTHONPATH": str(REPO_ROOT), "DUETASPAN_WEBRTC_TOKEN": TOKEN}
    cmd = [
        sys.executable, "-m", "duetaspan", "-v", "serve", "--webrtc", "--host", "127.0.0.1", "--port", str(port),
        "--config", str(tmp_path / "agent.toml"), "--model", "tiny-random", "--max-calls", "1",
        "--record-dir", str(tmp_path / "calls"),
    ]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    with _spawn(cmd, env, tmp_path) as proc:
        try:
            await wait_until_healthy(base, proc, tmp_path / "serve.log", what="serve --webrtc")
            async with Chromium.launch(
                f"{base}/?token={TOKEN}", tmp_path / "chromium", mic_wav=fake_mic_wav("time_tokyo", tmp_path)
            ) as page:
                tools = await page.wait_for(
                    "window.__console && window.__console.tools.length && window.__console.tools", 30
                )
                await page.evaluate("document.getElementById('connect').click()", user_gesture=True)
                await page.wait_for("window.__stats.state === 'live' && window.__stats.events.hello", 30)
                # get_time for Tokyo, from the form the schema made
                await page.evaluate(
                    "(() => { const s = document.getElementById('tool-select'); s.value = 'get_time';"
                    " s.dispatchEvent(new Event('change'));"
                    " document.querySelector('#tool-form [name=place]').value = 'Tokyo';"
                    " document.getElementById('tool-run').click(); })()"
                )
                result = await page.wait_for("window.__console.result", 20)
                await page.wait_for("!document.getElementById('tool-land').disabled", 10)
                await page.evaluate("document.getElementById('tool-land').click()", user_gesture=True)
                spans = await page.wait_for("window.__stats.spans.length && window.__stats.spans", 20)
                cards = await page.evaluate(
                    "[...document.querySelectorAll('#spans .card')].map(c => c.innerText)"
                )
                # the side-effect tool: asked first, runs only once confirmed
                await page.evaluate(
                    "(() => { const s = document.getElementById('tool-select'); s.value = 'open_door';"
                    " s.dispatchEvent(new Event('change'));"
                    " document.querySelector('#tool-form [name=door]').value = 'front';"
                    " document.querySelector('#tool-form [name=pin]').value = '1234';"
                    " document.getElementById('tool-run').click(); })()"
                )
                await page.wait_for(
                    "window.__console.confirmAsked === 1 && !document.getElementById('tool-confirm').hidden",
                    10,
                )
                opened_before = (tmp_path / "opened.txt").exists()
                await page.evaluate("document.getElementById('tool-confirm-yes').click()", user_gesture=True)
                door = await page.wait_for(
                    "(r => r && r.tool === 'open_door' && r)(window.__console.result)", 20
                )
                state = await page.evaluate("({stats: window.__stats, console: window.__console})")
                await page.screenshot(tmp_path / "console.png")
                await page.evaluate("document.getElementById('connect').click()", user_gesture=True)
            for _ in range(100):  # the server closes the call's artifacts after the hang-up
                records = list((tmp_path / "calls").glob("web-*.json"))
                if records:
                    break
                await asyncio.sleep(0.1)
            assert proc.poll() is None
        finally:
            stop_process(proc)

    sources = {t["name"]: t["source"] for t in tools}
    assert sources["get_time"] == "python" and sources["open_door"] == "python"
    assert any(s.startswith("mcp:") for s in sources.values()), sources  # the MCP server's tools are listed
    assert result["ok"] and "Tokyo" in result["reference"] and result["arguments"] == {"place": "Tokyo"}
    assert spans[0]["reference"] == result["reference"] and spans[0]["tool"] == "get_time"
    assert any("get_time" in c and "Tokyo" in c for c in cards), cards
    assert not opened_before and (tmp_path / "opened.txt").read_text() == "front"
    assert door["ok"] and door["arguments"] == {"door": "front", "pin": "[redacted]"}
    assert state["console"]["errors"] == [] and state["stats"]["errors"] == []
    assert state["console"]["landed"] == [
        {"call_id": state["stats"]["callId"], "reference": result["reference"]}
    ]
    record = json.loads(records[0].read_text())
    assert [s["reference"] for s in record["spans"]] == [result["reference"]]
    assert not has_number((tmp_path / "serve.log").read_text(), "1234")  # the PIN never reaches the logs (a PID [21234] may)


def test_recent_calls_never_reach_outside_the_record_dir(tmp_path):
    from duetaspan.adapters.webrtc.calls import _record_path

    (tmp_path / "calls").mkdir()
    (tmp_path / "secret.json").write_text("{}")
    (tmp_path / "calls" / "CA1.jsonl").write_text("")
    assert _record_path(tmp_path / "calls", "../secret") is None
    assert _record_path(tmp_path / "calls", "CA1") == tmp_path / "calls" / "CA1.jsonl"
