"""Drain on SIGTERM (issue #23, point 1), against the real `duetaspan serve --twilio --model tiny-random
--no-retrieval` subprocess with real signals and a real Twilio-protocol WebSocket client (`TwilioPeer`,
mu-law at real time):

- a live call keeps getting the agent's audio after SIGTERM, sent to the whole process group (as systemd and
  Kubernetes do) with the engine in its own process, until the caller hangs up; then the server exits 0;
- while it drains `/health` and `/health/ready` answer 503 and `/health/live` 200, a caller ringing in gets
  valid TwiML sending it elsewhere (`<Reject reason="busy"/>`, or `<Redirect>` to `[server]
  drain_redirect_url`), and `duetaspan_draining` reads 1;
- at `[server] drain_timeout_s` the calls left are ended as a hang-up ends them: a complete record with
  `ended_by: "shutdown"`, the caller's socket closed, exit 0; a second SIGTERM does the same at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from tests.adapters.twilio.peer import ACCOUNT_SID, AUTH_TOKEN, PUBLIC_URL, TwilioPeer
from tests.reliability.rig import call_stream
from tests.support import REPO_ROOT, free_port, stop_process, wait_until_healthy

METRICS_TOKEN = "drain-test-metrics-token-0123456789"
REDIRECT = "https://standby.example.test/twilio/voice"


@dataclass
class Server:
    proc: subprocess.Popen
    base: str
    folder: Path

    @property
    def peer(self) -> TwilioPeer:
        return TwilioPeer(self.base)

    def log(self) -> str:
        return (self.folder / "serve.log").read_text(errors="replace")

    async def get(self, path: str, **headers: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as http, http.get(self.base + path, headers=headers) as resp:
            return resp.status, await resp.text()

    def record(self, call_sid: str) -> dict:
        return json.loads((self.folder / "calls" / f"{call_sid}.json").read_text())

    async def exit_code(self, timeout_s: float = 60.0) -> int:
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None:
            assert time.monotonic() < deadline, "the server did not exit:\n" + self.log()[-3000:]
            await asyncio.sleep(0.1)
        return self.proc.returncode


def _spawn(cmd: list[str], env: dict[str, str], folder: Path) -> subprocess.Popen:
    with (folder / "serve.log").open("wb") as log:  # its own group: a test can signal the whole of it
        return subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=folder, start_new_session=True
        )


@contextlib.asynccontextmanager
async def serve(tmp_path: Path, *extra: str, server_toml: str = ""):
    """`duetaspan -v serve --twilio ... --model tiny-random --no-retrieval` in its own process group (drain
    needs no router)."""
    port = free_port()
    (tmp_path / "agent.toml").write_text(
        f'[persona]\nprompt = "You answer the phone for a test."\n[server]\n{server_toml}\n'
    )
    cmd = [
        sys.executable, "-m", "duetaspan", "-v", "serve", "--twilio", "--host", "127.0.0.1", "--port", str(port),
        "--public-url", PUBLIC_URL, "--config", str(tmp_path / "agent.toml"), "--model", "tiny-random",
        "--device", "cpu", "--record-dir", str(tmp_path / "calls"), "--max-calls", "2", "--no-retrieval", *extra,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TWILIO_", "OPENAI_", "DUETASPAN_"))}
    env |= {
        "TWILIO_ACCOUNT_SID": ACCOUNT_SID,
        "TWILIO_AUTH_TOKEN": AUTH_TOKEN,
        "TWILIO_API_BASE_URL": "http://127.0.0.1:9",
        "DUETASPAN_METRICS_TOKEN": METRICS_TOKEN,
        "PYTHONPATH": str(REPO_ROOT),
    }
    proc = _spawn(cmd, env, tmp_path)
    server = Server(proc, f"http://127.0.0.1:{port}", tmp_path)
    try:
        await wait_until_healthy(server.base, proc, tmp_path / "serve.log", what="serve", timeout_s=180)
        yield server
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # a failed test: the engine child goes too
        stop_process(proc)


class LiveCall:
    """A Twilio Media Stream at real time: `start`, then 20 ms of mu-law every 20 ms (a recorded phrase, then
    silence) until `hang_up()` sends `stop`; what the server sends back is collected with arrival times."""

    def __init__(self, call_sid: str, ws, messages: list[dict]) -> None:
        self.call_sid, self.ws, self.messages = call_sid, ws, messages
        self.received: list[tuple[float, dict]] = []
        self.seq = 0
        self.closed = asyncio.Event()
        self._tasks = [asyncio.create_task(self._send()), asyncio.create_task(self._read())]

    async def _send(self) -> None:
        await self.ws.send(json.dumps(self.messages[0]))  # connected
        t0 = time.monotonic()
        with contextlib.suppress(Exception):  # the server may close the stream under us
            for n, msg in enumerate(self.messages[1:]):
                await asyncio.sleep(max(0.0, t0 + n * 0.02 - time.monotonic()))
                self.seq += 1
                await self.ws.send(json.dumps({**msg, "sequenceNumber": str(self.seq)}))

    async def _read(self) -> None:
        with contextlib.suppress(Exception):
            async for raw in self.ws:
                self.received.append((time.monotonic(), json.loads(raw)))
        self.closed.set()

    def media_after(self, t: float) -> int:
        return sum(1 for at, m in self.received if at > t and m.get("event") == "media")

    async def hang_up(self) -> None:
        self._tasks[0].cancel()
        self.seq += 1
        stop = {"event": "stop", "sequenceNumber": str(self.seq), "streamSid": self.messages[1]["streamSid"]}
        await self.ws.send(json.dumps(stop))
        await asyncio.wait_for(self.closed.wait(), 30)

    def stop_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()


@contextlib.asynccontextmanager
async def live_call(server: Server, call_sid: str, seconds: float = 120.0):
    messages = call_stream(call_sid, "greeting", 2.0, seconds)[:-1]  # no `stop`: the test hangs up
    url = await server.peer.stream_url(call_sid)
    async with server.peer.open_stream(url) as ws:
        call = LiveCall(call_sid, ws, messages)
        try:
            yield call
        finally:
            call.stop_tasks()


async def until(predicate, what: str, server: Server, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}:\n" + server.log()[-3000:]
        await asyncio.sleep(0.05)


def twiml(body: str) -> ET.Element:
    root = ET.fromstring(body)  # valid XML, a TwiML <Response>
    assert root.tag == "Response", body
    return root


async def assert_draining(server: Server) -> None:
    """`/health` and `/health/ready` 503 (at once: within 2 s of the signal), `/health/live` 200, the gauge 1."""
    for _ in range(40):  # the signal is handled on the server's next loop iteration
        status, body = await server.get("/health")
        if status != 200:
            break
        await asyncio.sleep(0.05)
    assert status == 503 and json.loads(body)["status"] == "draining", body
    assert (await server.get("/health/ready"))[0] == 503
    assert (await server.get("/health/live"))[0] == 200
    status, text = await server.get("/metrics", Authorization=f"Bearer {METRICS_TOKEN}")
    assert status == 200 and "\nduetaspan_draining 1.0" in text, text[-2000:]


async def test_sigterm_to_the_process_group_drains_the_live_call_then_exits_0(tmp_path):
    async with serve(tmp_path, "--engine-process") as server:
        assert (await server.get("/health/ready"))[0] == 200
        status, text = await server.get("/metrics", Authorization=f"Bearer {METRICS_TOKEN}")
        assert "\nduetaspan_draining 0.0" in text
        async with live_call(server, "CA-drain-live") as call:
            await until(lambda: call.media_after(0) >= 25, "no agent audio before SIGTERM", server)
            os.killpg(server.proc.pid, signal.SIGTERM)  # the whole group: server and engine process
            signalled = time.monotonic()
            await assert_draining(server)
            status, body = await server.peer.voice("CA-drain-new")  # a caller ringing during the drain
            assert status == 200, body
            reject = twiml(body).find("Reject")
            assert reject is not None and reject.get("reason") == "busy", body
            # the live call goes on: 3 more seconds of the agent's audio, paced at real time
            await until(
                lambda: call.media_after(signalled + 3.0) >= 10, "the live call lost its audio", server
            )
            assert server.proc.poll() is None
            await call.hang_up()
        assert await server.exit_code() == 0, server.log()[-3000:]
    record = server.record("CA-drain-live")
    assert record["complete"] and record["summary"]["ended_by"] != "shutdown"
    assert not record["errors"], record["errors"]
    log = server.log()
    assert "draining (SIGTERM)" in log and "drained: the last live call ended" in log
    assert "twilio refused (draining, HTTP 200)" in log
    assert "Traceback" not in log, log[-3000:]
    assert not (tmp_path / "calls" / "CA-drain-new.jsonl").exists()


async def test_the_drain_timeout_ends_the_call_with_a_shutdown_record(tmp_path):
    toml = f'drain_timeout_s = 3\ndrain_redirect_url = "{REDIRECT}"'
    async with serve(tmp_path, server_toml=toml) as server:
        async with live_call(server, "CA-drain-timeout") as call:
            await until(lambda: call.media_after(0) >= 25, "no agent audio before SIGTERM", server)
            server.proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            await assert_draining(server)
            status, body = await server.peer.voice("CA-drain-redirected")
            redirect = twiml(body).find("Redirect")
            assert status == 200 and redirect is not None and redirect.text == REDIRECT, body
            await asyncio.wait_for(call.closed.wait(), 40)  # the server ends the call at the timeout
            assert time.monotonic() - signalled >= 2.5
            assert call.media_after(signalled + 2.0) > 0  # it had audio until then
        assert await server.exit_code() == 0, server.log()[-3000:]
    record = server.record("CA-drain-timeout")
    assert record["complete"] and record["summary"]["ended_by"] == "shutdown", record["summary"]
    assert "drain timeout 3 s: ended 1 live call(s)" in server.log()


async def test_a_second_sigterm_ends_the_calls_at_once_with_their_records(tmp_path):
    async with serve(tmp_path) as server:
        async with live_call(server, "CA-drain-twice") as call:
            await until(lambda: call.media_after(0) >= 25, "no agent audio before SIGTERM", server)
            server.proc.send_signal(signal.SIGTERM)
            await assert_draining(server)
            server.proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            await asyncio.wait_for(call.closed.wait(), 20)
            assert time.monotonic() - signalled < 15
        assert await server.exit_code() == 0, server.log()[-3000:]
    record = server.record("CA-drain-twice")
    assert record["complete"] and record["summary"]["ended_by"] == "shutdown", record["summary"]
    assert "SIGTERM again: ending the 1 live calls now" in server.log()


def _engine_child(pid: int) -> int:
    """The engine process under the server `pid` (its only child running `duetaspan.pipeline.engine_process`)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    engines = [int(c) for c in children if b"engine_process" in Path(f"/proc/{c}/cmdline").read_bytes()]
    assert len(engines) == 1, children
    return engines[0]


async def test_the_engine_process_ends_when_the_server_dies(tmp_path):
    async with serve(tmp_path, "--engine-process") as server:
        child = _engine_child(server.proc.pid)
        server.proc.kill()  # no drain, no goodbye: the engine's socket closes
        server.proc.wait(10)
        await until(
            lambda: not Path(f"/proc/{child}").exists() or _zombie(child), "engine outlived server", server
        )


def _zombie(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    return True


async def test_ctrl_c_drains_too_and_says_stopped(tmp_path):
    async with serve(tmp_path) as server:
        server.proc.send_signal(signal.SIGINT)
        assert await server.exit_code() == 130, server.log()[-3000:]
    log = server.log()
    assert "draining (SIGINT)" in log and "serve: stopped" in log and "Traceback" not in log
