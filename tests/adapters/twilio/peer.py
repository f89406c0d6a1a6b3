"""Test helpers that play Twilio: signed webhooks, a signed stream upgrade over a real WebSocket, replaying
recorded Media Streams at real-time pace while collecting what the server sends back; and a loopback fake of
Twilio's REST API that records the requests it gets."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

import aiohttp
import uvicorn
from aiohttp import web
from twilio.request_validator import RequestValidator
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from duetaspan.adapters.twilio.bridge import AGENT_IN_RATE, agent_call_handler
from duetaspan.adapters.twilio.rest import TwilioCredentials, TwilioRest
from duetaspan.adapters.twilio.service import TwilioService, TwilioSettings
from duetaspan.adapters.twilio.stream import StreamLimits
from duetaspan.server import create_app, mount
from tests.support import free_port, serve_app

ACCOUNT_SID = "AC222222222222222222222222222222"
AUTH_TOKEN = "test-auth-token-0123456789abcdef"
PUBLIC_URL = "https://agent.example.test"


@contextlib.asynccontextmanager
async def run_uvicorn(app: object) -> AsyncIterator[str]:
    """Serve an ASGI app in this event loop on a free loopback port; yields `http://127.0.0.1:PORT`."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="on"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


NO_REST_URL = "http://127.0.0.1:9"  # a closed port: for services whose tests expect no REST call


def twilio_service(
    handler: Any,
    *,
    max_calls: Any = 4,
    rest_url: str = NO_REST_URL,
    limits: StreamLimits | None = None,
    **kwargs: Any,
) -> TwilioService:
    """A `TwilioService` signed with the test account, calling `handler` per call; its REST calls (hang up,
    transfer) go to `rest_url` (a `FakeTwilioRest`, or a closed port where no test expects any)."""
    creds = TwilioCredentials(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN, api_base_url=rest_url)
    settings = TwilioSettings(public_url=PUBLIC_URL, credentials=creds, limits=limits or StreamLimits())
    return TwilioService(settings, handler, max_calls=max_calls, rest=TwilioRest(creds), **kwargs)


def twilio_app(service: TwilioService) -> Any:
    """The SDK's web app with `service` on Twilio's routes (`/twilio/...`)."""
    app = create_app()
    mount(app, service, "twilio")
    return app


@contextlib.asynccontextmanager
async def serve_twilio(service: TwilioService) -> AsyncIterator[TwilioPeer]:
    """Serve `service` on a loopback uvicorn server; yields a `TwilioPeer` on it."""
    async with run_uvicorn(twilio_app(service)) as base:
        yield TwilioPeer(base)


@contextlib.asynccontextmanager
async def serve_agent_on_twilio(
    agent: Any, rest_url: str = NO_REST_URL
) -> AsyncIterator[tuple[TwilioPeer, TwilioService]]:
    """Serve a started `Agent` on Twilio's routes of a loopback uvicorn server (REST calls to `rest_url`).

    Yields a `TwilioPeer` on that server and the `TwilioService`.
    """
    service = twilio_service(  # the agent's one call budget, as `duetaspan serve` has it
        agent_call_handler(agent),
        max_calls=0,
        rest_url=rest_url,
        in_rate=AGENT_IN_RATE,
        admission=agent.admission,
    )
    async with serve_twilio(service) as peer:
        yield peer, service


@dataclass
class Received:
    """What the server sent on one stream, with arrival times."""

    messages: list[dict] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    close_code: int | None = None

    def of(self, event: str) -> list[dict]:
        return [m for m in self.messages if m.get("event") == event]

    def media_times(self) -> list[float]:
        return [t for m, t in zip(self.messages, self.times, strict=True) if m.get("event") == "media"]

    def media_bytes(self) -> list[bytes]:
        return [base64.b64decode(m["media"]["payload"]) for m in self.of("media")]


@dataclass
class TwilioPeer:
    """Plays Twilio against a server at `base_url` that believes it is reachable at `public_url`."""

    base_url: str
    public_url: str = PUBLIC_URL
    auth_token: str = AUTH_TOKEN
    account_sid: str = ACCOUNT_SID

    @property
    def validator(self) -> RequestValidator:
        return RequestValidator(self.auth_token)

    async def post_form(
        self, path: str, params: dict[str, str], *, signature: str | None = "valid"
    ) -> tuple[int, str]:
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        if signature == "valid":
            headers["X-Twilio-Signature"] = self.validator.compute_signature(self.public_url + path, params)
        elif signature is not None:
            headers["X-Twilio-Signature"] = signature
        async with aiohttp.ClientSession() as http:
            async with http.post(self.base_url + path, data=urlencode(params), headers=headers) as resp:
                return resp.status, await resp.text()

    async def voice(self, call_sid: str, *, caller: str = "+15550001111", called: str = "+15552223333", **kw):
        params = {
            "CallSid": call_sid,
            "AccountSid": self.account_sid,
            "From": caller,
            "To": called,
            "Direction": "inbound",
            "CallStatus": "ringing",
        }
        return await self.post_form("/twilio/voice", params, **kw)

    async def stream_url(self, call_sid: str, **kw) -> str:
        """Run the webhook and return the wss URL from its TwiML."""
        status, body = await self.voice(call_sid, **kw)
        assert status == 200, body
        match = re.search(r'<Stream [^>]*url="([^"]+)"', body)
        assert match, body
        return match.group(1)

    def local(self, wss_url: str) -> str:
        public_host = self.public_url.split("://", 1)[1]
        return wss_url.replace(f"wss://{public_host}", self.base_url.replace("http://", "ws://"), 1)

    @contextlib.asynccontextmanager
    async def open_stream(
        self, wss_url: str, *, signature: str | None = "valid"
    ) -> AsyncIterator[ClientConnection]:
        headers = {}
        if signature == "valid":
            headers["X-Twilio-Signature"] = self.validator.compute_signature(wss_url, {})
        elif signature is not None:
            headers["X-Twilio-Signature"] = signature
        async with connect(self.local(wss_url), additional_headers=headers, max_size=None) as ws:
            yield ws

    async def play(
        self,
        ws: ClientConnection,
        messages: Iterable[dict | str],
        *,
        realtime: bool = True,
        echo_marks: bool = True,
        renumber: bool = True,
        linger_s: float = 0.0,
        wait_close_s: float = 10.0,
        got: Received | None = None,
        until: Callable[[Received], bool] | None = None,
    ) -> Received:
        """Send `messages` (media paced 20 ms apart when `realtime`), echo marks like Twilio, collect replies
        (into `got` when given: a caller may watch what arrived while it plays). Then wait up to `wait_close_s`
        for the server to close the stream, or, with `until`, only until `until(got)` holds (the socket stays
        open: an event to wait for, not a guess at how long the server takes on a busy machine)."""
        got = Received() if got is None else got
        lock = asyncio.Lock()
        reached = asyncio.Event()  # `until(got)` held
        seq = 0

        async def send(msg: dict | str) -> None:
            nonlocal seq
            async with lock:  # number and send atomically: the server checks the order
                if renumber and isinstance(msg, dict) and msg.get("event") != "connected":
                    seq += 1
                    msg = {**msg, "sequenceNumber": str(seq)}
                await ws.send(msg if isinstance(msg, str) else json.dumps(msg))

        async def reader() -> None:
            with contextlib.suppress(ConnectionClosed):
                await read_all()

        async def read_all() -> None:
            async for raw in ws:
                msg = json.loads(raw)
                got.messages.append(msg)
                got.times.append(time.monotonic())
                if until is not None and until(got):
                    reached.set()
                if echo_marks and msg.get("event") == "mark":
                    with contextlib.suppress(Exception):
                        await send({"event": "mark", "streamSid": msg["streamSid"], "mark": msg["mark"]})

        task = asyncio.create_task(reader())
        start = time.monotonic()
        n_media = 0
        try:
            for msg in messages:
                if isinstance(msg, dict) and msg.get("event") == "media" and realtime:
                    delay = start + n_media * 0.02 - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    n_media += 1
                if isinstance(msg, dict) and msg.get("event") == "stop" and linger_s:
                    await asyncio.sleep(linger_s)
                await send(msg)
        except Exception:  # the server may close on us mid-stream (hostile-input tests)
            pass
        if until is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(task, wait_close_s)
        elif not until(got):
            waiter = asyncio.create_task(reached.wait())
            await asyncio.wait({task, waiter}, timeout=wait_close_s, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        task.cancel()
        got.close_code = ws.close_code
        return got


def renumber(
    messages: Sequence[dict], call_sid: str | None = None, account_sid: str = ACCOUNT_SID
) -> list[dict]:
    """A recorded stream re-addressed to `call_sid` (the webhook's call) with fresh sequence numbers."""
    out = []
    for msg in messages:
        msg = json.loads(json.dumps(msg))
        if call_sid and msg.get("event") == "start":
            msg["start"]["callSid"] = call_sid
            msg["start"]["accountSid"] = account_sid
        if call_sid and msg.get("event") == "stop":
            msg["stop"]["callSid"] = call_sid
        out.append(msg)
    return out


@dataclass
class FakeTwilioRest:
    """A loopback stand-in for api.twilio.com: records requests, answers like Twilio's Calls resource."""

    requests: list[dict] = field(default_factory=list)
    missing_calls: set[str] = field(default_factory=set)
    # a callee: `await on_create(sid, form)` runs as a task once `calls.create` is answered (the call rings)
    on_create: Any = None
    refuse_numbers: set[str] = field(default_factory=set)  # calls.create to these: 400, Twilio error 21219
    tasks: set = field(default_factory=set)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/2010-04-01/Accounts/{account}/Calls.json", self._create)
        app.router.add_post("/2010-04-01/Accounts/{account}/Calls/{sid}.json", self._update)
        return app

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        async with serve_app(self.app()) as url:
            yield url

    async def _record(self, request: web.Request) -> dict:
        form = dict(parse_qsl(await request.text(), keep_blank_values=True))
        entry = {
            "method": request.method,
            "path": request.path,
            "form": form,
            "multi": parse_qsl(await request.text(), keep_blank_values=True),
            "auth": request.headers.get("Authorization", ""),
        }
        self.requests.append(entry)
        return entry

    async def _create(self, request: web.Request) -> web.Response:
        entry = await self._record(request)
        sid = f"CA{len(self.requests):032d}"
        if entry["form"].get("To") in self.refuse_numbers:
            return web.json_response(
                {"code": 21219, "message": "The number is unverified.", "status": 400}, status=400
            )
        if self.on_create is not None:
            task = asyncio.ensure_future(self.on_create(sid, entry["form"]))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return web.json_response(
            {
                "sid": sid,
                "account_sid": request.match_info["account"],
                "to": entry["form"].get("To"),
                "from": entry["form"].get("From"),
                "status": "queued",
            },
            status=201,
        )

    async def _update(self, request: web.Request) -> web.Response:
        await self._record(request)
        sid = request.match_info["sid"]
        if sid in self.missing_calls:
            return web.json_response(
                {
                    "code": 20404,
                    "message": f"The requested resource {request.path} was not found",
                    "status": 404,
                },
                status=404,
            )
        return web.json_response(
            {"sid": sid, "account_sid": request.match_info["account"], "status": "completed"}
        )
