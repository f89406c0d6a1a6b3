"""Real headless Chromium for the page tests, driven over the DevTools protocol (aiohttp WebSocket).

The fake microphone plays a wav (Chromium's file capture wants 48 kHz; `fake_mic_wav` converts a 24 kHz
fixture). `Chromium.evaluate` runs JavaScript in the page and returns its JSON value.

Example:
    >>> async def demo(url, tmp_path):                                 # doctest: +SKIP
    ...     async with Chromium.launch(url, tmp_path, mic_wav=fake_mic_wav("weather_sydney", tmp_path)) as page:
    ...         await page.evaluate("document.title")
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import wave
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import soxr

from tests.support import load_wav

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
MIC_RATE = 48_000


def fake_mic_wav(
    name: str, folder: Path, *, lead_silence_s: float = 0.5, tail_silence_s: float = 1.5
) -> Path:
    """A fixture phrase as a 48 kHz mono 16-bit wav for `--use-file-for-fake-audio-capture` (Chromium loops
    it; the silence around the phrase lets voice detection end each utterance)."""
    pcm, rate = load_wav(name)
    pcm = soxr.resample(pcm, rate, MIC_RATE).astype(np.float32)
    pcm = np.concatenate(
        [
            np.zeros(int(lead_silence_s * MIC_RATE), np.float32),
            pcm,
            np.zeros(int(tail_silence_s * MIC_RATE), np.float32),
        ]
    )
    path = folder / f"{name}.48k.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(MIC_RATE)
        w.writeframes(np.clip(np.rint(pcm * 32767), -32768, 32767).astype("<i2").tobytes())
    return path


class Chromium:
    """One headless Chromium with one page, and a DevTools session on that page."""

    def __init__(
        self, proc: subprocess.Popen, ws: aiohttp.ClientWebSocketResponse, http: aiohttp.ClientSession
    ):
        self.proc = proc
        self._ws = ws
        self._http = http
        self._ids = itertools.count(1)

    @classmethod
    @contextlib.asynccontextmanager
    async def launch(
        cls, url: str, profile_dir: Path, *, mic_wav: Path | None = None, size: str = "1280,860"
    ) -> AsyncIterator[Chromium]:
        proc, log = _start(url, profile_dir, mic_wav, size)
        http = aiohttp.ClientSession()
        try:
            port = await _devtools_port(profile_dir, proc)
            ws_url = await _page_socket(http, port)
            ws = await http.ws_connect(ws_url, max_msg_size=64 << 20)
            yield cls(proc, ws, http)
        finally:
            await http.close()
            _stop(proc)
            log.close()

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self._ids)
        await self._ws.send_str(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = await asyncio.wait_for(self._ws.receive(), 30)
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise RuntimeError(f"DevTools socket closed ({msg.type})")
            data = json.loads(msg.data)
            if data.get("id") == msg_id:
                if "error" in data:
                    raise RuntimeError(f"{method}: {data['error']}")
                return data["result"]

    async def evaluate(self, expression: str, *, user_gesture: bool = False) -> Any:
        """The JSON value of `expression` in the page (promises awaited)."""
        result = await self.send(
            "Runtime.evaluate",
            expression=expression,
            returnByValue=True,
            awaitPromise=True,
            userGesture=user_gesture,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"page JS failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float, *, every_s: float = 0.25) -> Any:
        """Poll `expression` until it is truthy; returns its value (raises TimeoutError with the page state)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if loop.time() > deadline:
                state = await self.evaluate("JSON.stringify(window.__stats)")
                raise TimeoutError(f"page never satisfied {expression!r}; window.__stats = {state}")
            await asyncio.sleep(every_s)

    async def screenshot(self, path: Path) -> Path:
        result = await self.send("Page.captureScreenshot", format="png")
        return _write(path, base64.b64decode(result["data"]))


def _start(url: str, profile_dir: Path, mic_wav: Path | None, size: str) -> tuple[subprocess.Popen, Any]:
    assert CHROMIUM, "chromium is not installed"
    profile_dir.mkdir(parents=True, exist_ok=True)
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
        "--autoplay-policy=no-user-gesture-required", "--remote-debugging-port=0",
        f"--user-data-dir={profile_dir}", f"--window-size={size}",
    ]  # fmt: skip
    if mic_wav is not None:
        flags.append(f"--use-file-for-fake-audio-capture={mic_wav}")
    log = (profile_dir / "chromium.log").open("wb")
    return subprocess.Popen([CHROMIUM, *flags, url], stdout=log, stderr=subprocess.STDOUT), log


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


async def _devtools_port(profile_dir: Path, proc: subprocess.Popen, timeout_s: float = 20.0) -> int:
    marker = profile_dir / "DevToolsActivePort"
    for _ in range(int(timeout_s / 0.05)):
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with {proc.returncode}: see {profile_dir / 'chromium.log'}")
        if marker.exists():
            first = marker.read_text().splitlines()[:1]
            if first and first[0].isdigit():
                return int(first[0])
        await asyncio.sleep(0.05)
    raise TimeoutError("chromium did not open its DevTools port")


async def _page_socket(http: aiohttp.ClientSession, port: int, timeout_s: float = 10.0) -> str:
    for _ in range(int(timeout_s / 0.1)):
        async with http.get(f"http://127.0.0.1:{port}/json/list") as resp:
            targets = await resp.json()
        pages = [t for t in targets if t.get("type") == "page" and t.get("webSocketDebuggerUrl")]
        if pages:
            return pages[0]["webSocketDebuggerUrl"]
        await asyncio.sleep(0.1)
    raise TimeoutError("chromium opened no page target")
