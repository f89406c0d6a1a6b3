"""Helpers shared by the test suite: the shared audio fixtures and loopback servers on free ports.

Import them from tests as `from tests.support import ...` or use the fixtures in conftest.py.
"""

from __future__ import annotations

import contextlib
import json
import socket
import wave
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
from aiohttp import web

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED = REPO_ROOT.parent / "shared"
AUDIO_FIXTURES = SHARED / "fixtures" / "audio"


def fixture_names() -> list[str]:
    """Names of the recorded caller phrases (`greeting`, `weather_sydney`, ...)."""
    return sorted(json.loads((AUDIO_FIXTURES / "PHRASES.json").read_text()))


def fixture_phrase(name: str) -> str:
    """What the caller says in fixture `name`."""
    return json.loads((AUDIO_FIXTURES / "PHRASES.json").read_text())[name]


def load_wav(name: str) -> tuple[np.ndarray, int]:
    """A fixture wav as float32 mono in [-1, 1] and its sample rate (24 kHz for the shared fixtures)."""
    path = AUDIO_FIXTURES / f"{name}.wav" if not str(name).endswith(".wav") else Path(name)
    with wave.open(str(path), "rb") as w:
        assert w.getsampwidth() == 2, f"{path}: expected 16-bit PCM"
        frames = w.readframes(w.getnframes())
        pcm = np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32768.0
        if w.getnchannels() > 1:
            pcm = pcm.reshape(-1, w.getnchannels()).mean(axis=1)
        return pcm, w.getframerate()


def load_ulaw(name: str) -> bytes:
    """A fixture as raw 8 kHz mu-law bytes."""
    return (AUDIO_FIXTURES / f"{name}.ulaw").read_bytes()


def load_twilio_stream(name: str) -> list[dict]:
    """A recorded Twilio Media Stream: one JSON message per line (connected, start, media..., stop)."""
    lines = (AUDIO_FIXTURES / f"{name}.twilio.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on loopback right now."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.asynccontextmanager
async def serve_app(app: web.Application, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Run an aiohttp app on a free loopback port; yields its base URL (`http://127.0.0.1:PORT`)."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # aiohttp exposes no public accessor for port 0
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def wait_until_healthy(base: str, proc, log: Path, *, what: str = "the server", timeout_s: float = 90):
    """Poll `base`/health until it answers 200; fail with the tail of `log` if `proc` dies first."""
    import asyncio
    import time

    import aiohttp

    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while True:
            assert proc.poll() is None, _log_tail(log)
            assert time.monotonic() < deadline, f"{what} never became ready"
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(base + "/health") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.2)


def _log_tail(log: Path) -> str:
    return log.read_text()[-3000:]


def stop_process(proc, timeout_s: float = 15) -> None:
    """Terminate a server subprocess; kill it if it has not exited after `timeout_s`."""
    import subprocess

    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
