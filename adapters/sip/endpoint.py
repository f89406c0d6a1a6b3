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
from typing import Any

from aiosipua import IncomingCall
from aiosipua.message import SipRequest
from aiosipua.sdp import SdpNegotiationError

from duetaspan.adapters.sip.call import SipCall, SipCallInfo
from duetaspan.adapters.sip.gate import OncePer, SipGate
from duetaspan.adapters.sip.liveness import AckWait, report_rtp, watch_media
from duetaspan.adapters.sip.media import CallMedia
from duetaspan.adapters.sip.negotiate import MediaOptions
from duetaspan.adapters.sip.outbound import DialResult, dial
from duetaspan.adapters.sip.outcomes import answer_reinvite, txn_outcome, unanswered_byes
from duetaspan.adapters.sip.ports import RtpPorts
from duetaspan.adapters.sip.proxy import RoutedUAC, route_uri
from duetaspan.adapters.sip.records import RtpQuality
from duetaspan.adapters.sip.register import start_registration
from duetaspan.adapters.sip.settings import SipSettings
from duetaspan.adapters.sip.sockets import bound_port, build_transport
from duetaspan.adapters.sip.srtp import effective_mode
from duetaspan.adapters.sip.transactions import Transactions
from duetaspan.adapters.sip.transfer import Transfers
from duetaspan.adapters.sip.uas import GatedUAS

logger = logging.getLogger("duetaspan.sip")

SipCallHandler = Callable[[SipCall], Awaitable[None]]
USER_AGENT = "duetaspan"
_FINISHED_MEMORY = 256
HANDLER_GRACE_S = 10.0
SESSION_EXPIRES_S = 1800  # RFC 4028, for callers that ask for session timers (`duetaspan.adapters.sip.uas`)


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
        self.on_call_rtp: Callable[[SipCall], None] = lambda call: None  # once a second while a call runs
        self.registration: Any = None
        self.ports = RtpPorts((settings.rtp_port_min, settings.rtp_port_max), settings.host)  # held until bound
        self.uas: GatedUAS | None = None
        self.acks = AckWait()  # media and the agent start at the ACK (`liveness.py`)
        self.transfers: Transfers | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # the server's call budget shared with every transport (`Admission`, set by `build_endpoint`): an INVITE
        self.shared: Any = None  # reserves its slot there before the answer, and a drain answers 503
        self._reserved: dict[str, Any] = {}
        self.txns: Transactions | None = None
        self._log_once = OncePer(60.0)

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
        if s.host in ("0.0.0.0", "::") and not s.advertised_ip:
            raise ValueError(
                f"[sip] host = {s.host!r} needs [sip] advertised_ip (the address peers reach us at): "
                "without it our SDP would say c=IN IP4 0.0.0.0, which peers read as hold"
            )
        transport = build_transport(
            s.transport,
            s.host,
            s.port,
            max_bytes=s.max_message_bytes,
            on_oversize=lambda addr: self._refused("oversize", addr),
            on_unparsable=lambda addr, exc=None: self._refused("unparsable", addr, exc),
            on_refused_connection=lambda addr: self._refused("connections", addr),
            tls_cert=s.tls_cert,
            tls_key=s.tls_key,
        )
        self.txns = txns = Transactions(
            transport.resend,  # type: ignore[attr-defined]
            reliable=bool(getattr(transport, "reliable", False)),
            t1=s.timer_t1_s,
            on_timeout=lambda request: txn_outcome(self, request, None),  # no answer in 64*T1
            on_final=lambda request, response: txn_outcome(self, request, response),
        )
        transport.txns = txns  # type: ignore[attr-defined]
        advertised = (s.advertised_ip, s.port) if s.advertised_ip else None
        route = route_uri(s.outbound_proxy) if s.outbound_proxy else None  # INVITEs of placed calls go there
        uac = RoutedUAC(transport, advertised_addr=advertised, route=route)
        self.uas = GatedUAS(
            transport,
            self.gate,
            silent=s.refuse == "silence",
            on_refused=self._refused,
            on_dtmf=self._info_dtmf,
            txns=txns,
            on_ack=self._acked,
            uac=uac,
            retransmit_2xx=True,  # on TCP/TLS too (13.3.1.4; aiosipua: UDP only), so the ACK timer runs there
            user_agent=USER_AGENT,
            advertised_addr=advertised,
            session_expires=SESSION_EXPIRES_S,
            min_se=s.session_min_se_s,
        )
        self.transfers = transfers = Transfers(uac, hop=self._hop)
        self.uas.on_response = transfers.response
        self.uas.on_invite = self._on_invite
        self.uas.on_bye = self._on_bye
        self.uas.on_cancel = self._on_cancel
        self.uas.on_ack_timeout = lambda call: self._ended(call.call_id, "no ACK for 200 OK")
        self.uas.on_session_expired = self._session_expired
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
                keepalive_s=s.keepalive_s,
            )
        logger.warning("SIP endpoint listening on %s:%d/%s; INVITEs answered from %s%s (others: %s)", s.host, self.port,
                       s.transport, ", ".join(self.gate.networks) or "no source without credentials",
                       f" or with digest credentials for user {s.auth_user!r}" if s.auth_user else "",
                       "403 Forbidden" if s.refuse == "403" else "no answer")  # fmt: skip
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
        for call_id in list(self.answering):  # answered, never ACKed: given up now
            self.acks.wake(call_id)
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=HANDLER_GRACE_S)
        if self.registration is not None:
            with contextlib.suppress(Exception):
                self.registration.unregister()
            self.registration = None
        if self.uas is not None:
            await self.uas.stop()
            self.uas = None
        if self.txns is not None:
            self.txns.close()
        unanswered_byes(self.finished.values())  # the records say so

    # --- SIP events --------------------------------------------------------------------------------------
    def _refused(self, reason: str, addr: tuple[str, int] | None = None, exc: BaseException | None = None) -> None:
        """Count a refusal (and `/metrics` through `on_refusal`); log it at most once a minute per source."""
        self.refusals[reason] += 1
        if self._log_once(addr[0] if addr else "?"):
            logger.warning("sip refused (%s) from %s%s (further refusals from there: counted, logged once a "
                           "minute)", reason, f"{addr[0]}:{addr[1]}" if addr else "?", f": {exc!r}" if exc else "")  # fmt: skip
        self.on_refusal(reason)

    def _acked(self, call_id: str) -> None:
        self.acks.wake(call_id)  # `_answer` waits for it before media and the agent start
        call = self.calls.get(call_id)
        if call is not None:
            call.confirmed.set()

    def _hop(self, call: SipCall) -> tuple[str, int]:
        """Where in-dialog requests of `call` go (its route set's first hop, else its remote target)."""
        if isinstance(call.dialog, IncomingCall) and self.uas is not None:
            return self.uas.hop(call.dialog)
        return tuple(call.dialog.remote_addr)

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
        offer = dialog.sdp_offer
        if offer is None:
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
            port, opened = await self.ports.bind(  # a pair another process took meanwhile: the next one
                lambda free: CallMedia.open(
                    offer, bind_ip=self.settings.host, port=free, advertised_ip=self.settings.advertised_ip,
                    options=self.media_options, source_ip=dialog.source_addr[0],
                )
            )  # fmt: skip
            media = opened
            dialog.ringing()
            if self.settings.answer_after_ms:
                await asyncio.sleep(self.settings.answer_after_ms / 1000)
            if self.uas is None or call_id not in self.uas._calls:  # CANCELled while ringing (487 sent)
                logger.info("call %s: cancelled before the answer", call_id)
                return
            self.acks.expect(call_id)
            dialog.accept(media.answer)
            if not await self.acks.wait(dialog):  # no ACK in 64*T1 (a spoofed INVITE?), or a BYE first
                logger.warning("call %s: never ACKed; no media, no agent, slot released", call_id)
                return
            media.start()
            answered = True
        except SdpNegotiationError as exc:
            self._reject(dialog, 488, "Not Acceptable Here", getattr(exc, "reason", "no_codec"))
            logger.warning("call %s: %s", call_id, exc)
            return
        except Exception:
            logger.exception("call %s: answering failed", call_id)
            with contextlib.suppress(Exception):
                self._reject(dialog, 500, "Server Internal Error", "failed")
            return
        finally:
            self.answering.discard(call_id)
            if not answered:  # refused, cancelled or failed: its slot, RTP session and ports go back now
                self._unreserve(call_id)
                if media is not None:
                    await media.close()
                if port:
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
        logger.info("call %s from %s (%s) to %s: answered, %s, RTP %s:%d", info.call_id, info.caller, info.source,
                    info.called, media.codec, self.settings.host, port)  # fmt: skip
        await self.serve_call(call, port)

    async def serve_call(self, call: SipCall, port: int) -> None:
        """Run the handler on an established call (inbound or outbound) until it ends; free its port."""
        info, media = call.info, call.media
        self.calls[info.call_id] = call
        call.quality = RtpQuality(media)  # RTCP round trips, for the record's and /metrics' RTP figures
        timeout_s = self.settings.media_timeout_s  # the watchdog, and the RTP figures into /metrics once a second
        watch = asyncio.gather(watch_media(call, timeout_s, self._hangup), report_rtp(call, self.on_call_rtp))
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
            watch.cancel()
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
        bye = None  # its outcome lands in `call.signalling` (and the record) when answered or given up
        if isinstance(call.dialog, IncomingCall):
            bye = self.uas.hangup(call.dialog) if self.uas is not None else None
            self._forget(call.dialog)
        elif self.uas is not None and self.uas.uac is not None:  # a call we placed
            bye = call.dialog.hangup(self.uas.uac)
            self.uas.uac.remove_call(call.call_sid)
        if bye is not None:
            call.bye_sent()

    async def _refer(self, call: SipCall, target: str) -> None:
        """Blind transfer (REFER); on success our leg is hung up (BYE)."""
        if self.transfers is None:
            raise RuntimeError("the endpoint is not running")
        await self.transfers.refer(call, target)
        self._hangup(call)

    async def dial(self, uri: str, *, caller: str | None = None, ring_timeout_s: float | None = None,
                   detect: bool | None = None, params: Any = None) -> Any:  # fmt: skip
        """Place a call to `uri`, run the handler on it once answered (`duetaspan.adapters.sip.outbound`: the
        defaults of `ring_timeout_s`, `detect`; `params` go to the answered call's `CallInfo.params`)."""
        return await dial(self, uri, caller=caller, ring_timeout_s=ring_timeout_s, detect=detect, params=params)

    def _ended(self, call_id: str, reason: str) -> None:
        self.acks.wake(call_id)  # one still waiting for its ACK gives up
        call = self.calls.get(call_id)
        if call is not None:
            logger.info("call %s: %s", call_id, reason)
            call._end(reason)

    def _session_expired(self, dialog: IncomingCall) -> None:  # no refresh (RFC 4028): the UAS sent our BYE
        if (call := self.calls.get(dialog.call_id)) is not None and not call.ended.is_set():
            call.bye_sent()
        self._ended(dialog.call_id, "session expired")

    def _on_bye(self, dialog: IncomingCall, request: SipRequest) -> None:
        self._ended(dialog.call_id, "caller hung up (BYE)")

    def _on_cancel(self, request: SipRequest, addr: tuple[str, int]) -> None:
        logger.info("call %s: CANCEL from %s:%d", request.call_id, *addr)

    def _on_reinvite(self, dialog: IncomingCall) -> None:
        answer_reinvite(self, dialog)

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
