"""The browser demo end to end on CPU: the example's agent served by `agent.serve(webrtc=True,
allow_force_ret=True)`, the code path of `duetaspan serve --webrtc --config examples/browser_demo/agent.toml
--allow-force-ret`, called by an aiortc peer doing what the page does
(microphone playing a recorded question, the `duetaspan` data channel); the page's Force <ret> goes through
the real router (scripted LLM/ASR servers) to the built-in `get_time` tool, and the span reaches the page.

(`tests/adapters/webrtc/test_browser.py` drives the same page in real Chromium.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from pathlib import Path

import aiohttp

from duetaspan.adapters.webrtc.serve import TOKEN_ENV
from duetaspan.agent import Agent
from duetaspan.testing import ScriptedASR, ScriptedLLM, free_port, wait_until
from tests.adapters.webrtc.test_service import Peer

HERE = Path(__file__).parent
TOKEN = "browser-demo-token-0123456789"
LLM_SCRIPT = {
    "rules": [
        {"match": "tokyo", "reply": {"tool_call": {"name": "get_time", "arguments": {"place": "Tokyo"}}}}
    ]
}


async def test_browser_demo_page_call_lands_a_span(tmp_path, monkeypatch, tiny_engine, caplog, capsys):
    caplog.set_level(logging.INFO, logger="duetaspan.webrtc")
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    llm = ScriptedLLM(LLM_SCRIPT)
    asr = ScriptedASR({"default": "What time is it in Tokyo at the moment?"})
    peer = Peer()  # its microphone says "What time is it in Tokyo at the moment?" (time_tokyo fixture)
    async with llm.serve() as llm_url, asr.serve() as asr_url:
        agent = Agent.from_config(
            HERE / "agent.toml",
            engine=tiny_engine,
            max_calls=1,
            seed=0,
            router={"base_url": f"{llm_url}/v1", "model": "scripted", "api_key_env": None},
            asr={"kind": "transcribe", "url": f"{asr_url}/transcribe"},
            record_dir=tmp_path / "calls",
        )
        port = free_port()
        server = asyncio.create_task(agent.serve(webrtc=True, allow_force_ret=True, port=port))
        base = f"http://127.0.0.1:{port}"  # [server] host of the example's agent.toml
        free_slots: list[int] = []

        async def health(http: aiohttp.ClientSession) -> None:
            async with http.get(base + "/health") as resp:
                if resp.status == 200:
                    free_slots.append((await resp.json())["transports"]["webrtc"]["free_slots"])

        try:
            async with aiohttp.ClientSession() as http:
                for _ in range(600):
                    assert not server.done(), server.exception()
                    with contextlib.suppress(aiohttp.ClientError):
                        await health(http)
                    if free_slots:
                        break
                    await asyncio.sleep(0.05)
                assert free_slots == [1], "agent.serve never became ready"
                page = f"{base}/?token={TOKEN}"
                assert f"WebRTC page: {page}" in capsys.readouterr().out  # printed once the model is up
                async with http.get(page) as resp:
                    assert resp.status == 200
                auth = {"Authorization": f"Bearer {TOKEN}"}
                async with http.get(base + "/webrtc/config", headers=auth) as resp:
                    config = await resp.json()
                assert config["ice_servers"] == [] and config["force_ret"] is True
                async with http.post(base + "/webrtc/offer", json=await peer.offer(), headers=auth) as resp:
                    assert resp.status == 200
                    answer = await resp.json()
                await peer.answer(answer)
                await wait_until(lambda: peer.of("hello"), 20, "the page's hello")
                # the caller has asked (an utterance was transcribed), then presses Force <ret>
                await wait_until(lambda: peer.of("caller_text"), 30, "the caller's question")
                peer.channel.send(json.dumps({"label": "duetaspan", "type": "force_ret"}))
                await wait_until(lambda: peer.of("span"), 20, "the span card")
                await wait_until(lambda: peer.audio_frames > 50, 10, "the agent's voice")
                await peer.close()
                await wait_until(
                    lambda: any("ended after" in r.getMessage() for r in caplog.records),
                    15,
                    "the call to end",
                )
                await health(http)
                assert free_slots[-1] == 1  # its slot is free again
        finally:
            await peer.close()
            server.cancel()
            await asyncio.gather(server, return_exceptions=True)
    assert not agent.started
    span = peer.of("span")[0]
    assert span["tool"] == "get_time" and span["arguments"] == {"place": "Tokyo"}
    assert span["reference"].startswith("(tool result) ") and "Tokyo" in span["reference"]
    assert "Tokyo" in span["question"] and span["n_frames"] > 0
    assert "Tokyo" in peer.of("caller_text")[0]["text"]
    record = json.loads((tmp_path / "calls" / f"{answer['call_id']}.json").read_text())
    assert record["meta"]["transport"] == "webrtc" and record["spans"][0]["reference"] == span["reference"]
