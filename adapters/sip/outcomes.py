"""What the end of one of our client transactions means for a call (`Transactions.on_final`/`on_timeout`,
`duetaspan.adapters.sip.transactions`), and our answer to a re-INVITE.

| our request | no answer in 64*T1 | a final answer |
|---|---|---|
| INVITE (a call we place) | the dial ends `failed`, reason `no response` (`sip_status` None) | aiosipua's call logic |
| re-INVITE, UPDATE (a session refresh) | the call ends (`session refresh failed`), BYE | 408 or 481: the same (RFC 4028 10) |
| BYE | `call.signalling["BYE"] = "no response"`, logged | `call.signalling["BYE"]` = its status; both into the record (`records.bye_meta`) |
| REFER | the transfer fails (`SipActionFailed`: no answer to the REFER) | `duetaspan.adapters.sip.transfer` |
| REGISTER | `duetaspan.adapters.sip.register` retries with backoff | aiosipua's `Registration` |

Example:
    >>> NO_RESPONSE
    'no response'
"""

from __future__ import annotations

import logging
from typing import Any

from aiosipua.dialog import DialogState
from aiosipua.sdp import SdpNegotiationError

from duetaspan.adapters.sip.call import PENDING

logger = logging.getLogger("duetaspan.sip")

NO_RESPONSE = "no response"


def txn_outcome(endpoint: Any, request: Any, response: Any) -> None:
    """`response` None: no answer in 64*T1 (see the module docstring)."""
    method = request.method.upper()
    call_id = request.call_id or ""
    status = response.status_code if response is not None else None
    uas = endpoint.uas
    uac = uas.uac if uas is not None else None
    in_dialog = bool(request.to_addr and request.to_addr.tag)
    if method == "INVITE" and not in_dialog:
        out = uac.get_call(call_id) if uac is not None else None
        if status is None and uac is not None and out is not None and out.dialog.state == DialogState.EARLY:
            out._reject_code, out._reject_reason = 0, NO_RESPONSE
            out.dialog.terminate()
            out._rejected.set()
            uac.remove_call(call_id)
    elif method in ("INVITE", "UPDATE"):  # a session refresh (or a re-INVITE) of ours
        if status is None or status in (408, 481):
            call = endpoint.calls.get(call_id)
            if call is not None:
                logger.warning("call %s: session refresh %s: %s; hanging up", call_id, method, status or NO_RESPONSE)
                endpoint._hangup(call)
                endpoint._ended(call_id, "session refresh failed")
    elif method == "BYE":
        call = endpoint.calls.get(call_id) or endpoint.finished.get(call_id)
        outcome = str(status) if status is not None else NO_RESPONSE
        detail = f"no answer in {endpoint.txns.timeout_s:g} s" if status is None else None
        if call is not None:
            call.signalled("BYE", outcome, detail)
        if status is None:
            logger.warning("call %s: our BYE got no answer in %.0f s", call_id, endpoint.txns.timeout_s)
    elif method == "REFER" and status is None and endpoint.transfers is not None:
        endpoint.transfers.no_answer(call_id)
    elif method == "REGISTER" and status is None and endpoint.registration is not None:
        retry = getattr(endpoint.registration, "retry_later", None)
        if retry is not None:
            retry(f"no answer from the registrar in {endpoint.txns.timeout_s:.0f} s")


def unanswered_byes(calls: Any) -> None:
    """At shutdown (our transactions stop): each BYE of ours still pending is `no response`."""
    for call in calls:
        if call.signalling.get("BYE") == PENDING:
            call.signalled("BYE", NO_RESPONSE, "no answer before the server stopped")


def answer_reinvite(endpoint: Any, dialog: Any) -> None:
    """Hold, resume or a new media address (the dialog itself was checked by aiosipua)."""
    call = endpoint.calls.get(dialog.call_id)
    if call is None:
        return
    if dialog.sdp_offer is None:  # an offerless re-INVITE: our SDP is the offer
        dialog.accept(call.media.answer)
        return
    try:
        answer = call.media.renegotiate(dialog.sdp_offer)
    except SdpNegotiationError as exc:
        logger.warning("call %s: re-INVITE refused (488): %s", dialog.call_id, exc)
        if endpoint.uas is not None:  # not `dialog.reject`: that would end the established dialog
            endpoint.uas._send_error(dialog.invite, 488, "Not Acceptable Here")
        return
    dialog.accept(answer)


__all__ = ["NO_RESPONSE", "answer_reinvite", "txn_outcome", "unanswered_byes"]
