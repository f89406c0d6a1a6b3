"""Outbound SIP calls: the process that owns the SIP stack and the engine places the call
(`await agent.dial("sip:+15551234567@trunk.example")`, or `endpoint.dial(...)`). aiosipua sends the INVITE
(digest-authenticated with `[sip] user` / `$DUETASPAN_SIP_PASSWORD` when set), we wait up to the ring
timeout, and the outcome is `answered` (the call then runs on the agent like an inbound one: its record says
`transport: "sip"`), `busy` (486/600), `no-answer` (ring timeout: CANCEL sent) or `failed` (any other refusal,
or no free slot). aiosipua does not ACK a non-2xx final answer to our INVITE: the callee retransmits it until
its own timer gives up (RFC 3261 wants the ACK; a gap of the library, noted in docs/sip.md).

Example:
    >>> # result = await endpoint.dial("sip:7002@127.0.0.1:5070")
    >>> # result.outcome, result.status      # ('answered', 200) / ('busy', 486) / ('no-answer', None)
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass
from typing import Any

from aiosipua import SipDigestAuth
from aiosipua.headers import parse_uri
from aiosipua.sdp import SdpNegotiationError

from duetaspan.adapters.sip.call import SipCall, SipCallInfo
from duetaspan.adapters.sip.media import CallMedia
from duetaspan.adapters.sip.negotiate import build_offer

logger = logging.getLogger("duetaspan.sip")

BUSY_CODES = frozenset({486, 600})


@dataclass(frozen=True)
class DialResult:
    """How a placed call went: `outcome` is answered, busy, no-answer or failed."""

    outcome: str
    uri: str
    call_id: str = ""
    status: int | None = None
    reason: str = ""
    call: Any = None  # the live `SipCall` when answered


async def dial(
    endpoint: Any, uri: str, *, caller: str | None = None, ring_timeout_s: float = 30.0
) -> DialResult:
    uas = endpoint.uas
    if uas is None or uas.uac is None:
        raise RuntimeError("the SIP endpoint is not running: start it (agent.serve(sip=...)) before dialling")
    refusal = endpoint.admission()
    if refusal is not None:
        return DialResult("failed", uri, reason=f"no free slot ({refusal[1]})")
    target = parse_uri(uri)
    infos = await asyncio.get_running_loop().getaddrinfo(
        target.host, target.port or 5060, type=socket.SOCK_DGRAM
    )
    remote = (str(infos[0][4][0]), int(target.port or 5060))
    s = endpoint.settings
    key = f"dial:{uri}:{id(object())}"
    endpoint.answering.add(key)  # the slot is held while it rings
    port = 0
    try:
        port, _ = await endpoint.ports.allocate()
        options = endpoint.media_options  # the allowed codecs, and a=crypto unless SRTP is off
        offer, crypto = build_offer(options, local_ip=s.host, port=port, advertised_ip=s.advertised_ip)
        local = uas.transport.local_addr
        user = caller or s.user or "duetaspan"
        auth = SipDigestAuth(s.user, s.register_password) if s.user and s.register_password else None
        out = uas.uac.send_invite(f"sip:{user}@{s.advertised_ip or local[0]}:{local[1]}", uri, remote, sdp_offer=offer,
                                  user_agent="duetaspan", auth=auth)  # fmt: skip
        logger.info("call %s: dialling %s", out.call_id, uri)
        try:
            await out.wait_answered(ring_timeout_s)
        except TimeoutError:
            out.cancel(uas.uac)
            uas.uac.remove_call(out.call_id)
            logger.warning(
                "call %s to %s: no answer in %.0f s (CANCEL sent)", out.call_id, uri, ring_timeout_s
            )
            return DialResult("no-answer", uri, out.call_id)
        except RuntimeError:
            code, phrase = out._reject_code, out._reject_reason
            uas.uac.remove_call(out.call_id)
            outcome = "busy" if code in BUSY_CODES else "failed"
            logger.warning("call %s to %s: %s (%d %s)", out.call_id, uri, outcome, code, phrase)
            return DialResult(outcome, uri, out.call_id, code, phrase)
        if out.sdp_answer is None:
            out.hangup(uas.uac)
            return DialResult("failed", uri, out.call_id, 200, "answer without SDP")
        try:
            media = await CallMedia.open_answered(offer, out.sdp_answer, bind_ip=s.host, port=port,
                                                  advertised_ip=s.advertised_ip, options=options, crypto=crypto)  # fmt: skip
        except SdpNegotiationError as exc:  # no codec of ours, or SRTP required and not accepted: BYE
            out.hangup(uas.uac)
            uas.uac.remove_call(out.call_id)
            logger.warning("call %s to %s: %s; hung up", out.call_id, uri, exc)
            await endpoint.ports.release(port)
            port = 0
            return DialResult("failed", uri, out.call_id, 200, str(exc))
    except BaseException:
        if port:
            await endpoint.ports.release(port)
        raise
    finally:
        endpoint.answering.discard(key)
    info = SipCallInfo(call_id=out.call_id, caller=user, called=target.user or target.host,
                       source=f"{remote[0]}:{remote[1]}", transport=s.transport)  # fmt: skip
    call = SipCall(info=info, dialog=out, media=media, on_hangup=endpoint._hangup)
    logger.info("call %s to %s: answered, %s", out.call_id, uri, media.codec)
    task = asyncio.ensure_future(endpoint.serve_call(call, port))
    endpoint._tasks.add(task)
    task.add_done_callback(endpoint._tasks.discard)
    return DialResult("answered", uri, out.call_id, 200, "OK", call)


__all__ = ["BUSY_CODES", "DialResult", "dial"]
