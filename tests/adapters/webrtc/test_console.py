"""The page's tool console on a real loopback server with a real tiny-random agent: the page token guards
every endpoint, bodies are bounded, a side-effect tool never runs without an explicit confirmation, results
carry redacted arguments, and a result lands as a Context Span in a live call made by an aiortc peer (the
span comes back over the data channel and is in the call's record)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from pydantic import SecretStr

from duetaspan.adapters.webrtc.service import WebRTCService, WebRTCSettings
from duetaspan.agent import Agent
from duetaspan.registry import tool
from duetaspan.server import create_app, mount, serve
from tests.adapters.webrtc.test_service import Peer, _port_open, _until
from tests.support import free_port

TOKEN = "console-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
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


async def test_console_guards_confirms_and_lands_a_result_in_a_live_call(tmp_path):
    OPENED.clear()
    service = WebRTCService(WebRTCSettings(token=SecretStr(TOKEN)))
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
            # the token guards every console endpoint, like the page's own
            for method, path in (("GET", "/webrtc/tools"), ("POST", "/webrtc/tools/run"),
                                 ("POST", "/webrtc/tools/land")):  # fmt: skip
                assert (await call(method, path, {}, headers={}))[0] == 401
                bad = {"Authorization": "Bearer not-the-token-at-all"}
                assert (await call(method, path, {}, headers=bad))[0] == 403
            status, body = await call("GET", "/webrtc/tools")
            assert status == 503 and "loading" in body["error"]  # no agent yet

            async with agent:
                service.agent = agent
                status, body = await call("GET", "/webrtc/config")
                assert body["tools"] is True
                status, body = await call("GET", "/webrtc/tools")
                tools = {t["name"]: t for t in body["tools"]}
                assert set(tools) == {"get_time", "open_door"}
                assert tools["open_door"]["side_effect"] and not tools["get_time"]["side_effect"]
                assert tools["open_door"]["parameters"]["required"] == ["door", "pin"]
                assert tools["get_time"]["source"] == "python"

                # bounded, validated bodies
                huge = {"name": "get_time", "arguments": {"place": "x" * 20_000}}
                status, body = await call("POST", "/webrtc/tools/run", huge)
                assert status == 400 and "larger than" in body["error"]
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
                status, body = await call("POST", "/webrtc/tools/run", {**door, "confirm": True})
                assert status == 200 and body["ok"] and OPENED == ["front"]
                assert body["arguments"] == {"door": "front", "pin": "[redacted]"}
                assert body["reference"] == "(tool result) The front door is open."

                status, ran = await call(
                    "POST", "/webrtc/tools/run", {"name": "get_time", "arguments": {"place": "Tokyo"}}
                )
                assert status == 200 and ran["ok"] and "Tokyo" in ran["reference"] and ran["data"]
                status, body = await call(
                    "POST", "/webrtc/tools/land", {"result_id": ran["result_id"], "call_id": "web-x"}
                )
                assert status == 404 and "no live page call" in body["error"]

                # a live call: the result lands as a span in it
                async with http.post(base + "/webrtc/offer", json=await peer.offer(), headers=AUTH) as resp:
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
                await peer.close()
                await _until(lambda: not service.calls, 15, "the call to end after the hang-up")
        record = json.loads((tmp_path / "calls" / f"{answer['call_id']}.json").read_text())
        assert [s["reference"] for s in record["spans"]] == [ran["reference"]]
    finally:
        await peer.close()
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
