"""The WebRTC side of the server: the browser page, its token, and one agent call per SmallWebRTC offer.

Routes (mounted on the shared app, see `duetaspan.server`):
    GET  /                      the page (needs `?token=`; 401 without, 403 with a wrong one)
    GET  /webrtc/static/...     the page's script and style sheet (no secrets in them)
    GET  /webrtc/config         ICE servers and page options for the page (token)
    POST /webrtc/offer          `{"sdp", "type": "offer"}` -> `{"sdp", "type": "answer", "pc_id", "call_id"}`
                                (token; 413 for an oversized offer, 400 for a malformed one, 503 when all slots are busy)
    GET  /webrtc/tools, POST /webrtc/tools/run, POST /webrtc/tools/land
                                the tool console (admin token; see `duetaspan.adapters.webrtc.console`)
    GET  /webrtc/calls, GET /webrtc/calls/{call_id}
                                recent calls and their viewer pages (admin token; `...webrtc.calls`)

Two roles (`duetaspan.access`): the page token (`/?token=...`, then `Authorization: Bearer`) opens the page
and places a browser call, nothing else; the tool console and the call records need the admin token
(`$DUETASPAN_ADMIN_TOKEN`, in the `Authorization` header only), refused without it unless the server is the
local demo (loopback, no public URL).

Each accepted offer becomes a `PageTransport` over a `SmallWebRTCConnection` and an agent `CallSession`
running in the background; the call ends when the page hangs up (or never connects).

Example:
    >>> service = WebRTCService(WebRTCSettings(ice_servers=[]))
    >>> # app = create_app(); mount(app, service, "webrtc"); ...; service.agent = agent  (once started)
    >>> print(service.page_url("http://127.0.0.1:8080"))  # doctest: +ELLIPSIS
    http://127.0.0.1:8080/?token=...
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pipecat.transports.smallwebrtc.connection import SmallWebRTCConnection
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from duetaspan import __version__
from duetaspan.access import ADMIN_TOKEN_ENV, BearerRole, admin_token
from duetaspan.adapters.webrtc.calls import RecentCalls
from duetaspan.adapters.webrtc.console import ToolConsole
from duetaspan.adapters.webrtc.security import PageAccessError, PageToken, RedactQueryTokens
from duetaspan.adapters.webrtc.transport import PageTransport
from duetaspan.http_guard import BodyTooLarge, read_body
from duetaspan.model.convention import SAMPLE_RATE
from duetaspan.pipeline.admission import Refusal, Slot

logger = logging.getLogger("duetaspan.webrtc")

PAGE_PATH = "/"
STATIC_PATH = "/webrtc/static"
CONFIG_PATH = "/webrtc/config"
OFFER_PATH = "/webrtc/offer"
STATIC_DIR = Path(str(resources.files("duetaspan.adapters.webrtc") / "static"))


class WebRTCSettings(BaseModel):
    """Everything the page and its offers need."""

    token: SecretStr | None = Field(None, description="page token (random per server when not given)")
    ice_servers: list[str] = Field(default_factory=list, description="STUN/TURN URLs for both peers")
    max_offer_bytes: int = Field(65_536, gt=0, description="larger offer bodies are refused (413)")
    negotiate_timeout_s: float = Field(10.0, gt=0, description="time to answer an offer")
    connect_timeout_s: float = Field(20.0, gt=0, description="time from answer to a connected peer")
    allow_force_ret: bool = Field(False, description="let the page ask for a <ret> (testing tools)")
    max_tool_body_bytes: int = Field(16_384, gt=0, description="larger tool console bodies are refused (400)")


class OfferRequest(BaseModel):
    """The body of `POST /webrtc/offer`."""

    model_config = ConfigDict(extra="ignore")
    sdp: str = Field(min_length=1)
    type: Literal["offer"]


class OfferRefused(Exception):
    """An offer that cannot become a call; `status` is the HTTP answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class PageCall:
    """A page's call in progress."""

    call_id: str
    peer: str
    connection: SmallWebRTCConnection
    transport: PageTransport
    session: Any
    started_at: float = field(default_factory=time.monotonic)
    task: asyncio.Task | None = None


class WebRTCService:
    """Routes, token and calls of the browser page. One per server.

    `agent` (a started `duetaspan.Agent`) takes the calls; until it is set, offers are answered 503.
    """

    def __init__(self, settings: WebRTCSettings | None = None, agent: Any = None, admin: Any = None) -> None:
        self.settings = settings or WebRTCSettings()
        # the admin role (`duetaspan.access.BearerRole`): `$DUETASPAN_ADMIN_TOKEN`, refused without it unless
        # the server says it is the local demo (`duetaspan.serving` passes its own)
        self.admin = admin or BearerRole("admin", admin_token(), ADMIN_TOKEN_ENV)
        secret = self.settings.token.get_secret_value() if self.settings.token else None
        self.token = PageToken(secret)
        self.agent = agent
        # a call turned away before it started (every slot busy); the server counts it (/metrics)
        self.on_refused: Callable[[], None] = lambda: None
        self.calls: dict[str, PageCall] = {}
        self._page_html = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
        self.finished: list[str] = []  # ids of ended calls, most recent last (bounded)
        self.console = ToolConsole(self)

    def page_url(self, base_url: str) -> str:
        """The URL to open (carries the token)."""
        return self.token.page_url(base_url)

    @property
    def free_slots(self) -> int:
        return int(getattr(self.agent, "free_slots", 0)) if self.agent is not None else 0

    @property
    def ready(self) -> bool:
        """True once offers can be answered (the agent is started)."""
        return self.agent is not None

    def mount(self, app: FastAPI) -> None:
        """Add the page and WebRTC routes to `app` (see `duetaspan.server.create_app`)."""
        app.add_api_route(PAGE_PATH, self.page, methods=["GET"], include_in_schema=False)
        app.add_api_route(CONFIG_PATH, self.page_config, methods=["GET"], include_in_schema=False)
        app.add_api_route(OFFER_PATH, self.offer, methods=["POST"], include_in_schema=False)
        self.console.mount(app)
        RecentCalls(self).mount(app)
        app.mount(STATIC_PATH, StaticFiles(directory=STATIC_DIR), name="webrtc-static")
        redact = RedactQueryTokens()
        for name in ("uvicorn.access", "uvicorn.error"):
            log = logging.getLogger(name)
            if not any(isinstance(f, RedactQueryTokens) for f in log.filters):
                log.addFilter(redact)

    async def aclose(self) -> None:
        """End every call (server shutdown)."""
        calls = list(self.calls.values())
        for call in calls:
            with contextlib.suppress(Exception):
                await call.session.cancel()
        tasks = [c.task for c in calls if c.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=5.0)
            for task in pending:
                task.cancel()

    # --- HTTP ------------------------------------------------------------------------------------------
    def admin_refusal(self, request: Request) -> Response | None:
        """None when `request` carries the admin role (the console, call records), else the answer."""
        refused = self.admin.refusal(request)
        if refused is not None:
            logger.warning("refused %s %s from %s: not admin (HTTP %d)", request.method, request.url.path,
                           _peer(request), refused.status_code)  # fmt: skip
        return refused

    def _check(self, request: Request) -> PageAccessError | None:
        try:
            self.token.check(request.headers.get("authorization"), request.query_params.get("token"))
        except PageAccessError as exc:
            logger.warning("refused %s %s from %s: %s", request.method, request.url.path, _peer(request), exc)
            return exc
        return None

    async def page(self, request: Request) -> Response:
        error = self._check(request)
        if error is not None:
            return HTMLResponse(_refusal_page(error), status_code=error.status)
        return HTMLResponse(
            self._page_html, headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}
        )

    async def page_config(self, request: Request) -> Response:
        error = self._check(request)
        if error is not None:
            return JSONResponse({"error": str(error)}, status_code=error.status)
        return JSONResponse(
            {
                "ice_servers": self.settings.ice_servers,
                "force_ret": self.settings.allow_force_ret,
                "version": __version__,
                "ready": self.ready,
                "tools": self.console.available,
                "admin": "open" if self.admin.open else "token",  # the console and records need one
            },
            headers={"Cache-Control": "no-store"},
        )

    async def offer(self, request: Request) -> Response:
        error = self._check(request)
        if error is not None:
            return JSONResponse({"error": str(error)}, status_code=error.status)
        peer = _peer(request)
        try:
            offer = await self._read_offer(request)
            answer = await self._answer(offer, peer)
        except OfferRefused as exc:
            logger.warning("refused WebRTC offer from %s (HTTP %d): %s", peer, exc.status, exc)
            # 413: close the connection rather than read the rest of an oversized body
            headers = {"Connection": "close"} if exc.status == 413 else None
            return JSONResponse({"error": str(exc)}, status_code=exc.status, headers=headers)
        return JSONResponse(answer, headers={"Cache-Control": "no-store"})

    async def _read_offer(self, request: Request) -> OfferRequest:
        try:
            body = await read_body(request, self.settings.max_offer_bytes)
        except BodyTooLarge as exc:
            raise OfferRefused(exc.status, f"offer refused: {exc}") from None
        try:
            data = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise OfferRefused(400, f"offer is not JSON ({exc.__class__.__name__}: {exc})") from None
        try:
            offer = OfferRequest.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()
            )
            raise OfferRefused(400, f"offer must be {{'sdp': str, 'type': 'offer'}} ({problems})") from None
        if not offer.sdp.lstrip().startswith("v=0") or "\nm=audio " not in offer.sdp.replace("\r\n", "\n"):
            raise OfferRefused(400, "offer SDP must start with v=0 and offer an audio track (m=audio)")
        return offer

    async def _answer(self, offer: OfferRequest, peer: str, call_id: str | None = None) -> dict[str, Any]:
        """Answer `offer` and start its call (`call_id`: given by a Ray ingress, else a new one)."""
        agent = self.agent
        if agent is None:
            raise OfferRefused(503, "the agent is still loading; try again shortly")
        call_id = call_id or new_call_id()
        admitted = self._admit(call_id)
        try:
            return await self._negotiate(offer, peer, call_id, admitted)
        except BaseException:
            if admitted is not None:
                admitted.release()
            raise

    def _admit(self, call_id: str) -> Slot | None:
        """The call's slot in the server's call budget (the agent's admission), or `OfferRefused` 503."""
        admission = getattr(self.agent, "admission", None)
        if admission is None:  # an agent without one (tests' stand-ins): its engine's slots decide
            if self.agent.free_slots <= 0:
                self.on_refused()
                raise OfferRefused(503, f"all {self.agent.max_calls} call slots are busy")
            return None
        got = admission.try_acquire("webrtc", call_id)
        if isinstance(got, Refusal):
            self.on_refused()
            raise OfferRefused(503, got.message)
        return got

    async def _negotiate(
        self, offer: OfferRequest, peer: str, call_id: str, admitted: Slot | None
    ) -> dict[str, Any]:
        connection = SmallWebRTCConnection(ice_servers=self.settings.ice_servers or None)
        try:
            await asyncio.wait_for(
                connection.initialize(sdp=offer.sdp, type=offer.type), self.settings.negotiate_timeout_s
            )
            answer = connection.get_answer()
            if answer is None:
                raise ValueError("no SDP answer was produced")
        except Exception as exc:
            await _close_quietly(connection)
            if isinstance(exc, TimeoutError):
                raise OfferRefused(
                    400, f"offer not answered within {self.settings.negotiate_timeout_s} s"
                ) from None
            raise OfferRefused(400, f"offer SDP rejected by the WebRTC stack: {exc}") from None
        call = self._start_call(call_id, peer, connection)
        if admitted is not None:
            admitted.on_end(lambda: self._end(call, "the server is shutting down"))
        try:
            await call.session.open()
        except Exception as exc:  # EngineFull, or the engine failed to open a slot
            await _close_quietly(connection)
            self.calls.pop(call_id, None)
            with contextlib.suppress(Exception):
                await call.session.service.close()  # its artifacts, and its hold on the call's slot
            raise OfferRefused(503, f"no call slot: {exc}") from None
        call.task = asyncio.create_task(self._run_call(call, admitted), name=f"webrtc-call-{call_id}")
        logger.info("page call %s from %s: offer answered", call_id, peer)
        return {"sdp": answer["sdp"], "type": answer["type"], "pc_id": answer["pc_id"], "call_id": call_id}

    # --- calls -----------------------------------------------------------------------------------------
    def _start_call(self, call_id: str, peer: str, connection: SmallWebRTCConnection) -> PageCall:
        from duetaspan.pipeline.session import CallInfo

        transport = PageTransport(connection, call_id=call_id, allow_force_ret=self.settings.allow_force_ret)
        info = CallInfo(call_id=call_id, caller=peer, transport="webrtc")
        session = self.agent.create_session(info, transport, audio_in_sample_rate=SAMPLE_RATE)
        call = PageCall(call_id, peer, connection, transport, session)
        self.calls[call_id] = call

        @transport.event_handler("on_client_disconnected")
        async def _hung_up(_transport: PageTransport) -> None:
            await self._end(call, "the page hung up")

        @transport.event_handler("on_force_ret")
        async def _force_ret(_transport: PageTransport) -> None:
            slot = getattr(call.session.service, "slot", None)
            if slot is not None:
                logger.info("page call %s: <ret> forced by the page", call_id)
                slot.force_ret()

        return call

    async def _run_call(self, call: PageCall, admitted: Slot | None = None) -> None:
        watchdog = asyncio.create_task(self._watch_connect(call))
        try:
            await call.session.run()
        except Exception:
            logger.exception("page call %s failed", call.call_id)
        finally:
            if admitted is not None:
                admitted.release()
            watchdog.cancel()
            await _close_quietly(call.connection)
            self.calls.pop(call.call_id, None)
            self.finished = [*self.finished[-255:], call.call_id]
            logger.info("page call %s: ended after %.1f s", call.call_id, time.monotonic() - call.started_at)

    async def _watch_connect(self, call: PageCall) -> None:
        await asyncio.sleep(self.settings.connect_timeout_s)
        if not call.transport.connected:
            logger.warning(
                "page call %s: the page never connected within %.0f s; ending the call",
                call.call_id,
                self.settings.connect_timeout_s,
            )
            await call.session.cancel()

    async def _end(self, call: PageCall, why: str) -> None:
        logger.info("page call %s: ending (%s)", call.call_id, why)
        await call.session.end()
        # the page is gone: do not wait long for queued audio to drain towards it (the transport drops it)
        task = call.task
        if task is not None and not task.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), 3.0)
        if call.call_id in self.calls:
            await call.session.cancel()


def new_call_id() -> str:
    """A page call's id (`web-` and 12 hex digits)."""
    return f"web-{uuid.uuid4().hex[:12]}"


async def _close_quietly(connection: SmallWebRTCConnection) -> None:
    with contextlib.suppress(Exception):
        await connection.disconnect()


def _peer(request: Request) -> str:
    return f"{request.client.host}:{request.client.port}" if request.client else "?"


def _refusal_page(error: PageAccessError) -> str:
    return (
        "<!doctype html><meta charset=utf-8><title>duetaspan</title>"
        "<body style='font:16px system-ui;margin:3em;color:#223'>"
        f"<h1>{error.status}</h1><p>This page needs its token. Open the URL that "
        "<code>duetaspan serve --webrtc</code> printed when it started (it ends in <code>/?token=…</code>).</p>"
    )
