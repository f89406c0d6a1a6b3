"""`scripted_call(..., transport="twilio")`: the agent served by `agent.serve(twilio=True)` on a loopback port
(the code path of `duetaspan serve --twilio`), a signed voice webhook as Twilio sends it, then Twilio's side
of the Media Stream on a real, signed WebSocket: start, paced 20 ms mu-law media, DTMF, marks echoed back,
stop. The test account's credentials exist only for the call (`ACCOUNT_SID`, `AUTH_TOKEN`, `PUBLIC_URL`).

Example:
    >>> ulaw = ulaw_chunks(np.zeros(24000, np.float32))    # a second of silence, 20 ms payloads
    >>> len(ulaw[0]), 45 <= len(ulaw) <= 50                # (the resampler holds back its last few ms)
    (160, True)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np

from duetaspan.testing.line import PacedLine, chunks_at
from duetaspan.testing.servers import free_port
from duetaspan.testing.sessions import capture_sessions

ACCOUNT_SID = "AC" + "2" * 32
AUTH_TOKEN = "duetaspan-testing-auth-token-0123"
PUBLIC_URL = "https://agent.example.test"


def ulaw_chunks(pcm24k: np.ndarray) -> list[bytes]:
    """24 kHz float audio as the 20 ms mu-law payloads a Twilio stream carries."""
    from duetaspan.adapters.twilio.audio import int16_to_ulaw

    return [int16_to_ulaw(np.frombuffer(chunk, "<i2")) for chunk in chunks_at(pcm24k, 8000)]


def _ulaw_silence() -> bytes:
    """20 ms of digital silence as mu-law (what Twilio sends while the caller says nothing)."""
    from duetaspan.adapters.twilio.audio import int16_to_ulaw

    return int16_to_ulaw(np.zeros(160, np.int16))


def signature(url: str, params: dict[str, str]) -> str:
    """Twilio's `X-Twilio-Signature` for a request to `url` with form `params`, made with the test token."""
    from twilio.request_validator import RequestValidator

    return str(RequestValidator(AUTH_TOKEN).compute_signature(url, params))


class TwilioLine:
    """Twilio's side of one Media Stream on a WebSocket `ws`."""

    def __init__(self, ws: Any, call_sid: str) -> None:
        self.ws = ws
        self.call_sid = call_sid
        self.stream_sid = "MZ" + call_sid[2:].ljust(32, "0")[:32]
        self.session: Any = None
        self.received: list[dict[str, Any]] = []  # what the server sent (media, marks, clear...)
        self.closed = False  # the server closed the stream (hang-up, transfer): nothing more is sent
        self._seq = 0
        self._chunk = 0
        self._lock = asyncio.Lock()
        self.reader: asyncio.Task[None] | None = None
        self.paced = PacedLine(self._media, _ulaw_silence())

    async def send(self, event: str, **body: Any) -> None:
        from websockets.exceptions import ConnectionClosed

        async with self._lock:  # numbered and sent atomically: the server checks the order
            if self.closed:
                return
            self._seq += 1
            msg = {"event": event, "sequenceNumber": str(self._seq), "streamSid": self.stream_sid, **body}
            try:
                await self.ws.send(json.dumps(msg))
            except ConnectionClosed:
                self.closed = True

    async def read(self) -> None:
        """Collect what the server sends; echo marks the way Twilio does once audio has played."""
        from websockets.exceptions import ConnectionClosed

        with contextlib.suppress(ConnectionClosed):
            async for raw in self.ws:
                msg = json.loads(raw)
                self.received.append(msg)
                if msg.get("event") == "mark":
                    await self.send("mark", mark=msg["mark"])
        self.closed = True

    async def start(self) -> None:
        self.reader = asyncio.create_task(self.read())
        await self.ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        start = {"accountSid": ACCOUNT_SID, "streamSid": self.stream_sid, "callSid": self.call_sid,
                 "tracks": ["inbound"], "customParameters": {},
                 "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}  # fmt: skip
        await self.send("start", start=start)
        self.paced.start()  # Twilio streams the caller's audio from now until the stop, silence included

    async def _media(self, payload: bytes) -> bool:
        if self.closed:
            return False
        self._chunk += 1
        media = {"track": "inbound", "chunk": str(self._chunk), "timestamp": str(self._chunk * 20),
                 "payload": base64.b64encode(payload).decode()}  # fmt: skip
        await self.send("media", media=media)
        return True

    async def play(self, pcm24k: np.ndarray) -> None:
        await self.paced.play(ulaw_chunks(pcm24k))

    async def press(self, digits: str) -> None:
        for digit in digits:

            async def key(digit: str = digit) -> None:
                await self.send("dtmf", dtmf={"track": "inbound_track", "digit": digit})

            await self.paced.then(key)  # in order with the audio around it
            await self.play(np.zeros(2400, np.float32))

    async def hang_up(self) -> None:
        """The caller hangs up: Twilio's `stop` message (the media stops first)."""
        await self.paced.stop()
        await self.send("stop", stop={"accountSid": ACCOUNT_SID, "callSid": self.call_sid})

    async def finished(self, within_s: float) -> dict[str, Any] | None:
        """Wait for the server to close the stream and the call's session to end; the call's record."""
        if self.reader is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.reader), within_s)
        await asyncio.wait_for(self.session.wait_closed(), within_s)
        return self.session.record


@contextlib.contextmanager
def _test_account(config: Any, rest_url: str | None) -> Iterator[None]:
    """The test account in the variables the agent's `[twilio]` names, only while its server plans."""
    values = {config.twilio.account_sid_env: ACCOUNT_SID, config.twilio.auth_token_env: AUTH_TOKEN,
              "TWILIO_API_BASE_URL": rest_url or "http://127.0.0.1:9",  # a closed port: no real REST call
              "TWILIO_WEBHOOK_KEY_ID": "", "TWILIO_WEBHOOK_KEY_SECRET": ""}  # fmt: skip
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


async def _until_healthy(base: str, server: asyncio.Task[Any], within_s: float) -> None:
    import aiohttp

    loop = asyncio.get_running_loop()
    end = loop.time() + within_s
    async with aiohttp.ClientSession() as http:
        while True:
            if server.done():
                server.result()
                raise AssertionError("agent.serve() returned before it was ready")
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(base + "/health") as resp:
                    if resp.status == 200:
                        return
            if loop.time() > end:
                raise AssertionError(f"agent.serve(twilio=True) was not ready within {within_s:g} s")
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def twilio_line(
    agent: Any,
    call_sid: str,
    caller: str,
    called: str,
    *,
    rest_url: str | None,
    ready_timeout: float,
    direction: str = "inbound",
) -> AsyncIterator[TwilioLine]:
    """Serve `agent` on Twilio's routes, place the call through the signed webhook, open its stream.

    `direction` "outbound-api" plays an outbound call being answered (`duetaspan call` placed it).
    """
    from urllib.parse import urlencode

    import aiohttp
    from websockets.asyncio.client import connect

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    sessions = capture_sessions(agent)
    with _test_account(agent.config, rest_url):
        server = asyncio.create_task(
            agent.serve(twilio=True, host="127.0.0.1", port=port, public_url=PUBLIC_URL)
        )
        await asyncio.sleep(0)  # the server plans (reads the variables) before its first await
    try:
        await _until_healthy(base, server, ready_timeout)
        form = {"CallSid": call_sid, "AccountSid": ACCOUNT_SID, "From": caller, "To": called,
                "Direction": direction,
                "CallStatus": "ringing" if direction == "inbound" else "in-progress"}  # fmt: skip
        headers = {"Content-Type": "application/x-www-form-urlencoded",
                   "X-Twilio-Signature": signature(PUBLIC_URL + "/twilio/voice", form)}  # fmt: skip
        async with aiohttp.ClientSession() as http:
            async with http.post(base + "/twilio/voice", data=urlencode(form), headers=headers) as resp:
                twiml = await resp.text()
        found = re.search(r'<Stream [^>]*url="([^"]+)"', twiml)
        if found is None:
            raise AssertionError(f"the voice webhook answered {resp.status} without a stream: {twiml}")
        wss = found.group(1).replace("&amp;", "&")
        local = wss.replace("wss://" + PUBLIC_URL.split("://", 1)[1], base.replace("http://", "ws://"), 1)
        async with connect(local, additional_headers={"X-Twilio-Signature": signature(wss, {})}) as ws:
            line = TwilioLine(ws, call_sid)
            await line.start()
            loop = asyncio.get_running_loop()
            end = loop.time() + ready_timeout
            while not sessions:
                if line.closed or loop.time() > end:
                    raise AssertionError(f"the server made no call session (it sent {line.received[-3:]})")
                await asyncio.sleep(0.02)
            line.session = sessions[0]
            yield line
    finally:
        del agent.create_session
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)


__all__ = ["ACCOUNT_SID", "AUTH_TOKEN", "PUBLIC_URL", "TwilioLine", "signature", "twilio_line", "ulaw_chunks"]
