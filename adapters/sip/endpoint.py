"""The SIP endpoint of one server: listens (UDP, TCP or TLS), admits INVITEs through the gate and the call
slots, answers them (100, 180, 200 with the SDP answer; ACK, BYE both ways, CANCEL, OPTIONS come from
aiosipua), runs each call's handler (the agent's session) and ends calls cleanly. We are a user agent only:
nothing received is ever relayed, proxied or forwarded.

Admission is `SipEndpoint.admission()` and `_reserve`: 503 while the agent is not ready or the server drains,
486 Busy Here when every slot is held; under `serve` the slots are the server's one budget
(`SipEndpoint.shared`, the agent's `Admission`), reserved at the INVITE and taken again by the call's pipeline.

Example:
    >>> async def echo(call):                                   # any `SipCallHandler`
    ...     async for pcm in call.media.audio():
    ...         call.media.send_audio(pcm.astype("float32") / 32768)
    >>> settings = SipSettings(host="127.0.0.1", port=5060)
    >>> endpoint = SipEndpoint(settings, echo, max_calls=4)
    >>> # await endpoint.start(); ...; await endpoint.aclose()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiortp import PortAllocator
from aiosipua import IncomingCall
from aiosipua.message import SipRequest
from aiosipua.sdp import SdpNegotiationError

from duetaspan.adapters.sip.call import SipCall, SipCallInfo
from duetaspan.adapters.sip.codecs import DEFAULT_CODECS
from duetaspan.adapters.sip.gate import SipGate
from duetaspan.adapters.sip.media import CallMedia
from duetaspan.adapters.sip.negotiate import MediaOptions
from duetaspan.adapters.sip.outbound import DialResult, dial
from duetaspan.adapters.sip.proxy import RoutedUAC, route_uri
from duetaspan.adapters.sip.records import RtpQuality
from duetaspan.adapters.sip.register import start_registration
from duetaspan.adapters.sip.sockets import bound_port, build_transport
from duetaspan.adapters.sip.srtp import effective_mode
from duetaspan.adapters.sip.transfer import Transfers
from duetaspan.adapters.sip.uas import GatedUAS

logger = logging.getLogger("duetaspan.sip")

SipCallHandler = Callable[[SipCall], Awaitable[None]]
USER_AGENT = "duetaspan"
_FINISHED_MEMORY = 256
HANDLER_GRACE_S = 10.0


@dataclass
class SipSettings:
    """The endpoint's resolved settings (from `[sip]` and the `serve --sip-*` flags)."""

    host: str = "127.0.0.1"
    port: int = 5060
    transport: str = "udp"
    allow: list[str] = field(default_factory=list)
    auth_user: str | None = None
    auth_password: str | None = field(default=None, repr=False)  # from the environment only
    realm: str = "duetaspan"
    refuse: str = "403"
    advertised_ip: str | None = None
    rtp_port_min: int = 20000
    rtp_port_max: int = 20999
    max_message_bytes: int = 16384
    rate_per_s: float = 20.0
    answer_after_ms: int = 0
    registrar: str | None = None  # host[:port]
    user: str | None = None
    register_password: str | None = field(default=None, repr=False)  # from the environment only
    register_expires: int = 300
    outbound_proxy: str | None = None  # host[:port][;transport=...]: where the INVITEs of placed calls go
    ring_timeout_s: float = 30.0
    tls_cert: Path | None = None
    tls_key: Path | None = None
    srtp: str = "off"  # off, optional, required (`duetaspan.adapters.sip.srtp`)
    srtp_plain_signalling: bool = False  # SDES keys over UDP/TCP signalling (readable on the path)
    codecs: tuple[str, ...] = DEFAULT_CODECS  # allowed, where their packages import


class SipEndpoint:
    """SIP signalling, admission and call bookkeeping for one server. `refusals` counts by reason
    (`forbidden`, `rate_limited`, `oversize`, `busy`, `not_ready`, `no_codec`, `no_srtp`); `on_refusal(reason)`
    lets the server count them too (`/metrics`)."""

    def __init__(
        self,
        settings: SipSettings,
        handler: SipCallHandler,
        *,
        max_calls: int | Callable[[], int],
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        self.settings = settings
        self.handler = handler
        srtp = effective_mode(settings.srtp, settings.transport, settings.srtp_plain_signalling)  # ValueError
        self.media_options = MediaOptions(tuple(settings.codecs), srtp)
        self._max_calls = max_calls
        self.ready = ready
        self.gate = SipGate(
            allow=list(settings.allow),
            auth_user=settings.auth_user,
            auth_password=settings.auth_password,
            realm=settings.realm,
            rate_per_s=settings.rate_per_s,
        )
        self.calls: dict[str, SipCall] = {}
        self.answering: set[str] = set()  # admitted, not yet answered: they hold a slot
        self.finished: OrderedDict[str, SipCall] = OrderedDict()
        self.refusals: Counter[str] = Counter()
        self.on_refusal: Callable[[str], None] = lambda reason: None
        self.on_registration: Callable[[str], None] = lambda outcome: None  # registered, failed, expired
        self.on_dial: Callable[[DialResult], None] = lambda result: None  # every outcome of a call we place
        self.on_call_end: Callable[[SipCall], None] = lambda call: None  # an answered call ended (RTP)
        self.registration: Any = None
        self.ports = PortAllocator((settings.rtp_port_min, settings.rtp_port_max))
        self.uas: GatedUAS | None = None
        self.transfers: Transfers | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # the server's call budget shared with every transport (`duetaspan.pipeline.admission.Admission`, set by
        # `build_endpoint`): an INVITE reserves its slot there before the answer, and a drain answers 503
        self.shared: Any = None
        self._reserved: dict[str, Any] = {}

    # --- admission (the one place; see the module docstring) --------------------------------------------
    def set_max_calls(self, max_calls: int | Callable[[], int]) -> None:
        self._max_calls = max_calls

    @property
    def max_calls(self) -> int:
        return self._max_calls() if callable(self._max_calls) else self._max_calls

    @property
    def free_slots(self) -> int:
        return max(0, self.max_calls - len(self.calls) - len(self.answering))

    def admission(self) -> tuple[int, str, str] | None:
        """None when a new call may take a slot, else (SIP status, reason phrase, refusal reason)."""
        if not self.ready():
            return 503, "Service Unavailable", "not_ready"
        shared = self.shared
        if shared is not None and shared.draining:
            return 503, "Service Unavailable", "draining"
        if self.free_slots <= 0 or (shared is not None and shared.free <= 0):
            return 486, "Busy Here", "busy"
        return None

    def _reserve(self, call_id: str) -> tuple[int, str, str] | None:
        """Take the call's slot in the shared budget (its pipeline takes the same slot again when it starts);
        None when reserved, else the refusal to answer with."""
        if self.shared is None:
            return None
        got = self.shared.try_acquire("sip", call_id, ttl_s=30.0)
        reason = getattr(got, "reason", None)
        if reason is not None:  # a `Refusal`: another transport took the last slot, or the server drains
            return (486, "Busy Here", "busy") if reason == "busy" else (503, "Service Unavailable", reason)
        self._reserved[call_id] = got
        return None

    def _unreserve(self, call_id: str) -> None:
        slot = self._reserved.pop(call_id, None)
        if slot is not None:
            slot.release()

    # --- lifecycle ---------------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self.uas.transport.local_addr[1] if self.uas is not None else self.settings.port

    async def start(self) -> None:
        s = self.settings
        transport = build_transport(
            s.transport,
            s.host,
            s.port,
            max_bytes=s.max_message_bytes,
            on_oversize=lambda addr: self._refused("oversize", addr),
            tls_cert=s.tls_cert,
            tls_key=s.tls_key,
        )
        advertised = (s.advertised_ip, s.port) if s.advertised_ip else None
        route = route_uri(s.outbound_proxy) if s.outbound_proxy else None  # INVITEs of placed calls go there
        uac = RoutedUAC(transport, advertised_addr=advertised, route=route)
        self.transfers = transfers = Transfers(uac)
        self.uas = GatedUAS(
            transport,
            self.gate,
            silent=s.refuse == "silence",
            on_refused=self._refused,
            on_dtmf=self._info_dtmf,
            on_response=transfers.response,
            uac=uac,
            user_agent=USER_AGENT,
            advertised_addr=advertised,
        )
        self.uas.on_invite = self._on_invite
        self.uas.on_bye = self._on_bye
        self.uas.on_cancel = self._on_cancel
        self.uas.on_ack_timeout = lambda call: self._ended(call.call_id, "no ACK for 200 OK")
        self.uas.on_session_expired = lambda call: self._ended(call.call_id, "session expired")
        self.uas.on_reinvite = self._on_reinvite
        self.uas.on_transfer_progress = transfers.progress
        await self.uas.start()
        transport.local_addr = (s.host, bound_port(transport))
        if s.registrar and s.user:
            self.registration = await start_registration(
                uac,
                self.gate,
                registrar=s.registrar,
                user=s.user,
                password=s.register_password,
                expires=s.register_expires,
                on_outcome=lambda outcome: self.on_registration(outcome),
            )
        logger.warning(
            "SIP endpoint listening on %s:%d/%s; INVITEs answered from %s%s (others: %s)",
            s.host,
            self.port,
            s.transport,
            ", ".join(self.gate.networks) or "no source without credentials",
            f" or with digest credentials for user {s.auth_user!r}" if s.auth_user else "",
            "403 Forbidden" if s.refuse == "403" else "no answer",
        )
        logger.info(
            "SIP media: codecs %s; SRTP %s",
            ", ".join(spec.name for spec in self.media_options.specs),
            self.media_options.srtp,
        )

    async def aclose(self) -> None:
        """Hang up every call (BYE), wait briefly for their handlers, stop listening."""
        for call in list(self.calls.values()):
            self._hangup(call)
            call._end("server shutting down")
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=HANDLER_GRACE_S)
        if self.registration is not None:
            with contextlib.suppress(Exception):
                self.registration.unregister()
            self.registration = None
        if self.uas is not None:
            await self.uas.stop()
            self.uas = None

    # --- SIP events --------------------------------------------------------------------------------------
    def _refused(self, reason: str, addr: tuple[str, int] | None = None) -> None:
        self.refusals[reason] += 1
        logger.warning("sip refused (%s) from %s", reason, f"{addr[0]}:{addr[1]}" if addr else "?")
        self.on_refusal(reason)

    def _on_invite(self, dialog: IncomingCall) -> None:
        self._spawn(self._answer(dialog))

    def _forget(self, dialog: IncomingCall) -> None:
        if self.uas is not None:
            self.uas._calls.pop(dialog.call_id, None)
            self.uas._remove_invite_transaction(dialog.invite)

    def _reject(self, dialog: IncomingCall, status: int, phrase: str, reason: str) -> None:
        dialog.reject(status, phrase)
        self._forget(dialog)
        self._refused(reason, dialog.source_addr)

    async def _answer(self, dialog: IncomingCall) -> None:
        refusal = self.admission()
        if refusal is not None:
            self._reject(dialog, *refusal)
            return
        if dialog.sdp_offer is None:
            self._reject(dialog, 488, "Not Acceptable Here", "no_offer")
            return
        call_id = dialog.call_id
        refusal = self._reserve(call_id)
        if refusal is not None:
            self._reject(dialog, *refusal)
            return
        self.answering.add(call_id)
        port = 0
        media: CallMedia | None = None
        answered = False
        try:
            port, _ = await self.ports.allocate()
            media = await CallMedia.open(
                dialog.sdp_offer,
                bind_ip=self.settings.host,
                port=port,
                advertised_ip=self.settings.advertised_ip,
                options=self.media_options,
            )
            dialog.ringing()
            if self.settings.answer_after_ms:
                await asyncio.sleep(self.settings.answer_after_ms / 1000)
            if self.uas is None or call_id not in self.uas._calls:  # CANCELled while ringing (487 sent)
                logger.info("call %s: cancelled before the answer", call_id)
                await media.close()
                return
            dialog.accept(media.answer)
            answered = True
        except SdpNegotiationError as exc:
            self._reject(dialog, 488, "Not Acceptable Here", getattr(exc, "reason", "no_codec"))
            logger.warning("call %s: %s", call_id, exc)
            return
        except Exception:
            logger.exception("call %s: answering failed", call_id)
            with contextlib.suppress(Exception):
                self._reject(dialog, 500, "Server Internal Error", "failed")
            if media is not None:
                await media.close()
            return
        finally:
            self.answering.discard(call_id)
            if not answered:  # refused, cancelled or failed: its slot in the shared budget goes back now
                self._unreserve(call_id)
            if media is None and port:
                await self.ports.release(port)
        try:
            await self._run_call(dialog, media, port)
        finally:
            self._unreserve(call_id)

    async def _run_call(self, dialog: IncomingCall, media: CallMedia, port: int) -> None:
        caller, called = dialog.invite.from_addr, dialog.invite.to_addr
        info = SipCallInfo(
            call_id=dialog.call_id,
            caller=(caller.uri.user or caller.uri.host) if caller else "",
            called=(called.uri.user or called.uri.host) if called else "",
            source=f"{dialog.source_addr[0]}:{dialog.source_addr[1]}",
            transport=self.settings.transport,
        )
        call = SipCall(info=info, dialog=dialog, media=media, on_hangup=self._hangup, on_refer=self._refer)
        logger.info(
            "call %s from %s (%s) to %s: answered, %s, RTP %s:%d",
            info.call_id,
            info.caller,
            info.source,
            info.called,
            media.codec,
            self.settings.host,
            port,
        )
        await self.serve_call(call, port)

    async def serve_call(self, call: SipCall, port: int) -> None:
        """Run the handler on an established call (inbound or outbound) until it ends; free its port."""
        info, media = call.info, call.media
        self.calls[info.call_id] = call
        call.quality = RtpQuality(media)  # RTCP round trips, for the record's and /metrics' RTP figures
        try:
            handler = asyncio.ensure_future(self.handler(call))
            ended = asyncio.ensure_future(call.ended.wait())
            await asyncio.wait({handler, ended}, return_when=asyncio.FIRST_COMPLETED)
            if not call.ended.is_set():  # the agent finished first: hang up
                self._hangup(call)
                call._end("agent ended the call")
            ended.cancel()
            done, _ = await asyncio.wait({handler}, timeout=HANDLER_GRACE_S)
            if not done:
                logger.warning("call %s: handler still running after the end; cancelling", info.call_id)
                handler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                exc = await asyncio.gather(handler, return_exceptions=True)
                if exc and isinstance(exc[0], Exception):
                    logger.error("call %s: handler failed: %r", info.call_id, exc[0])
        finally:
            await media.close()
            await self.ports.release(port)
            self.calls.pop(info.call_id, None)
            self.finished[info.call_id] = call
            while len(self.finished) > _FINISHED_MEMORY:
                self.finished.popitem(last=False)
            logger.info("call %s: ended (%s); RTP %s", info.call_id, call.end_reason, call.quality.figures())
            self.on_call_end(call)

    def _hangup(self, call: SipCall) -> None:
        """BYE from our side (once; a call the caller already ended is left alone)."""
        if call.ended.is_set():
            return
        if isinstance(call.dialog, IncomingCall):
            call.dialog.hangup()
            self._forget(call.dialog)
        elif self.uas is not None and self.uas.uac is not None:  # a call we placed
            call.dialog.hangup(self.uas.uac)
            self.uas.uac.remove_call(call.call_sid)

    async def _refer(self, call: SipCall, target: str) -> None:
        """Blind transfer (REFER); on success our leg is hung up (BYE)."""
        if self.transfers is None:
            raise RuntimeError("the endpoint is not running")
        await self.transfers.refer(call, target)
        self._hangup(call)

    async def dial(
        self, uri: str, *, caller: str | None = None, ring_timeout_s: float | None = None, params: Any = None
    ) -> Any:
        """Place a call to `uri` and run the handler on it once answered (`duetaspan.adapters.sip.outbound`);
        `ring_timeout_s` None: `[sip] ring_timeout_s`; `params` go to the answered call's `CallInfo.params`."""
        return await dial(self, uri, caller=caller, ring_timeout_s=ring_timeout_s, params=params)

    def _ended(self, call_id: str, reason: str) -> None:
        call = self.calls.get(call_id)
        if call is not None:
            logger.info("call %s: %s", call_id, reason)
            call._end(reason)

    def _on_bye(self, dialog: IncomingCall, request: SipRequest) -> None:
        self._ended(dialog.call_id, "caller hung up (BYE)")

    def _on_cancel(self, request: SipRequest, addr: tuple[str, int]) -> None:
        logger.info("call %s: CANCEL from %s:%d", request.call_id, addr[0], addr[1])

    def _on_reinvite(self, dialog: IncomingCall) -> None:
        """Hold, resume or a new media address (the dialog itself was checked by aiosipua)."""
        call = self.calls.get(dialog.call_id)
        if call is None:
            return
        if dialog.sdp_offer is None:  # an offerless re-INVITE: our SDP is the offer
            dialog.accept(call.media.answer)
            return
        try:
            answer = call.media.renegotiate(dialog.sdp_offer)
        except SdpNegotiationError as exc:
            logger.warning("call %s: re-INVITE refused (488): %s", dialog.call_id, exc)
            if self.uas is not None:  # not `dialog.reject`: that would end the established dialog
                self.uas._send_error(dialog.invite, 488, "Not Acceptable Here")
            return
        dialog.accept(answer)

    def _info_dtmf(self, call_id: str, digit: str) -> None:
        call = self.calls.get(call_id)
        if call is not None:
            logger.info("call %s: SIP INFO DTMF %s", call_id, digit)
            call.media.dtmf(digit)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


__all__ = ["SipCallHandler", "SipEndpoint", "SipSettings"]
