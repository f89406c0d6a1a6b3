"""The Twilio side of the server: the signed voice webhook, the signed single-use-token stream socket, the
signed status callback, call slots, and REST call control for the agent's tools.

Routes (relied on by Twilio console settings and by `duetaspan call`; keep them exactly):
    POST /twilio/voice                 voice webhook -> TwiML <Connect><Stream url="wss://PUBLIC/twilio/stream/TOKEN">
    WS   /twilio/stream/{token}        the Media Stream (signed upgrade, single-use expiring token)
    POST /twilio/status                call and stream status callbacks (signed)

Example:
    >>> async def echo(call):                                       # any `CallHandler`
    ...     async for pcm in call.audio():
    ...         call.send_audio(pcm)
    >>> settings = TwilioSettings(public_url="https://agent.example.com",
    ...                           credentials=TwilioCredentials(account_sid="AC1", auth_token="t"))
    >>> twilio = TwilioService(settings, echo, max_calls=4)
    >>> # app = create_app(); twilio.mount(app)
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from urllib.parse import parse_qsl, urlsplit

from fastapi import FastAPI, Request, Response, WebSocket
from pydantic import BaseModel, Field, field_validator
from twilio.request_validator import RequestValidator

from duetaspan.adapters.twilio import twiml
from duetaspan.adapters.twilio.errors import SignatureInvalid, StreamRefused
from duetaspan.adapters.twilio.rest import TwilioCredentials, TwilioRest
from duetaspan.adapters.twilio.security import SIGNATURE_HEADER, StreamTokens, check_signature, redact
from duetaspan.adapters.twilio.stream import (
    CallControl,
    CallHandler,
    StarletteSocket,
    StreamLimits,
    TwilioCall,
    run_stream,
)
from duetaspan.model.convention import SAMPLE_RATE
from duetaspan.observability.metrics import refusal_reason

logger = logging.getLogger("duetaspan.twilio")

VOICE_PATH = "/twilio/voice"
STREAM_PATH = "/twilio/stream"
STATUS_PATH = "/twilio/status"
MAX_FORM_BYTES = 65_536
_STATUS_MEMORY = 256


class TwilioSettings(BaseModel):
    """Everything the Twilio routes need. `public_url` is the https URL Twilio reaches this server at."""

    public_url: str
    credentials: TwilioCredentials
    token_ttl_s: float = Field(30.0, gt=0, description="time from webhook to stream upgrade")
    limits: StreamLimits = Field(default_factory=StreamLimits)
    stream_status_callbacks: bool = Field(
        True, description="ask Twilio to POST stream events to /twilio/status"
    )

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("https", "http") or not parts.netloc or parts.query or parts.fragment:
            raise ValueError(f"public URL must look like https://host[:port][/prefix], got {value!r}")
        return value.rstrip("/")

    @property
    def voice_url(self) -> str:
        return self.public_url + VOICE_PATH

    @property
    def status_url(self) -> str:
        return self.public_url + STATUS_PATH

    def stream_url(self, token: str) -> str:
        """The wss:// URL written in the TwiML; Twilio signs the upgrade over exactly this string."""
        scheme = "wss" if self.public_url.startswith("https://") else "ws"
        return f"{scheme}://{self.public_url.split('://', 1)[1]}{STREAM_PATH}/{token}"


class TwilioService:
    """Routes, tokens, slots and call control for Twilio Media Streams. One per server.

    `handler(call)` runs each call (the agent's session); `max_calls` bounds live calls plus calls whose
    webhook was answered but whose stream has not arrived yet. `rest` (default: built from the settings'
    credentials) carries out `end_call` / `transfer_call`.
    """

    def __init__(
        self,
        settings: TwilioSettings,
        handler: CallHandler,
        *,
        max_calls: int | Callable[[], int],
        rest: TwilioRest | None = None,
        in_rate: int = SAMPLE_RATE,
    ) -> None:
        self.settings = settings
        self.handler = handler
        self._max_calls = max_calls
        self.in_rate = in_rate
        self.validator = RequestValidator(settings.credentials.auth_token.get_secret_value())
        self.tokens = StreamTokens(ttl_s=settings.token_ttl_s)
        self.rest = rest or TwilioRest(settings.credentials)
        self.calls: dict[str, TwilioCall] = {}  # live calls by CallSid
        self.finished: OrderedDict[str, TwilioCall] = OrderedDict()  # recent ended calls (tests, status)
        self.call_status: OrderedDict[str, dict[str, str]] = OrderedDict()  # last status callback per call
        self.control = CallControl(hang_up=self.rest.hang_up, transfer=self.rest.transfer)
        self.on_refusal: Callable[[str], None] = lambda reason: None  # the server counts them (/metrics)

    def set_max_calls(self, max_calls: int | Callable[[], int]) -> None:
        """Change the call capacity (e.g. once the agent is loaded: `lambda: agent.max_calls`)."""
        self._max_calls = max_calls

    @property
    def max_calls(self) -> int:
        return self._max_calls() if callable(self._max_calls) else self._max_calls

    @property
    def free_slots(self) -> int:
        return max(0, self.max_calls - len(self.calls) - self.tokens.pending)

    def mount(self, app: FastAPI) -> None:
        """Add the Twilio routes to `app` (see `duetaspan.server.create_app`)."""
        app.add_api_route(VOICE_PATH, self.voice_webhook, methods=["POST"], include_in_schema=False)
        app.add_api_route(STATUS_PATH, self.status_callback, methods=["POST"], include_in_schema=False)
        app.add_api_websocket_route(STREAM_PATH + "/{token}", self.stream_socket)

    async def aclose(self) -> None:
        await self.rest.aclose()

    # --- HTTP ------------------------------------------------------------------------------------------
    async def voice_webhook(self, request: Request) -> Response:
        params = await self._signed_form(request, self.settings.voice_url)
        if isinstance(params, Response):
            return params
        call_sid = params.get("CallSid", "")
        if not call_sid:
            logger.warning("voice webhook without CallSid; answering 400")
            self.on_refusal("no_call_sid")
            return Response("CallSid missing", status_code=400, media_type="text/plain")
        caller, called = params.get("From", ""), params.get("To", "")
        if self.free_slots <= 0:
            logger.warning(
                "call %s from %s: refused, all %d call slots busy", call_sid, caller or "?", self.max_calls
            )
            self.on_refusal("busy")
            return Response(twiml.busy(), media_type="application/xml")
        grant = self.tokens.issue(
            call_sid=call_sid,
            account_sid=params.get("AccountSid", ""),
            from_number=caller,
            to_number=called,
        )
        parameters = {"from_number": caller, "to_number": called, "direction": params.get("Direction", "")}
        status_callback = self.settings.status_url if self.settings.stream_status_callbacks else None
        body = twiml.connect_stream(self.settings.stream_url(grant.token), parameters, status_callback)
        logger.info(
            "call %s from %s to %s: answered, stream token %s", call_sid, caller, called, redact(grant.token)
        )
        return Response(body, media_type="application/xml")

    async def status_callback(self, request: Request) -> Response:
        params = await self._signed_form(request, self.settings.status_url)
        if isinstance(params, Response):
            return params
        call_sid = params.get("CallSid", "?")
        event = params.get("StreamEvent") or params.get("CallStatus") or "?"
        record = {
            k: v for k, v in params.items() if k in ("CallStatus", "StreamEvent", "StreamError", "StreamSid")
        }
        self.call_status[call_sid] = record
        self.call_status.move_to_end(call_sid)
        while len(self.call_status) > _STATUS_MEMORY:
            self.call_status.popitem(last=False)
        log = logger.warning if "error" in event or params.get("StreamError") else logger.info
        log("call %s: status %s %s", call_sid, event, params.get("StreamError", ""))
        return Response(status_code=204)

    async def _signed_form(self, request: Request, url: str) -> dict[str, str] | Response:
        body = await request.body()
        if len(body) > MAX_FORM_BYTES:
            logger.warning("%s: body of %d bytes refused (limit %d)", url, len(body), MAX_FORM_BYTES)
            self.on_refusal("body_too_large")
            return Response("body too large", status_code=413, media_type="text/plain")
        try:
            params = dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False))
        except UnicodeDecodeError:
            self.on_refusal("bad_form")
            return Response("form body is not UTF-8", status_code=400, media_type="text/plain")
        signed_url = url + (f"?{request.url.query}" if request.url.query else "")
        try:
            check_signature(self.validator, signed_url, params, request.headers.get(SIGNATURE_HEADER))
        except SignatureInvalid as exc:
            logger.warning("refused %s from %s: %s", request.url.path, _peer(request), exc)
            self.on_refusal(refusal_reason(exc))
            return Response("invalid Twilio signature", status_code=403, media_type="text/plain")
        return params

    # --- WebSocket -------------------------------------------------------------------------------------
    async def stream_socket(self, websocket: WebSocket, token: str) -> None:
        try:
            # the signature first, so that unsigned attempts cannot burn a caller's token
            check_signature(
                self.validator, self.settings.stream_url(token), {}, websocket.headers.get(SIGNATURE_HEADER)
            )
            grant = self.tokens.redeem(token)
        except StreamRefused as exc:
            logger.warning("stream upgrade refused (HTTP %d) from %s: %s", exc.status, _peer(websocket), exc)
            self.on_refusal(refusal_reason(exc))
            await websocket.send_denial_response(
                Response(type(exc).__name__, status_code=exc.status, media_type="text/plain")
            )
            return
        await websocket.accept()
        call = await run_stream(
            StarletteSocket(websocket),
            self.handler,
            grant=grant,
            limits=self.settings.limits,
            control=self.control,
            in_rate=self.in_rate,
            on_start=self._started,
        )
        if call is not None:
            self.calls.pop(call.info.call_sid, None)
            self.finished[call.info.call_sid] = call
            while len(self.finished) > _STATUS_MEMORY:
                self.finished.popitem(last=False)

    def _started(self, call: TwilioCall) -> None:
        self.calls[call.info.call_sid] = call


def _peer(conn: Request | WebSocket) -> str:
    return f"{conn.client.host}:{conn.client.port}" if conn.client else "?"
