"""The browser demo end to end on CPU: the example's agent behind the WebRTC page service that
`duetaspan serve --webrtc --allow-force-ret` builds, called by an aiortc peer doing what the page does
(microphone playing a recorded question, the `duetaspan` data channel); the page's Force <ret> goes through
the real router (scripted LLM/ASR servers) to the built-in `get_time` tool, and the span reaches the page.

(`tests/adapters/webrtc/test_browser.py` drives the same page in real Chromium.)"""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from duetaspan.adapters.webrtc.serve import TOKEN_ENV, build_service
from duetaspan.agent import Agent
from duetaspan.server import create_app, mount
from examples.testing import wait_for
from tests.adapters.twilio.peer import run_uvicorn
from tests.adapters.webrtc.test_service import Peer
from tests.fakes.asr_server import ScriptedASRServer
from tests.fakes.llm_server import ScriptedLLMServer

HERE = Path(__file__).parent
TOKEN = "browser-demo-token-0123456789"
LLM_SCRIPT = {
    "rules": [
        {"match": "tokyo", "reply": {"tool_call": {"name": "get_time", "arguments": {"place": "Tokyo"}}}}
    ]
}


async def test_browser_demo_page_call_lands_a_span(tmp_path, monkeypatch, tiny_engine):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    llm = ScriptedLLMServer(LLM_SCRIPT)
    asr = ScriptedASRServer({"default": "What time is it in Tokyo at the moment?"})
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
        webrtc = build_service(agent, allow_force_ret=True)  # what serve --webrtc does
        app = create_app()
        mount(app, webrtc, "webrtc")
        try:
            async with agent, run_uvicorn(app) as base, aiohttp.ClientSession() as http:
                webrtc.agent = agent
                page = webrtc.page_url(base)
                assert page == f"{base}/?token={TOKEN}"
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
                await wait_for(lambda: peer.of("hello"), 20, "the page's hello")
                # the caller has asked (an utterance was transcribed), then presses Force <ret>
                await wait_for(lambda: peer.of("caller_text"), 30, "the caller's question")
                peer.channel.send(json.dumps({"label": "duetaspan", "type": "force_ret"}))
                await wait_for(lambda: peer.of("span"), 20, "the span card")
                await wait_for(lambda: peer.audio_frames > 50, 10, "the agent's voice")
                await peer.close()
                await wait_for(lambda: not webrtc.calls, 15, "the call to end")
        finally:
            await peer.close()
    span = peer.of("span")[0]
    assert span["tool"] == "get_time" and span["arguments"] == {"place": "Tokyo"}
    assert span["reference"].startswith("(tool result) ") and "Tokyo" in span["reference"]
    assert "Tokyo" in span["question"] and span["n_frames"] > 0
    assert "Tokyo" in peer.of("caller_text")[0]["text"]
    record = json.loads((tmp_path / "calls" / f"{answer['call_id']}.json").read_text())
    assert record["meta"]["transport"] == "webrtc" and record["spans"][0]["reference"] == span["reference"]
