"""The WebRTC service on a real loopback server (uvicorn) with a real tiny-random agent, called by an aiortc
peer (no browser needed): token and offer refusals, 503 while loading and when all slots are busy, audio both
ways, data-channel events, a page-forced `<ret>` landing a span, and the call ending when the peer hangs up."""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import json
import time
from typing import Any

import aiohttp
import av
import numpy as np
import soxr
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription
from pipecat.transports.smallwebrtc.connection import SmallWebRTCConnection
from pydantic import SecretStr

from duetaspan.adapters.webrtc.service import WebRTCService, WebRTCSettings
from duetaspan.adapters.webrtc.transport import PageTransport
from duetaspan.agent import Agent
from duetaspan.server import create_app, mount, serve
from tests.support import free_port, load_wav

TOKEN = "service-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RATE = 48_000
CHUNK = 960  # 20 ms


class FixtureTrack(MediaStreamTrack):
    """A microphone playing a fixture phrase in a loop, paced in real time (48 kHz mono, 20 ms frames)."""

    kind = "audio"

    def __init__(self, name: str) -> None:
        super().__init__()
        pcm, rate = load_wav(name)
        pcm = np.concatenate([soxr.resample(pcm, rate, RATE), np.zeros(RATE, np.float32)])
        self._pcm = np.clip(np.rint(pcm * 32767), -32768, 32767).astype("<i2")
        self._pts = 0
        self._start: float | None = None

    async def recv(self) -> av.AudioFrame:
        if self._start is None:
            self._start = time.monotonic()
        else:
            self._pts += CHUNK
            await asyncio.sleep(max(0.0, self._start + self._pts / RATE - time.monotonic()))
        i = self._pts % (len(self._pcm) - CHUNK)
        frame = av.AudioFrame(format="s16", layout="mono", samples=CHUNK)
        frame.planes[0].update(self._pcm[i : i + CHUNK].tobytes())
        frame.sample_rate, frame.pts, frame.time_base = RATE, self._pts, fractions.Fraction(1, RATE)
        return frame


class Peer:
    """An aiortc peer doing what the page does: mic track, `duetaspan` data channel with pings, offer."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection()
        self.pc.addTrack(FixtureTrack("time_tokyo"))
        self.channel = self.pc.createDataChannel("duetaspan")
        self.messages: list[dict[str, Any]] = []
        self.audio_frames = 0
        self.audio_energy = 0.0
        self._tasks: list[asyncio.Task] = []
        self.channel.on("message", lambda m: self.messages.append(json.loads(m)))
        self.channel.on("open", lambda: self._tasks.append(asyncio.ensure_future(self._ping())))
        self.pc.on("track", lambda track: self._tasks.append(asyncio.ensure_future(self._listen(track))))

    async def offer(self) -> dict[str, str]:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return {"sdp": self.pc.localDescription.sdp, "type": self.pc.localDescription.type}

    async def answer(self, body: dict[str, Any]) -> None:
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=body["sdp"], type=body["type"]))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m.get("type") == kind]

    async def _ping(self) -> None:
        while self.channel.readyState == "open":
            self.channel.send("ping")
            await asyncio.sleep(1.0)

    async def _listen(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(Exception):
            while True:
                frame = await track.recv()
                pcm = frame.to_ndarray().astype(np.float32) / 32768.0
                self.audio_frames += 1
                self.audio_energy += float(np.sum(pcm * pcm))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.pc.close()


class AnswerEveryRet:
    """A scripted `<ret>` backend: every `<ret>` is answered by a get_time reference."""

    def __init__(self, deliver, on_event) -> None:
        self.deliver = deliver

    def feed(self, pcm, t) -> None:
        pass

    def on_ret(self, frame_index, t, caller_t=None) -> None:
        meta = {"tool": "get_time", "arguments": {"place": "Tokyo"}, "question": "What time is it in Tokyo?"}
        self.deliver("(tool result) It is 3 PM in Tokyo.", meta)

    def close(self) -> None:
        pass


async def _until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def test_an_aiortc_peer_calls_the_agent_through_the_page_endpoints():
    service = WebRTCService(WebRTCSettings(token=SecretStr(TOKEN), allow_force_ret=True))
    app = create_app()
    mount(app, service, "webrtc")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = asyncio.create_task(serve(app, host="127.0.0.1", port=port))
    agent = Agent(
        persona="You are Ada.",
        model="tiny-random",
        device="cpu",
        max_calls=1,
        seed=0,
        retrieval_builder=lambda agent, ctx: AnswerEveryRet,
    )
    peer, second = Peer(), Peer()
    try:
        async with aiohttp.ClientSession() as http:
            await _until(lambda: server.done() or _port_open(port), 10, "the server")
            async with http.get(base + "/?token=" + TOKEN) as resp:
                assert resp.status == 200 and "/webrtc/static/app.js" in await resp.text()
                assert resp.headers["cache-control"] == "no-store"
            async with http.get(base + "/webrtc/static/app.js") as resp:
                assert resp.status == 200 and "window.__stats" in await resp.text()
            async with http.get(base + "/webrtc/config", headers=AUTH) as resp:
                assert await resp.json() == {
                    "ice_servers": [],
                    "force_ret": True,
                    "version": _version(),
                    "ready": False,
                    "tools": False,
                    "admin": "token",  # no $DUETASPAN_ADMIN_TOKEN and not the local demo: the role is off
                }
            offer = await peer.offer()
            async with http.post(base + "/webrtc/offer", json=offer, headers=AUTH) as resp:
                assert resp.status == 503 and "loading" in (await resp.json())["error"]

            # chunked upload without a Content-Length: the limit holds while reading
            async def big():
                for _ in range(20):
                    yield b"x" * 8192

            async with http.post(base + "/webrtc/offer", data=big(), headers=AUTH) as resp:
                assert resp.status == 413 and "larger than" in (await resp.json())["error"]

            async with agent:
                service.agent = agent
                async with http.post(base + "/webrtc/offer", json=offer, headers=AUTH) as resp:
                    assert resp.status == 200
                    answer = await resp.json()
                assert answer["type"] == "answer" and answer["call_id"].startswith("web-")
                await peer.answer(answer)
                await _until(lambda: peer.of("hello"), 20, "the hello message")
                assert peer.of("hello")[0] == {
                    "label": "duetaspan", "type": "hello", "call_id": answer["call_id"], "force_ret": True,
                }  # fmt: skip
                # the only slot is taken: a second caller is told so
                async with http.post(base + "/webrtc/offer", json=await second.offer(), headers=AUTH) as resp:
                    assert resp.status == 503 and "busy" in (await resp.json())["error"]
                await _until(
                    lambda: any(m["caller_sound_seconds"] > 2.0 for m in peer.of("stats")), 30, "caller audio"
                )
                await _until(lambda: peer.audio_frames > 100 and peer.of("agent_text"), 10, "agent audio")
                peer.channel.send(json.dumps({"label": "duetaspan", "type": "force_ret"}))
                await _until(lambda: peer.of("span"), 20, "the span")
                assert peer.audio_energy > 0
                await peer.close()
                await _until(lambda: not service.calls, 15, "the call to end after the hang-up")
                assert service.finished == [answer["call_id"]]
                assert agent.free_slots == 1
    finally:
        await peer.close()
        await second.close()
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
    span = peer.of("span")[0]
    assert span["tool"] == "get_time" and span["arguments"] == {"place": "Tokyo"}
    assert span["reference"] == "(tool result) It is 3 PM in Tokyo." and span["n_frames"] > 0
    assert peer.of("ret") and peer.of("ret")[0]["t"] <= span["t"]


async def test_force_ret_only_when_allowed():
    for allowed in (False, True):
        transport = PageTransport(SmallWebRTCConnection(), call_id="web-x", allow_force_ret=allowed)
        calls: list[object] = []

        @transport.event_handler("on_force_ret")
        async def _forced(t, calls=calls):
            calls.append(t)

        await transport._on_page_message({"label": "duetaspan", "type": "force_ret"})
        await transport._on_page_message({"label": "duetaspan", "type": "drop_tables"})
        await transport._on_page_message({"type": "force_ret"})  # not ours
        await asyncio.sleep(0.05)
        assert len(calls) == int(allowed)


def _port_open(port: int) -> bool:
    import socket

    with contextlib.closing(socket.socket()) as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _version() -> str:
    from duetaspan import __version__

    return __version__


async def test_a_page_call_past_max_call_s_is_ended_by_the_server(tmp_path):
    """`[server] max_call_s` on WebRTC: a page that never hangs up is ended by the server when the call is that
    old (the service ends its pipeline, the transport closes the peer connection), the slot comes back and the
    record says `ended_by: "max_duration"`."""
    from duetaspan.config import AgentConfig

    service = WebRTCService(WebRTCSettings(token=SecretStr(TOKEN)))
    app = create_app()
    mount(app, service, "webrtc")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = asyncio.create_task(serve(app, host="127.0.0.1", port=port))
    config = AgentConfig.model_validate({"server": {"max_call_s": 3.0}})
    agent = Agent(model="tiny-random", device="cpu", router=False, max_calls=1, seed=0, record_dir=tmp_path,
                  config=config)  # fmt: skip
    peer = Peer()
    try:
        async with aiohttp.ClientSession() as http, agent:
            await _until(lambda: server.done() or _port_open(port), 10, "the server")
            service.agent = agent
            async with http.post(base + "/webrtc/offer", json=await peer.offer(), headers=AUTH) as resp:
                assert resp.status == 200
                answer = await resp.json()
            await peer.answer(answer)
            await _until(lambda: peer.of("hello"), 30, "the hello message")
            started = time.monotonic()
            # the page keeps its microphone and data channel open: only the server can end this call
            await _until(lambda: answer["call_id"] in service.finished, 60, "the server to end the call")
            held_s = time.monotonic() - started
            await _until(lambda: peer.pc.connectionState in ("closed", "failed", "disconnected")
                         or peer.channel.readyState != "open", 30, "the page's connection closed")  # fmt: skip
            await _until(lambda: agent.free_slots == 1, 30, "the slot back")
            record_path = tmp_path / f"{answer['call_id']}.json"
            await _until(record_path.is_file, 30, "the call record")
    finally:
        await peer.close()
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
    assert held_s < 45, held_s  # ended by the limit (3 s of call), not by a timeout of the test
    record = json.loads(record_path.read_text())
    assert record["summary"]["ended_by"] == "max_duration" and record["complete"] is True
