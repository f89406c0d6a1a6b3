"""Who may see calls (issue #23, point 6) and one call budget (point 5), against the real `duetaspan serve
--twilio --webrtc --model tiny-random` subprocess (with `--no-retrieval` where a test needs neither the
router nor the tool console):

- the page token places a browser call and nothing else: call records (`/webrtc/calls`), the tool console
  and `/admin/*` need the admin token, in the `Authorization` header only (a query string is refused);
  `/metrics` needs the metrics token;
- without those tokens the roles are off on a server with a public URL, even bound to loopback (a tunnel
  delivers the internet from 127.0.0.1); only the first-run demo (loopback, no public URL) goes without them;
- `POST /admin/drain` (admin) drains: `/health` 503, WebRTC offers 503, Twilio callers get TwiML, exit 0;
- a page call still live at `[server] drain_timeout_s` is ended with a complete `ended_by: "shutdown"` record;
- Twilio and WebRTC calls share one budget: a webhook's reserved slot and a page call fill both slots, the
  next caller of either transport is turned away, and a page call's hang-up frees a slot for a phone call.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp

from tests.adapters.twilio.peer import ACCOUNT_SID, AUTH_TOKEN, PUBLIC_URL, TwilioPeer
from tests.adapters.webrtc.test_service import Peer, _until
from tests.reliability.test_drain import Server
from tests.support import REPO_ROOT, free_port, stop_process, wait_until_healthy

PAGE = "roles-test-page-token-0123456789"
ADMIN = "roles-test-admin-token-9876543210"
METRICS = "roles-test-metrics-token-5555555555"
FAKE_SDP = {"sdp": "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n",
            "type": "offer"}  # fmt: skip


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _spawn(cmd: list[str], env: dict[str, str], folder: Path) -> subprocess.Popen:
    with (folder / "serve.log").open("wb") as log:
        return subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=folder, start_new_session=True
        )


@contextlib.asynccontextmanager
async def serve(
    tmp_path: Path,
    *,
    twilio: bool = True,
    max_calls: int = 2,
    toml: str = "",
    retrieval: bool = True,
    **tokens: str,
):
    port = free_port()
    (tmp_path / "agent.toml").write_text(f'[persona]\nprompt = "You answer the phone for a test."\n{toml}')
    transports = ["--twilio", "--public-url", PUBLIC_URL, "--webrtc"] if twilio else ["--webrtc"]
    cmd = [
        sys.executable, "-m", "duetaspan", "-v", "serve", *transports, "--host", "127.0.0.1", "--port", str(port),
        "--config", str(tmp_path / "agent.toml"), "--model", "tiny-random", "--device", "cpu",
        "--record-dir", str(tmp_path / "calls"), "--max-calls", str(max_calls),
        *([] if retrieval else ["--no-retrieval"]),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TWILIO_", "OPENAI_", "DUETASPAN_"))}
    env |= {"TWILIO_ACCOUNT_SID": ACCOUNT_SID, "TWILIO_AUTH_TOKEN": AUTH_TOKEN, "PYTHONPATH": str(REPO_ROOT)}
    env |= {"TWILIO_API_BASE_URL": "http://127.0.0.1:9", "DUETASPAN_WEBRTC_TOKEN": PAGE}
    env |= {f"DUETASPAN_{name.upper()}_TOKEN": value for name, value in tokens.items()}
    proc = _spawn(cmd, env, tmp_path)
    server = Server(proc, f"http://127.0.0.1:{port}", tmp_path)
    try:
        await wait_until_healthy(server.base, proc, tmp_path / "serve.log", what="serve", timeout_s=180)
        yield server
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        stop_process(proc)


async def request(server: Server, method: str, path: str, headers: dict | None = None, body=None):
    async with aiohttp.ClientSession() as http:
        async with http.request(method, server.base + path, headers=headers or {}, json=body) as resp:
            return resp.status, await resp.text()


ADMIN_ROUTES = (("GET", "/webrtc/calls?format=json"), ("GET", "/webrtc/calls/CA1"), ("GET", "/webrtc/tools"),
                ("POST", "/webrtc/tools/run"), ("POST", "/admin/drain"))  # fmt: skip


async def test_without_tokens_a_public_server_refuses_admin_and_metrics_even_from_loopback(tmp_path):
    async with serve(tmp_path) as server:  # bound to 127.0.0.1, but reachable at a public URL (a tunnel)
        for method, path in ADMIN_ROUTES:
            for headers in ({}, bearer(PAGE)):
                status, body = await request(server, method, path, headers, {})
                assert status == 403 and "DUETASPAN_ADMIN_TOKEN" in body, (path, status, body)
        status, body = await request(server, "GET", "/metrics", bearer(PAGE))
        assert status == 403 and "DUETASPAN_METRICS_TOKEN" in body
        assert (await request(server, "GET", f"/?token={PAGE}"))[0] == 200  # the page itself works
        assert (await request(server, "GET", "/health"))[0] == 200  # not draining
    assert "/admin/*, /webrtc/calls, /webrtc/tools refused: set $DUETASPAN_ADMIN_TOKEN" in server.log()


async def test_the_page_token_places_calls_only_and_the_admin_token_drains(tmp_path):
    async with serve(tmp_path, admin=ADMIN, metrics=METRICS) as server:
        for method, path in ADMIN_ROUTES[:-1]:
            for headers, query in (
                ({}, ""),
                (bearer(PAGE), ""),
                ({}, f"?token={ADMIN}"),
                (bearer(METRICS), ""),
            ):
                sep = "&" if "?" in path and query else ""
                url = path + (sep + query[1:] if sep else query)
                assert (await request(server, method, url, headers, {}))[0] == 401, (url, headers)
        assert (await request(server, "GET", "/webrtc/calls?format=json", bearer(ADMIN)))[0] == 200
        status, body = await request(server, "GET", "/webrtc/tools", bearer(ADMIN))
        assert status == 200 and "get_time" in body
        assert (await request(server, "GET", "/metrics", bearer(ADMIN)))[0] == 401
        assert (await request(server, "GET", "/metrics", bearer(METRICS)))[0] == 200
        status, body = await request(server, "GET", "/webrtc/config", bearer(PAGE))
        assert status == 200 and json.loads(body)["admin"] == "token"
        # drain: neither the page token nor the metrics token, a query string neither
        for headers, query in (({}, ""), (bearer(PAGE), ""), (bearer(METRICS), ""), ({}, f"?token={ADMIN}")):
            assert (await request(server, "POST", "/admin/drain" + query, headers))[0] == 401
        assert (await request(server, "GET", "/health"))[0] == 200
        status, body = await request(server, "POST", "/admin/drain", bearer(ADMIN))
        assert status == 202 and json.loads(body)["draining"] is True, body
        # draining with no live call: new calls are refused while the server stops by itself
        statuses = []
        with contextlib.suppress(aiohttp.ClientError):
            statuses.append((await request(server, "GET", "/health"))[0])
            status, body = await request(server, "POST", "/webrtc/offer", bearer(PAGE), FAKE_SDP)
            statuses.append(status)
            assert status == 503 and "draining" in body, body
        assert all(s == 503 for s in statuses), statuses
        assert await server.exit_code() == 0, server.log()[-3000:]
    assert "draining (POST /admin/drain)" in server.log()


async def test_the_first_run_demo_goes_without_admin_and_metrics_tokens(tmp_path):
    async with serve(tmp_path, twilio=False, retrieval=False) as server:  # loopback, no public URL
        assert (await request(server, "GET", "/metrics"))[0] == 200
        assert (await request(server, "GET", "/webrtc/calls?format=json"))[0] == 200
        _, body = await request(server, "GET", "/webrtc/config", bearer(PAGE))
        assert json.loads(body)["admin"] == "open"
        assert (await request(server, "POST", "/webrtc/offer", {}, FAKE_SDP))[
            0
        ] == 401  # the page token still
        assert (await request(server, "POST", "/admin/drain"))[0] == 202
        assert await server.exit_code() == 0, server.log()[-3000:]


async def test_twilio_and_webrtc_calls_share_one_call_budget(tmp_path):
    async with serve(tmp_path, admin=ADMIN, retrieval=False) as server:
        twilio = TwilioPeer(server.base)
        status, body = await twilio.voice("CA-budget-1")  # reserves a slot until its stream comes
        assert status == 200 and "<Stream" in body, body
        page = Peer()
        try:
            status, body = await request(server, "POST", "/webrtc/offer", bearer(PAGE), await page.offer())
            assert status == 200, body
            await page.answer(json.loads(body))
            await _until(lambda: page.of("hello"), 30, "the page call's hello")
            health = json.loads((await request(server, "GET", "/health"))[1])
            assert health["transports"] == {"twilio": {"free_slots": 0}, "webrtc": {"free_slots": 0}}, health
            # both slots are taken, one by each transport: the next caller of either is turned away
            status, body = await twilio.voice("CA-budget-2")
            assert status == 200 and "<Stream" not in body and "<Say>" in body, body
            other = Peer()
            try:
                status, body = await request(
                    server, "POST", "/webrtc/offer", bearer(PAGE), await other.offer()
                )
                assert status == 503 and "busy" in body, body
            finally:
                await other.close()
        finally:
            await page.close()  # the page hangs up: its slot is free again
        await _until_free(server, 1)
        status, body = await twilio.voice("CA-budget-3")
        assert status == 200 and "<Stream" in body, body
    assert "twilio refused (busy, HTTP 200)" in server.log()


async def _until_free(server: Server, n: int, timeout_s: float = 30.0) -> None:
    import asyncio
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        health = json.loads((await request(server, "GET", "/health"))[1])
        if health["transports"]["twilio"]["free_slots"] >= n:
            return
        assert time.monotonic() < deadline, health
        await asyncio.sleep(0.2)


async def test_a_page_call_left_at_the_drain_timeout_ends_with_a_shutdown_record(tmp_path):
    toml = "[server]\ndrain_timeout_s = 2\n"
    async with serve(tmp_path, twilio=False, toml=toml, retrieval=False) as server:
        page = Peer()
        try:
            status, body = await request(server, "POST", "/webrtc/offer", bearer(PAGE), await page.offer())
            assert status == 200, body
            call_id = json.loads(body)["call_id"]
            await page.answer(json.loads(body))
            await _until(lambda: page.audio_frames > 25, 30, "the agent's audio on the page call")
            server.proc.send_signal(signal.SIGTERM)
            heard = page.audio_frames
            assert await server.exit_code() == 0, server.log()[-3000:]
            assert page.audio_frames > heard  # the call went on while the server drained
        finally:
            await page.close()
    record = server.record(call_id)
    assert record["complete"] and record["summary"]["ended_by"] == "shutdown", record["summary"]
    assert "drain timeout 2 s: ended 1 live call(s)" in server.log()
