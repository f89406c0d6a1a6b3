"""WebRTC page calls on a real local Ray cluster (CPU, one tiny-random replica with 2 slots, Twilio served
too): the ingress serves the token-protected page and refuses bad tokens and offers as one process does, two
aiortc peers (the browser stand-in of the WebRTC tests) are answered by the replica and hear the agent while
it hears them, a third offer while both slots are busy is 503, and a hang-up frees its slot for a new call."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator

import aiohttp
import pytest
from pydantic import SecretStr

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'duetaspan[ray]')")

import ray
from ray import serve

from duetaspan.adapters.ray.app import build_app
from duetaspan.adapters.ray.config import AgentSpec, RayServeConfig, ReplicaOptions
from duetaspan.adapters.twilio.rest import TwilioCredentials
from duetaspan.adapters.webrtc.service import WebRTCSettings
from tests.adapters.ray.test_cluster import ENV
from tests.adapters.twilio.peer import ACCOUNT_SID, AUTH_TOKEN, PUBLIC_URL
from tests.adapters.webrtc.test_service import Peer
from tests.support import free_port

pytestmark = pytest.mark.slow

TOKEN = "ray-webrtc-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SLOTS = 2


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A local Ray cluster with the agent on Serve: one engine replica x 2 slots, Twilio and the page."""
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        logging_level=logging.WARNING,
        log_to_driver=False,
        runtime_env={"env_vars": ENV},
    )
    config = RayServeConfig(
        public_url=PUBLIC_URL,
        credentials=TwilioCredentials(
            account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN, api_base_url="http://127.0.0.1:9"
        ),
        webrtc=WebRTCSettings(token=SecretStr(TOKEN)),
        agent=AgentSpec(model="tiny-random", device="cpu", retrieval=False, seed=0),
        replica=ReplicaOptions(
            env=ENV, max_calls=SLOTS, num_gpus=0, num_cpus=1, min_replicas=1, max_replicas=1
        ),
        ingress_num_cpus=0.25,
        calls_route=True,
        placement_timeout_s=1.5,
    )
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(config), name="duetaspan", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()


async def _until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def _offer(http: aiohttp.ClientSession, base: str, peer: Peer) -> tuple[int, dict]:
    async with http.post(base + "/webrtc/offer", json=await peer.offer(), headers=AUTH) as resp:
        return resp.status, await resp.json()


async def _held(http: aiohttp.ClientSession, base: str) -> dict:
    async with http.get(base + "/ray/calls") as resp:
        return (await resp.json())["held"]


async def test_page_calls_are_answered_by_a_replica_and_hold_its_slots(cluster):
    base = cluster
    peers = [Peer() for _ in range(3)]
    try:
        async with aiohttp.ClientSession() as http:

            async def ready() -> bool:
                async with http.get(base + "/health") as resp:
                    return resp.status == 200

            await _until(ready, 90, "an engine replica")
            async with http.get(base + "/health") as resp:
                transports = (await resp.json())["transports"]
            assert transports == {"twilio": {"free_slots": SLOTS}, "webrtc": {"free_slots": SLOTS}}

            # the page and its refusals, from the ingress, as on one process
            async with http.get(base + "/?token=" + TOKEN) as resp:
                assert resp.status == 200 and "/webrtc/static/app.js" in await resp.text()
            async with http.get(base + "/webrtc/static/app.js") as resp:
                assert resp.status == 200 and "window.__stats" in await resp.text()
            async with http.get(base + "/webrtc/config", headers=AUTH) as resp:
                assert (await resp.json())["ready"] is True
            for headers, expected in (({}, 401), ({"Authorization": "Bearer wrong-token-0123456789"}, 403)):
                async with http.get(base + "/", headers=headers) as resp:
                    assert resp.status == expected
                async with http.post(base + "/webrtc/offer", json={"sdp": "v=0"}, headers=headers) as resp:
                    assert resp.status == expected
            async with http.post(base + "/webrtc/offer", data=b"x" * 70_000, headers=AUTH) as resp:
                assert resp.status == 400 and "larger than" in (await resp.json())["error"]
            async with http.post(base + "/webrtc/offer", data=b"{not json", headers=AUTH) as resp:
                assert resp.status == 400
            # well-formed enough for the ingress, rejected by the replica's WebRTC stack: 400, no slot kept
            bogus = {"sdp": "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n", "type": "offer"}
            async with http.post(base + "/webrtc/offer", json=bogus, headers=AUTH) as resp:
                assert resp.status == 400, await resp.text()
            assert await _held(http, base) == {}

            # two calls take both slots of the replica; media flows both ways with each peer
            answers = []
            for peer in peers[:2]:
                status, body = await _offer(http, base, peer)
                assert status == 200 and body["type"] == "answer" and body["call_id"].startswith("web-"), body
                await peer.answer(body)
                answers.append(body)
            held = await _held(http, base)
            assert set(held) == {a["call_id"] for a in answers}
            for peer, answer in zip(peers[:2], answers, strict=True):

                async def talking(peer=peer) -> bool:
                    heard = any(m["caller_sound_seconds"] > 1.0 for m in peer.of("stats"))
                    return heard and peer.audio_frames > 50

                await _until(talking, 40, "audio both ways")
                assert peer.of("hello")[0]["call_id"] == answer["call_id"]

            # both slots busy: a third page is told so (after the placement timeout)
            status, body = await _offer(http, base, peers[2])
            assert status == 503 and "busy" in body["error"], body

            # a hang-up frees its slot; the next page gets it
            await peers[0].close()

            async def freed() -> bool:
                return set(await _held(http, base)) == {answers[1]["call_id"]}

            await _until(freed, 20, "the hung-up call's slot")
            await peers[2].close()
            peers[2] = Peer()
            status, body = await _offer(http, base, peers[2])
            assert status == 200, body
            await peers[2].answer(body)
            await _until(lambda: _async(peers[2].audio_frames > 20), 30, "the third call's audio")
            for peer in peers[1:]:
                await peer.close()

            async def idle() -> bool:
                return await _held(http, base) == {}

            await _until(idle, 20, "every slot to be free")
            async with http.get(base + "/health") as resp:
                assert (await resp.json())["transports"]["webrtc"]["free_slots"] == SLOTS
    finally:
        for peer in peers:
            await peer.close()


async def _async(value: bool) -> bool:
    return value
