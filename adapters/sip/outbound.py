"""Outbound SIP calls: the process that owns the SIP stack and the engine places the call
(`await agent.dial("sip:+15551234567@trunk.example")`, `endpoint.dial(...)`, or `duetaspan call sip:...
--server` through the admin endpoint, `duetaspan.adapters.sip.admin`).

aiosipua sends the INVITE, to the URI's host or to `[sip] outbound_proxy` (`duetaspan.adapters.sip.proxy`:
the Request-URI stays the callee's), and answers a 401/407 digest challenge with `[sip] user` /
`$DUETASPAN_SIP_PASSWORD`. We wait up to the ring timeout (`ring_timeout_s`, else `[sip] ring_timeout_s`).
The outcome:

| outcome | when | `status` |
|---|---|---|
| `answered` | 2xx: the call then runs on the agent like an inbound one (record `transport: "sip"`) | 200 |
| `busy` | 486 Busy Here, 600 Busy Everywhere, 603 Decline | the code |
| `no-answer` | it rang (a provisional answer came) past the ring timeout: CANCEL sent (a 2xx that crosses it: ACKed, then BYE) | None |
| `failed` | any other 3xx-6xx (a challenge we could not answer included), no answer at all (unreachable, nothing listening), a host that does not resolve, an answer without usable SDP, no free slot | the code, or None |

Every outcome goes to `endpoint.on_dial(result)` (under `serve`: the `duetaspan_sip_dial_total{outcome}`
counter and, for calls never answered, their own record; `duetaspan.adapters.sip.records`). aiosipua does
not ACK a non-2xx final answer to our INVITE: our transaction layer does, on the INVITE's branch, and ACKs its
retransmissions without ending the call again (`duetaspan.adapters.sip.transactions`); so a trunk that resends
its 407 until ACKed gets the authenticated INVITE, whose 200 is ACKed and whose call we BYE at the end. The
INVITE is retransmitted until an answer comes; none in 64*T1: `failed`, reason `no response`.

A dial that is cancelled (a campaign's scheduler gives up on it, the server stops) does not leave its call
behind: a ringing INVITE is CANCELled, an answered one (its media not open yet) hung up (BYE), and its RTP port
and slot are freed before the cancellation goes on. A callee that hangs up (BYE) as soon as it answered, before
our side has opened the call's media, ends the call at once (aiosipua answers that BYE and forgets the call).

Example:
    >>> # result = await endpoint.dial("sip:7002@127.0.0.1:5070")
    >>> # result.outcome, result.status      # ('answered', 200) / ('busy', 486) / ('no-answer', None)
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import Any

from aiosipua import SipDigestAuth
from aiosipua.dialog import DialogState
from aiosipua.headers import parse_uri
from aiosipua.sdp import SdpNegotiationError
from aiosipua.transaction import TransactionState

from duetaspan.adapters.sip.call import SipCall, SipCallInfo
from duetaspan.adapters.sip.media import CallMedia
from duetaspan.adapters.sip.negotiate import build_offer
from duetaspan.adapters.sip.proxy import resolve
from duetaspan.config.sip import parse_proxy

logger = logging.getLogger("duetaspan.sip")

BUSY_CODES = frozenset({486, 600, 603})
OUTCOMES = ("answered", "busy", "no-answer", "failed")


@dataclass(frozen=True)
class DialResult:
    """How a placed call went: `outcome` is answered, busy, no-answer or failed (see the module docstring)."""

    outcome: str
    uri: str
    call_id: str = ""
    status: int | None = None
    reason: str = ""
    call: Any = None  # the live `SipCall` when answered
    caller: str = ""
    proxy: str | None = None  # the outbound proxy the INVITE went through
    ring_s: float = 0.0  # from the INVITE to the outcome
    detect: bool | None = None  # answer detection asked for by `agent.dial(..., detect=...)` (None: [outbound])

    def summary(self) -> dict[str, Any]:
        """The result as JSON (the admin endpoint's answer; the record's `sip` fields)."""
        out: dict[str, Any] = {"outcome": self.outcome, "to": self.uri, "call_id": self.call_id,
                               "sip_status": self.status, "reason": self.reason, "from": self.caller,
                               "ring_s": round(self.ring_s, 3)}  # fmt: skip
        if self.proxy:
            out["outbound_proxy"] = self.proxy
        return out


def _heard_back(uac: Any, out: Any) -> bool:
    """Whether any answer (100 Trying, 180 Ringing, ...) came to the call's INVITE."""
    for txn in uac.transactions.client_transactions.values():
        if txn.request is out.invite and txn.state != TransactionState.TRYING:
            return True
    return False


def _withdraw(endpoint: Any, uac: Any, out: Any) -> None:
    """End a call we placed that its dial no longer waits for: BYE once answered, CANCEL once anything answered
    its INVITE; an INVITE nothing answered yet cannot be CANCELled (RFC 3261 9.1) and runs to its timer, as the
    ring timeout's does. Idempotent: a call already CANCELled, rejected or hung up is left alone."""
    state = out.dialog.state
    if state == DialogState.CONFIRMED:
        out.hangup(uac)
        logger.info("call %s: dial given up after its answer: BYE", out.call_id)
        uac.remove_call(out.call_id)
    elif state == DialogState.EARLY and _heard_back(uac, out):
        _cancel(endpoint, uac, out)
        logger.info("call %s: dial given up while it rang: CANCEL", out.call_id)
    else:
        uac.remove_call(out.call_id)


def _cancel(endpoint: Any, uac: Any, out: Any) -> None:
    """CANCEL the ringing INVITE, and hang up a 2xx that crosses the CANCEL (the callee answered as it left):
    ACK, then BYE at once (RFC 3261 15, 9.1); the dial is over (`no-answer`), no agent runs. aiosipua's CANCEL
    ends the dialog and forgets the call, so such a 2xx would be dropped as an answer to an unknown call, never
    ACKed (the callee's leg up, billed, until its own timers give up): the call stays known, still early, until
    the INVITE's transaction is over (its 487, its 2xx, or 64*T1 after the CANCEL)."""
    if getattr(out, "cancel_sent", False):
        return  # CANCELled already: its transaction is being watched
    if out.cancel(uac) is None:
        uac.remove_call(out.call_id)
        return
    out.cancel_sent = True
    txns = getattr(endpoint, "txns", None)
    call_id = out.call_id

    def answered(call: Any) -> None:  # aiosipua has ACKed the 2xx (the dialog confirmed from it)
        call.hangup(uac)
        logger.warning("call %s: answered as our CANCEL crossed it: ACKed and hung up (BYE)", call_id)

    def over() -> None:
        if uac.get_call(call_id) is out:
            uac.remove_call(call_id)

    out.on_answer = answered
    out.dialog.state = DialogState.EARLY  # a 2xx still confirms it (our CANCEL does not undo an answer)
    uac._calls[call_id] = out
    if txns is None or not txns.when_over(out.invite, over):
        over()


async def dial(
    endpoint: Any, uri: str, *, caller: str | None = None, ring_timeout_s: float | None = None,
    detect: bool | None = None, params: Any = None,
) -> DialResult:
    """Place the call (the module docstring); `endpoint.on_dial(result)` hears every outcome."""
    s = endpoint.settings
    ring = float(ring_timeout_s if ring_timeout_s is not None else s.ring_timeout_s)
    user = caller or s.user or "duetaspan"
    started = asyncio.get_running_loop().time()
    result = await _place(endpoint, uri, user, ring, dict(params or {}))
    result = replace(result, ring_s=asyncio.get_running_loop().time() - started, detect=detect)
    if result.call is not None:
        result.call.dial = result  # the answered call's record says how it was placed
    try:
        endpoint.on_dial(result)
    except Exception:
        logger.exception("call %s: recording the dial outcome failed", result.call_id)
    return result


async def _place(endpoint: Any, uri: str, user: str, ring: float, params: dict[str, Any]) -> DialResult:
    uas = endpoint.uas
    if uas is None or uas.uac is None:
        raise RuntimeError("the SIP endpoint is not running: start it (agent.serve(sip=...)) before dialling")
    s = endpoint.settings
    failed = lambda reason, status=None, call_id="": DialResult(  # noqa: E731
        "failed", uri, call_id, status, reason, caller=user, proxy=s.outbound_proxy
    )
    refusal = endpoint.admission()
    if refusal is not None:
        return failed(f"no free slot ({refusal[2]})")
    try:
        target = parse_uri(uri)
    except Exception as exc:  # aiosipua's parser: ValueError and friends
        raise ValueError(f"not a SIP URI: {exc}") from None
    if not target.host:
        raise ValueError("not a SIP URI: no host")
    hop = parse_proxy(s.outbound_proxy)[:2] if s.outbound_proxy else (target.host, target.port or 5060)
    try:
        remote = await resolve(*hop)
    except OSError as exc:
        logger.warning("dialling %s: %s:%d is unreachable (%s)", uri, hop[0], hop[1], exc)
        return failed(f"unreachable: {hop[0]}:{hop[1]} ({exc.strerror or exc})")
    key = f"dial:{uri}:{id(object())}"
    endpoint.answering.add(key)  # the slot is held while it rings
    port, out = 0, None
    try:
        port, _ = await endpoint.ports.allocate()
        options = endpoint.media_options  # the allowed codecs, and a=crypto unless SRTP is off
        offer, crypto = build_offer(options, local_ip=s.host, port=port, advertised_ip=s.advertised_ip)
        local = uas.transport.local_addr
        auth = SipDigestAuth(s.user, s.register_password) if s.user and s.register_password else None
        out = uas.uac.send_invite(f"sip:{user}@{s.advertised_ip or local[0]}:{local[1]}", uri, remote, sdp_offer=offer,
                                  user_agent="duetaspan", auth=auth)  # fmt: skip
        via = f" via {s.outbound_proxy}" if s.outbound_proxy else ""
        logger.info("call %s: dialling %s%s", out.call_id, uri, via)
        try:
            await out.wait_answered(ring)
        except TimeoutError:
            heard = _heard_back(uas.uac, out)
            if heard:
                _cancel(endpoint, uas.uac, out)
            else:
                uas.uac.remove_call(out.call_id)
            await endpoint.ports.release(port)
            port = 0
            if not heard:
                logger.warning("call %s to %s%s: no answer at all in %.0f s", out.call_id, uri, via, ring)
                return failed(f"no response in {ring:.0f} s", call_id=out.call_id)
            logger.warning("call %s to %s: no answer in %.0f s (CANCEL sent)", out.call_id, uri, ring)
            return DialResult("no-answer", uri, out.call_id, None, f"no answer in {ring:.0f} s (CANCEL sent)",
                              caller=user, proxy=s.outbound_proxy)  # fmt: skip
        except RuntimeError:
            code, phrase = out._reject_code, out._reject_reason
            uas.uac.remove_call(out.call_id)
            await endpoint.ports.release(port)
            port = 0
            if not code:  # our INVITE's transaction gave up: 64*T1 without any answer (timer B)
                logger.warning("call %s to %s%s: no response to the INVITE", out.call_id, uri, via)
                return failed("no response", call_id=out.call_id)
            outcome = "busy" if code in BUSY_CODES else "failed"
            logger.warning("call %s to %s: %s (%d %s)", out.call_id, uri, outcome, code, phrase)
            return DialResult(outcome, uri, out.call_id, code, phrase, caller=user, proxy=s.outbound_proxy)
        if out.sdp_answer is None:
            out.hangup(uas.uac)
            await endpoint.ports.release(port)
            port = 0
            return failed("answered without SDP", 200, out.call_id)
        endpoint.ports.hand_over(port)  # held since the offer named it: the media binds it now
        try:
            media = await CallMedia.open_answered(offer, out.sdp_answer, bind_ip=s.host, port=port,
                                                  advertised_ip=s.advertised_ip, options=options, crypto=crypto,
                                                  source_ip=remote[0])  # fmt: skip
        except (SdpNegotiationError, ValueError) as exc:  # no codec of ours, or SRTP required and refused: BYE
            out.hangup(uas.uac)
            uas.uac.remove_call(out.call_id)
            logger.warning("call %s to %s: %s; hung up", out.call_id, uri, exc)
            await endpoint.ports.release(port)
            port = 0
            return failed(str(exc), 200, out.call_id)
    except BaseException:  # cancelled (a campaign gave up on the dial, the server stops), or the media failed
        if out is not None:
            _withdraw(endpoint, uas.uac, out)
        if port:
            await endpoint.ports.release(port)
        raise
    finally:
        endpoint.answering.discard(key)
    info = SipCallInfo(call_id=out.call_id, caller=user, called=target.user or target.host,
                       source=f"{remote[0]}:{remote[1]}", transport=s.transport, params=params)  # fmt: skip
    call = SipCall(info=info, dialog=out, media=media, on_hangup=endpoint._hangup)
    logger.info("call %s to %s: answered, %s", out.call_id, uri, media.codec)
    # known now, before serve_call's task starts: a BYE from here on ends it (`endpoint._ended`); one that came
    # while the media opened was answered (200) and forgot the call (aiosipua), and would have been lost
    endpoint.calls[out.call_id] = call
    if uas.uac.get_call(out.call_id) is not out:
        logger.info("call %s: the callee hung up (BYE) as it was answered", out.call_id)
        call._end("caller hung up (BYE)")
    task = asyncio.ensure_future(endpoint.serve_call(call, port))
    endpoint._tasks.add(task)
    task.add_done_callback(endpoint._tasks.discard)
    return DialResult("answered", uri, out.call_id, 200, "OK", call, caller=user, proxy=s.outbound_proxy)


__all__ = ["BUSY_CODES", "OUTCOMES", "DialResult", "dial"]
