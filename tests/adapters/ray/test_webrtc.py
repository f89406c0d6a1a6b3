"""WebRTC page calls on a real local Ray cluster started by `duetaspan serve --twilio --webrtc --ray` (a
subprocess; CPU, one tiny-random replica with 2 slots): the ingress serves the token-protected page and refuses bad tokens and offers as one process does, two
aiortc peers (the browser stand-in of the WebRTC tests) are answered by the replica and hear the agent while
it hears them, a third offer while both slots are busy is 503, and a hang-up frees its slot for a new call; Ctrl-C stops it (130)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'duetaspan[ray]')")

from tests.adapters.twilio.peer import ACCOUNT_SID, AUTH_TOKEN, PUBLIC_URL
from tests.adapters.webrtc.test_service import Peer
from tests.support import REPO_ROOT, free_port

pytestmark = pytest.mark.slow

TOKEN = "ray-webrtc-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SLOTS = 2
ENV = {"NO_TORCH_COMPILE": "1", "NO_CUDA_GRAPH": "1", "OMP_NUM_THREADS": "1"}


def _child_setup() -> None:
    os.setsid()  # its own process group: a failed test can end the cluster it started
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def _served(folder: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """`duetaspan serve --twilio --webrtc --ray` as docs/SCALING.md runs it (a local Ray cluster, one
    tiny-random replica x 2 slots); yields the proxy's URL and the process."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TWILIO_", "OPENAI_", "RAY_"))}
    env |= {
        **ENV,
        "TWILIO_ACCOUNT_SID": ACCOUNT_SID,
        "TWILIO_AUTH_TOKEN": AUTH_TOKEN,
        "TWILIO_API_BASE_URL": "http://127.0.0.1:9",
        "DUETASPAN_WEBRTC_TOKEN": TOKEN,
        "PYTHONPATH": str(REPO_ROOT),
    }
    cmd = [
        sys.executable, "-m", "duetaspan", "serve", "--twilio", "--webrtc", "--ray", "--public-url", PUBLIC_URL,
        "--host", "127.0.0.1", "--port", str(port), "--model", "tiny-random", "--device", "cpu",
        "--no-retrieval", "--max-calls", str(SLOTS), "--min-replicas", "1", "--cpus-per-replica", "1",
    ]  # fmt: skip
    with (folder / "serve.log").open("wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_child_setup
        )
        try:
            yield f"http://127.0.0.1:{port}", proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(60)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # whatever of its cluster is left


async def _until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def _offer(http: aiohttp.ClientSession, base: str, peer: Peer) -> tuple[int, dict]:
    async with http.post(base + "/webrtc/offer", json=await peer.offer(), headers=AUTH) as resp:
        return resp.status, await resp.json()


async def _free(http: aiohttp.ClientSession, base: str) -> int:
    """Free slots as the ingress reports them (Serve's running replicas x slots - calls it holds open)."""
    async with http.get(base + "/health") as resp:
        return (await resp.json())["transports"]["webrtc"]["free_slots"]


async def test_page_calls_are_answered_by_a_replica_and_hold_its_slots(tmp_path):
    peers = [Peer() for _ in range(3)]
    with _served(tmp_path) as (base, proc):
        try:
            await _calls(base, proc, peers, tmp_path)
        finally:
            for peer in peers:
                await peer.close()
        proc.send_signal(signal.SIGINT)
        rc = await asyncio.to_thread(proc.wait, 90)
    text = (tmp_path / "serve.log").read_text()
    assert rc == 130 and "Traceback" not in text, text[-3000:]
    assert f"WebRTC page: {base}/?token={TOKEN}" in text and f"ready: {PUBLIC_URL}/twilio/voice" in text


async def _calls(base: str, proc: subprocess.Popen, peers: list[Peer], folder: Path) -> None:
    async with aiohttp.ClientSession() as http:

        async def ready() -> bool:
            assert proc.poll() is None, (folder / "serve.log").read_text()[-3000:]
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(base + "/health") as resp:
                    return resp.status == 200
            return False

        await _until(ready, 150, "an engine replica")
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
            assert resp.status == 413 and "larger than" in (await resp.json())["error"]
        async with http.post(base + "/webrtc/offer", data=b"{not json", headers=AUTH) as resp:
            assert resp.status == 400
        # well-formed enough for the ingress, rejected by the replica's WebRTC stack: 400, no slot kept
        bogus = {"sdp": "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n", "type": "offer"}
        async with http.post(base + "/webrtc/offer", json=bogus, headers=AUTH) as resp:
            assert resp.status == 400, await resp.text()
        assert await _free(http, base) == SLOTS

        # two calls take both slots of the replica; media flows both ways with each peer
        answers = []
        for peer in peers[:2]:
            status, body = await _offer(http, base, peer)
            assert status == 200 and body["type"] == "answer" and body["call_id"].startswith("web-"), body
            await peer.answer(body)
            answers.append(body)
        assert await _free(http, base) == 0
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
            return await _free(http, base) == 1

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
            return await _free(http, base) == SLOTS

        await _until(idle, 20, "every slot to be free")


async def _async(value: bool) -> bool:
    return value
