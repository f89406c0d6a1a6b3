"""aiosipua's `SipUAS` behind our gate and our transaction layer: every request that belongs to no known call
passes `SipGate.check` before the stack sees it (a refused source never gets even `100 Trying`), and in-dialog
`INFO` carries DTMF (`application/dtmf-relay` / `application/dtmf`).

Before aiosipua sees a message, `Transactions` (`duetaspan.adapters.sip.transactions`) takes out what RFC 3261
section 17 says is a retransmission: a retransmitted request gets our last answer again (so a retransmitted
INVITE is one call, and its digest answer is not mistaken for a replay), a retransmitted final answer to our
request is ACKed again or dropped (so a trunk's resent 407 does not end the call it challenged).

What we change in aiosipua's dialogs (`duetaspan.adapters.sip.dialogs`): the route set of a call we answer is
the INVITE's Record-Route in order (aiosipua reverses it), and a call we placed takes its remote target and
route set from the 2xx; in-dialog requests go to the next hop. A CANCEL that crosses our 200 is answered
(200) and ignored: the call stays up until the caller's BYE (aiosipua would drop it). A second INVITE of a
Call-ID that is still ringing on another branch is answered 482 (8.2.2.2), not taken as a second call.
Session timers (RFC 4028) run only where the caller asks for them (`Supported: timer` or `Session-Expires`):
a caller that never asked never gets a BYE from a timer. A Session-Expires without `timer` support (a proxy
put it in) makes us the refresher, or, where the caller's Allow lacks UPDATE, runs no timer. Where we are the refresher we send UPDATE at half the
interval (to the next hop; a refresh answered 408/481 or not at all ends the call); where the caller is, no
refresh before the deadline (interval - min(32, interval/3)) ends the call with BYE (`session expired`).
A caller with timer support whose Allow lacks UPDATE is made the refresher (we never refresh by re-INVITE).

Requests for a known Call-ID go straight to aiosipua, which checks the dialog (tags, CSeq) and answers
`481` when they match none. `ACK` is never answered, whatever its source.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from functools import partial
from typing import Any

from aiosipua import IncomingCall, SipUAS
from aiosipua.dialog import DialogState
from aiosipua.message import SipRequest, SipResponse
from aiosipua.session_timer import SessionTimer, parse_session_expires
from aiosipua.uas_requests import handle_ack, handle_cancel
from aiosipua.utils import format_addr

from duetaspan.adapters.sip.dialogs import confirm_from_2xx, next_hop, uas_route_set
from duetaspan.adapters.sip.gate import SipGate
from duetaspan.adapters.sip.transactions import Transactions, cseq_method, top_branch

logger = logging.getLogger("duetaspan.sip")

_DTMF_SIGNAL = re.compile(r"(?im)^\s*signal\s*=\s*([0-9A-D*#])\s*$")
_DTMF_PLAIN = re.compile(r"^\s*([0-9A-D*#])\s*$", re.I)


class GatedUAS(SipUAS):
    """`SipUAS` with `gate` in front of out-of-dialog requests; refusals go to `on_refused(reason, addr)`."""

    def __init__(
        self,
        transport: Any,
        gate: SipGate,
        *,
        silent: bool,
        on_refused: Callable[[str, tuple[str, int]], object],
        on_dtmf: Callable[[str, str], object],
        txns: Transactions,
        on_response: Callable[[Any], bool] = lambda response: False,
        on_ack: Callable[[str], object] = lambda call_id: None,
        **kwargs: Any,
    ) -> None:
        super().__init__(transport, **kwargs)
        self.gate = gate
        self.silent = silent
        self.on_refused = on_refused
        self.on_info_dtmf = on_dtmf
        self.txns = txns
        self.on_response = on_response  # answers to our own in-dialog requests (REFER)
        self.on_ack = on_ack  # the ACK of our 200 arrived (the call is confirmed)
        self._handlers["INFO"] = self._handle_info
        self._handlers["ACK"] = self._handle_ack
        self._handlers["CANCEL"] = self._handle_cancel

    # --- what comes in ---------------------------------------------------------------------------------
    def _on_message(self, msg: Any, addr: tuple[str, int]) -> None:
        if isinstance(msg, SipResponse):
            if self.txns.response(msg) or self.on_response(msg):
                return
            self._answered_2xx(msg)
        elif isinstance(msg, SipRequest) and self.txns.request(msg):
            return
        super()._on_message(msg, addr)

    def _answered_2xx(self, response: SipResponse) -> None:
        """The first 2xx to a call we placed: its remote target and route set (before aiosipua ACKs it)."""
        if not 200 <= response.status_code < 300 or cseq_method(response) != "INVITE" or self.uac is None:
            return
        call = self.uac.get_call(response.call_id or "")
        if call is not None and call.dialog.state == DialogState.EARLY:
            confirm_from_2xx(call, response, reliable=self.reliable)

    @property
    def reliable(self) -> bool:
        return bool(getattr(self.transport, "reliable", False))

    def _known(self, call_id: str) -> bool:
        return call_id in self._calls or (self.uac is not None and call_id in self.uac._calls)

    def _handle_request(self, request: SipRequest, addr: tuple[str, int]) -> None:
        method = request.method.upper()
        if method == "ACK" or self._known(request.call_id or ""):
            super()._handle_request(request, addr)
            return
        verdict = self.gate.check(request, addr[0])
        if verdict == "allow":
            super()._handle_request(request, addr)
        elif verdict in ("challenge", "stale"):
            header = self.gate.challenge_header(stale=verdict == "stale")
            self._send_error(request, 401, "Unauthorized", extra_headers={"WWW-Authenticate": header})
            if verdict == "stale":
                self.on_refused("replayed", addr)
        else:
            reason = "rate_limited" if verdict == "rate_limited" else "forbidden"
            self.on_refused(reason, addr)
            if reason == "forbidden" and not self.silent and request.headers.get("via"):
                self._send_error(request, 403, "Forbidden")

    def _handle_invite(self, request: SipRequest, addr: tuple[str, int]) -> None:
        call_id = request.call_id or ""
        existing = self._calls.get(call_id)
        if existing is not None and existing.dialog.state == DialogState.EARLY:
            # the same INVITE on another branch (a loop, a forking proxy): one call only (8.2.2.2)
            if top_branch(existing.invite) != top_branch(request):
                self._send_error(request, 482, "Loop Detected")
                return
        supports = "timer" in _tokens(request, "supported", "require")
        allow = _tokens(request, "allow")
        # RFC 4028 9: a caller without timer support (a Session-Expires a proxy put in) cannot be the refresher.
        # We are, by UPDATE where its Allow has it (or it sends none); where not, we run no timer at all (we never
        # refresh by re-INVITE): never a BYE to a caller that never asked
        asks = supports or (request.get_header("session-expires") and (not allow or "update" in allow))
        offered, self.session_expires = self.session_expires, (self.session_expires if asks else None)
        try:
            super()._handle_invite(request, addr)
        finally:
            self.session_expires = offered
        call = self._calls.get(call_id)
        if call is not None and call.invite is request and existing is None:
            if call.session_interval:  # aiosipua reads a one-line `Allow: ..., UPDATE` as no UPDATE
                asked = parse_session_expires(request.get_header("session-expires") or "0")[1]
                can_update = not allow or "update" in allow
                call.session_refresher_us = not supports or (asked != "uac" and can_update)
            call.dialog.route_set = uas_route_set(request)
            call.acked = False  # type: ignore[attr-defined]  # `SipCall.confirmed` waits for it

    def _handle_ack(self, request: SipRequest, addr: tuple[str, int]) -> None:
        call = self._calls.get(request.call_id or "")
        handle_ack(self, request, addr)
        if (
            call is not None
            and call.dialog.state == DialogState.CONFIRMED
            and not getattr(call, "acked", True)
        ):
            call.acked = True  # type: ignore[attr-defined]
            self.on_ack(call.call_id)

    def _handle_cancel(self, request: SipRequest, addr: tuple[str, int]) -> None:
        branch = top_branch(request)
        txn = self.transactions.get_server(branch, "INVITE") if branch else None
        call = (
            self._calls.get(txn.request.call_id or "")
            if txn is not None and txn.request is not None
            else None
        )
        if call is not None and call._answered:
            # our 200 crossed the CANCEL (9.2): the CANCEL is answered and has no effect; the BYE ends the call
            resp = call.dialog.create_response(request, 200, "OK")
            self.transport.send_reply(resp)
            logger.info("call %s: CANCEL after our 200 OK: ignored (the call stays up)", call.call_id)
            return
        handle_cancel(self, request, addr)

    def _handle_info(self, request: SipRequest, addr: tuple[str, int]) -> None:
        call = self._calls.get(request.call_id or "")
        if call is None:
            self._send_error(request, 481, "Call/Transaction Does Not Exist")
            return
        if not self._validate_in_dialog(call.dialog, request):
            return
        resp = call.dialog.create_response(request, 200, "OK")
        self.transport.send_reply(resp)
        ctype = (request.content_type or "").lower()
        text = request.text if request.body else ""
        match = _DTMF_SIGNAL.search(text) if ctype == "application/dtmf-relay" else None
        if match is None and ctype == "application/dtmf":
            match = _DTMF_PLAIN.match(text)
        if match is not None:
            self.on_info_dtmf(call.call_id, match.group(1).upper())

    # --- what goes out ---------------------------------------------------------------------------------
    def hop(self, call: IncomingCall) -> tuple[str, int]:
        """Where in-dialog requests of a call we answered go."""
        return next_hop(call.dialog, call.source_addr, reliable=self.reliable)

    def hangup(self, call: IncomingCall) -> SipRequest | None:
        """BYE on a call we answered, to its next hop (aiosipua's `hangup` sends to the INVITE's source)."""
        if call.dialog.state != DialogState.CONFIRMED:
            return None
        local = call._signaling_addr()
        bye = call.dialog.create_request("BYE", via_host=local[0], via_port=local[1])
        call.dialog.terminate()
        call._stop_retransmissions()
        self.transport.send(bye, self.hop(call))
        return bye

    def _start_session_timer(self, call: IncomingCall) -> None:
        """aiosipua's RFC 4028 timer (at the ACK), refreshing with our `refresh_session` when we refresh."""
        if not call.session_interval or call._session_timer is not None:
            return
        call._session_timer = SessionTimer(
            call.session_interval,
            we_refresh=call.session_refresher_us,
            refresh=partial(self.refresh_session, call),
            expire=partial(self._dispatch_session_expired, call),
        )
        call._session_timer.start()

    def refresh_session(self, call: IncomingCall) -> SipRequest | None:
        """Our session refresh (we are the refresher): a bodyless UPDATE (RFC 4028 7.4) to the dialog's next
        hop, through its route set (aiosipua sends it to the INVITE's source), retransmitted by our
        transactions; no answer, 408 or 481 end the call with BYE (`duetaspan.adapters.sip.outcomes`)."""
        if call.dialog.state != DialogState.CONFIRMED:
            return None
        local = call._signaling_addr()
        update = call.dialog.create_request("UPDATE", via_host=local[0], via_port=local[1])
        update.headers.set_single("Contact", f"<sip:{format_addr(*local)}>")
        update.headers.set_single("Session-Expires", f"{call.session_interval};refresher=uas")
        self.transport.send(update, self.hop(call))
        return update

    def _dispatch_session_expired(self, call: IncomingCall) -> None:
        self._calls.pop(call.call_id, None)
        self._remove_invite_transaction(call.invite)
        self.hangup(call)
        logger.warning("call %s: session expired (no refresh, RFC 4028): BYE sent", call.call_id)
        if self.on_session_expired is not None:
            self.on_session_expired(call)


def _tokens(request: SipRequest, *names: str) -> set[str]:
    values: list[str] = []
    for name in names:
        values += request.headers.get(name)
    return {t.strip().lower() for value in values for t in value.split(",")}


__all__ = ["GatedUAS"]
