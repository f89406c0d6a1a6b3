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
import re
from collections import OrderedDict
from collections.abc import Callable
from urllib.parse import parse_qsl, urlsplit

from fastapi import FastAPI, Request, Response, WebSocket
from pydantic import BaseModel, Field, SecretStr, field_validator

from duetaspan.adapters.twilio import twiml
from duetaspan.adapters.twilio.errors import SignatureInvalid, StreamRefused
from duetaspan.adapters.twilio.outbound import TwilioDialer
from duetaspan.adapters.twilio.rest import TwilioCredentials, TwilioRest
from duetaspan.adapters.twilio.security import (
    SETTINGS_HEADER,
    SIGNATURE_HEADER,
    SigningKeys,
    StreamTokens,
    check_signature,
    redact,
)
from duetaspan.adapters.twilio.stream import (
    CallControl,
    CallHandler,
    StarletteSocket,
    StreamLimits,
    TwilioCall,
    run_stream,
)
from duetaspan.http_guard import BodyTooLarge, read_body
from duetaspan.model.convention import SAMPLE_RATE
from duetaspan.pipeline.admission import DRAINING, Admission, Refusal, Slot

logger = logging.getLogger("duetaspan.twilio")

VOICE_PATH = "/twilio/voice"
STREAM_PATH = "/twilio/stream"
STATUS_PATH = "/twilio/status"
IDEMPOTENCY_HEADER = "I-Twilio-Idempotency-Token"
MAX_FORM_BYTES = 65_536
_STATUS_MEMORY = 256
_REPLY_MEMORY = 1024  # answers remembered by idempotency token


class WebhookKey(BaseModel):
    """A webhook SharedKey (Twilio console: Webhooks > Shared keys): requests carrying
    `X-Twilio-Webhooks-Signature-Settings: key=<id>,...` are checked with its secret instead of the Auth Token."""

    id: str = Field(min_length=1)
    secret: SecretStr


class TwilioSettings(BaseModel):
    """Everything the Twilio routes need. `public_url` is the https URL Twilio reaches this server at."""

    public_url: str
    credentials: TwilioCredentials
    phone_number: str | None = Field(None, description="the caller ID of calls the server places")
    webhook_key: WebhookKey | None = None
    token_ttl_s: float = Field(30.0, gt=0, description="time from webhook to stream upgrade")
    limits: StreamLimits = Field(default_factory=StreamLimits)
    stream_status_callbacks: bool = Field(
        True, description="ask Twilio to POST stream events to /twilio/status"
    )
    drain_redirect_url: str | None = Field(
        None, description="while draining, new calls are redirected here (else rejected busy)"
    )

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme == "http":
            raise ValueError(
                f"public URL {value!r} is http: Twilio only opens Media Streams over wss:// (error 31922) and "
                "this URL's stream would be ws://; give the https:// URL of your TLS proxy or tunnel"
            )
        if parts.scheme != "https" or not parts.netloc or parts.query or parts.fragment:
            raise ValueError(f"public URL must look like https://host[:port][/prefix], got {value!r}")
        return value.rstrip("/")

    @property
    def voice_url(self) -> str:
        return self.public_url + VOICE_PATH

    @property
    def status_url(self) -> str:
        return self.public_url + STATUS_PATH

    def stream_url(self, token: str) -> str:
        """The wss:// URL written in the TwiML; Twilio signs the upgrade over this string (accepted with and
        without an explicit `:443`, see `security.url_forms`)."""
        return f"wss://{self.public_url.split('://', 1)[1]}{STREAM_PATH}/{token}"

    @property
    def signing_keys(self) -> SigningKeys:
        key = self.webhook_key
        return SigningKeys(
            auth_token=self.credentials.auth_token.get_secret_value(),
            shared_key_id=key.id if key else None,
            shared_key_secret=key.secret.get_secret_value() if key else None,
        )


class TwilioService:
    """Routes, tokens, slots and call control for Twilio Media Streams. One per server.

    `handler(call)` runs each call (the agent's session). Slots come from `admission` (the server's one
    call budget, `duetaspan.pipeline.admission`; default: one of `max_calls` slots for this service alone): a
    slot is reserved when the webhook mints the call's stream token and given back when the call ends, or
    when the token expires unused, or when the upgraded stream sends no valid `start` in time. While the
    admission drains, new calls get `twiml.drain_refusal` (a redirect to `drain_redirect_url`, else a busy
    reject) and live calls go on. `rest` (default: built from the settings' credentials) carries out
    `end_call` / `transfer_call`.
    """

    def __init__(
        self,
        settings: TwilioSettings,
        handler: CallHandler,
        *,
        max_calls: int | Callable[[], int],
        rest: TwilioRest | None = None,
        in_rate: int = SAMPLE_RATE,
        admission: Admission | None = None,
    ) -> None:
        self.settings = settings
        self.handler = handler
        self._max_calls = max_calls
        self.admission = admission or Admission(lambda: self.max_calls)
        self.in_rate = in_rate
        self.keys = settings.signing_keys
        self.tokens = StreamTokens(ttl_s=settings.token_ttl_s)
        self.rest = rest or TwilioRest(settings.credentials)
        self.calls: dict[str, TwilioCall] = {}  # live calls by CallSid
        self.upgrading: set[str] = set()  # CallSids whose token was redeemed, `start` not yet arrived
        self.finished: OrderedDict[str, TwilioCall] = OrderedDict()  # recent ended calls (tests, status)
        self.call_status: OrderedDict[str, dict[str, str]] = OrderedDict()  # last status callback per call
        self.replies: OrderedDict[str, str] = OrderedDict()  # voice answers by CallSid|idempotency token
        self.control = CallControl(
            hang_up=self.rest.hang_up, transfer=self.rest.transfer, apologize=self.rest.apologize
        )
        self.on_refusal: Callable[[str], None] = lambda reason: None  # the server counts them (/metrics)
        self.dialer = TwilioDialer(self)  # calls the server places (`agent.dial("+1555...")`)

    def set_max_calls(self, max_calls: int | Callable[[], int]) -> None:
        """Change the call capacity (e.g. once the agent is loaded: `lambda: agent.max_calls`)."""
        self._max_calls = max_calls

    @property
    def max_calls(self) -> int:
        return self._max_calls() if callable(self._max_calls) else self._max_calls

    @property
    def free_slots(self) -> int:
        return self.admission.free

    def mount(self, app: FastAPI) -> None:
        """Add the Twilio routes to `app` (see `duetaspan.server.create_app`)."""
        app.add_api_route(VOICE_PATH, self.voice_webhook, methods=["POST"], include_in_schema=False)
        app.add_api_route(STATUS_PATH, self.status_callback, methods=["POST"], include_in_schema=False)
        app.add_api_websocket_route(STREAM_PATH + "/{token}", self.stream_socket)

    async def aclose(self) -> None:
        await self.rest.aclose()

    def refuse(
        self,
        reason: str,
        status: int,
        detail: str,
        *,
        peer: str = "?",
        body: str | None = None,
        media_type: str = "text/plain",
    ) -> Response:
        """Every refusal of the Twilio routes goes through here: one WARNING line naming `reason` (a short
        snake_case word, e.g. `signature_invalid`, `busy`, `replayed_webhook`) and the answer to send."""
        logger.warning("twilio refused (%s, HTTP %d) from %s: %s", reason, status, peer, detail)
        self.on_refusal(reason)
        headers = {"Connection": "close"} if status == 413 else None
        return Response(body or reason, status_code=status, media_type=media_type, headers=headers)

    # --- HTTP ------------------------------------------------------------------------------------------
    async def voice_webhook(self, request: Request) -> Response:
        params = await self._signed_form(request, self.settings.voice_url)
        if isinstance(params, Response):
            return params
        peer = _peer(request)
        call_sid = params.get("CallSid", "")
        if not call_sid:
            return self.refuse(
                "no_call_sid", 400, "signed voice webhook without CallSid", peer=peer, body="CallSid missing"
            )
        # headers are not signed: the idempotency token only ever repeats an answer given to the same call
        idempotency = request.headers.get(IDEMPOTENCY_HEADER, "")[:200]
        retry_of = f"{call_sid}|{idempotency}" if idempotency else ""
        if retry_of in self.replies:  # Twilio's retry of a request we answered: the same answer
            logger.info(
                "call %s: webhook retried (idempotency token %s): same answer", call_sid, redact(idempotency)
            )
            return Response(self.replies[retry_of], media_type="application/xml")
        caller, called = params.get("From", ""), params.get("To", "")
        grant = self.tokens.waiting(call_sid)
        if grant is not None:  # a replay (or Twilio's retry) while the token waits: same TwiML, same slot
            logger.info("call %s: webhook repeated; same stream token %s", call_sid, redact(grant.token))
        elif self.tokens.answered(call_sid):
            return self.refuse(
                "replayed_webhook",
                409,
                f"call {call_sid[:40]} was answered already",
                peer=peer,
                body="call already answered",
            )
        elif isinstance(
            slot := self.admission.try_acquire("twilio", call_sid, ttl_s=self.tokens.ttl_s), Refusal
        ):
            return self._remember(retry_of, self._refuse_call(slot, call_sid, caller, peer))
        else:
            try:
                grant = self.tokens.issue(
                    call_sid=call_sid,
                    account_sid=params.get("AccountSid", ""),
                    from_number=caller,
                    to_number=called,
                )
            except StreamRefused as exc:  # too many tokens waiting: as busy as no slot
                slot.release()
                return self.refuse(
                    _reason(exc), 200, str(exc), peer=peer, body=twiml.busy(), media_type="application/xml"
                )
            logger.info(
                "call %s from %s to %s: answered, stream token %s",
                call_sid,
                caller,
                called,
                redact(grant.token),
            )
        parameters = {"from_number": caller, "to_number": called, "direction": params.get("Direction", "")}
        status_callback = self.settings.status_url if self.settings.stream_status_callbacks else None
        body = twiml.connect_stream(self.settings.stream_url(grant.token), parameters, status_callback)
        return self._remember(retry_of, Response(body, media_type="application/xml"))

    def _refuse_call(self, refusal: Refusal, call_sid: str, caller: str, peer: str) -> Response:
        """No slot for a new call: the drain's TwiML while draining, else the busy message."""
        who = f"call {call_sid[:40]} from {caller or '?'}"
        if refusal.reason == DRAINING:
            where = self.settings.drain_redirect_url
            body = twiml.drain_refusal(where)
            detail = f"{who}: {refusal.message}; " + (f"redirected to {where}" if where else "rejected busy")
            return self.refuse(DRAINING, 200, detail, peer=peer, body=body, media_type="application/xml")
        return self.refuse(
            "busy",
            200,
            f"{who}: {refusal.message}",
            peer=peer,
            body=twiml.busy(),
            media_type="application/xml",
        )

    def _remember(self, retry_of: str, response: Response) -> Response:
        if retry_of:
            self.replies[retry_of] = bytes(response.body).decode()
            while len(self.replies) > _REPLY_MEMORY:
                self.replies.popitem(last=False)
        return response

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
        if not params.get("StreamEvent"):
            self.dialer.status(call_sid, params.get("CallStatus", ""))
        self.call_status.move_to_end(call_sid)
        while len(self.call_status) > _STATUS_MEMORY:
            self.call_status.popitem(last=False)
        log = logger.warning if "error" in event or params.get("StreamError") else logger.info
        log("call %s: status %s %s", call_sid, event, params.get("StreamError", ""))
        return Response(status_code=204)

    async def _signed_form(self, request: Request, url: str) -> dict[str, str] | Response:
        peer = _peer(request)
        try:
            body = await read_body(request, MAX_FORM_BYTES)
        except BodyTooLarge as exc:
            return self.refuse(
                "body_too_large", 413, f"{request.url.path}: {exc}", peer=peer, body="body too large"
            )
        try:
            params = dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False))
        except UnicodeDecodeError:
            return self.refuse(
                "not_utf8",
                400,
                f"{request.url.path}: form body is not UTF-8",
                peer=peer,
                body="form body is not UTF-8",
            )
        signed_url = url + (f"?{request.url.query}" if request.url.query else "")
        try:
            check_signature(
                self.keys,
                signed_url,
                params,
                request.headers.get(SIGNATURE_HEADER),
                request.headers.get(SETTINGS_HEADER),
            )
        except SignatureInvalid as exc:
            return self.refuse(
                _reason(exc), 403, f"{request.url.path}: {exc}", peer=peer, body="invalid Twilio signature"
            )
        return params

    # --- WebSocket -------------------------------------------------------------------------------------
    async def stream_socket(self, websocket: WebSocket, token: str) -> None:
        url = self.settings.stream_url(token)
        try:
            # the signature first, so that unsigned attempts cannot burn a caller's token
            check_signature(
                self.keys,
                url,
                {},
                websocket.headers.get(SIGNATURE_HEADER),
                websocket.headers.get(SETTINGS_HEADER),
                shown_url=self.settings.stream_url(redact(token)),
            )
            grant = self.tokens.redeem(token)
        except StreamRefused as exc:
            if exc.call_sid and (lapsed := self.admission.get(exc.call_sid)) is not None:
                lapsed.release()  # an expired token: its reservation goes
            denial = self.refuse(
                _reason(exc),
                exc.status,
                f"stream upgrade: {exc}",
                peer=_peer(websocket),
                body=type(exc).__name__,
            )
            await websocket.send_denial_response(denial)
            return
        slot = self._hold(grant.call_sid)
        if isinstance(slot, Refusal):  # the reservation lapsed and the slots went to others meanwhile
            await websocket.send_denial_response(
                self.refuse(slot.reason, 503, f"stream upgrade: {slot.message}", peer=_peer(websocket))
            )
            return
        # the slot stays held between the token's use and `start` (moved to `calls` by `_started`)
        self.upgrading.add(grant.call_sid)
        call: TwilioCall | None = None
        try:
            await websocket.accept()
            call = await run_stream(
                StarletteSocket(websocket),
                self.handler,
                grant=grant,
                limits=self.settings.limits,
                control=self.control,
                in_rate=self.in_rate,
                on_start=lambda started: self._started(started, slot),
            )
        finally:
            self.upgrading.discard(grant.call_sid)
            self.calls.pop(grant.call_sid, None)
            slot.release()
        if call is not None:
            self.finished[call.info.call_sid] = call
            while len(self.finished) > _STATUS_MEMORY:
                self.finished.popitem(last=False)

    def _hold(self, call_sid: str) -> Slot | Refusal:
        """The redeemed call's reserved slot, now held until its stream ends."""
        slot = self.admission.get(call_sid)
        if slot is None:
            return self.admission.try_acquire("twilio", call_sid)
        slot.hold()
        return slot

    def _started(self, call: TwilioCall, slot: Slot) -> None:
        self.upgrading.discard(call.info.call_sid)
        self.calls[call.info.call_sid] = call
        self.dialer.started(call)
        slot.on_end(lambda: end_stream(call, "the server is shutting down"))


async def end_stream(call: TwilioCall, reason: str) -> None:
    """End a live call from the server's side as a hang-up does: the stream closes (Twilio goes on to the
    TwiML after `<Connect>`: none, so the call ends) and the agent's session ends and writes its record."""
    if call.ended.is_set():
        return
    logger.info("call %s: ending: %s", call.info.call_sid, reason)
    call._end(reason)
    try:
        await call.socket.close(1000, reason[:120])
    except Exception:  # already gone
        logger.debug("call %s: closing its stream failed", call.info.call_sid, exc_info=True)


def _reason(exc: Exception) -> str:
    """`TokenReused` -> `token_reused`: the refusal reason of an exception."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__).lower()


def _peer(conn: Request | WebSocket) -> str:
    return f"{conn.client.host}:{conn.client.port}" if conn.client else "?"
