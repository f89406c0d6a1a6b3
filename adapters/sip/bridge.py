"""Runs an agent on SIP calls: each call gets a `CallSession` over a `SipPipecatTransport` (records say
`transport: "sip"`, metrics `transport="sip"`), and the call actions the agent's tools request are carried
out on the live call: `end_call` sends BYE, `transfer_call` sends REFER, `send_dtmf` sends RFC 4733 digits.
The record also says the call's direction, dial outcome, SIP status and RTP figures (`record_sip_facts`).

Example:
    >>> # endpoint = SipEndpoint(settings, agent_call_handler(agent), max_calls=agent.max_calls)
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from duetaspan.adapters.sip.call import PENDING, SipActionFailed, SipCall
from duetaspan.adapters.sip.endpoint import SipCallHandler
from duetaspan.adapters.sip.pipeline import SipPipecatTransport
from duetaspan.adapters.sip.records import RtpQuality, amend_meta, bye_meta, call_meta
from duetaspan.registry.context import act_on_actions

logger = logging.getLogger("duetaspan.sip")

# as the Twilio bridge: the span carrying the tool's confirmation lands and is spoken before the action
ACTION_GRACE_S = 2.0
END_KINDS = frozenset({"end_call", "hang_up"})
TRANSFER_KINDS = frozenset({"transfer_call", "transfer"})
DTMF_KINDS = frozenset({"send_dtmf"})


async def perform_action(call: SipCall, action: Any, *, drain_s: float = 3.0) -> None:
    """Carry out one `duetaspan.registry.CallAction` on `call`; failures are logged, never raised."""
    kind = getattr(action, "kind", "")
    try:
        if kind in END_KINDS:
            await call.end_call(getattr(action, "reason", None) or "agent", drain_s=drain_s)
        elif kind in TRANSFER_KINDS:
            target = getattr(action, "target", None)
            if not target:
                logger.warning("call %s: transfer_call without a target; ignored", call.call_sid)
                return
            await call.transfer_call(target, drain_s=drain_s)
        elif kind in DTMF_KINDS:
            digits = str(getattr(action, "target", None) or getattr(action, "params", {}).get("digits", ""))
            await call.send_dtmf(digits)
            logger.info("call %s: sent DTMF %s", call.call_sid, digits)
        else:
            logger.warning("call %s: unknown call action %r; ignored", call.call_sid, kind)
    except SipActionFailed as exc:
        logger.error("call %s: %s failed: %s", call.call_sid, kind, exc)


def bind_actions(call: SipCall, context: Any, *, grace_s: float = ACTION_GRACE_S) -> None:
    """Have `context.request_action(...)` (from any tool) act on `call` after `grace_s` (unless it ended)."""

    async def act(action: Any) -> None:
        if action.kind not in DTMF_KINDS:
            await asyncio.sleep(grace_s)
        if call.ended.is_set():
            logger.info("call %s: %s dropped, the call ended first", call.call_sid, action.kind)
            return
        await perform_action(call, action, drain_s=0.5)

    act_on_actions(context, act)


def record_sip_facts(call: SipCall, recorder: Any) -> None:
    """The call's record gets its direction, outcome and SIP status now, its RTP figures and how the dialog
    ended (`meta.bye`) just before it closes, however the call ends, and our BYE's outcome when it lands after
    that (`duetaspan.adapters.sip.records`)."""
    if recorder is None:
        return
    recorder.event("meta", **call_meta(call))
    quality = call.quality if call.quality is not None else RtpQuality(call.media)

    def closing() -> None:
        recorder.event("rtp", **quality.figures())
        bye = bye_meta(call)
        if bye is not None:
            recorder.event("meta", bye=bye)

    def signalled(method: str, outcome: str) -> None:  # our BYE answered (or given up) after the record closed
        if method == "BYE" and recorder.closed and outcome != PENDING:
            amend_meta(recorder, bye=bye_meta(call))

    recorder.before_close.append(closing)
    call.on_signalled.append(signalled)


def _detect_param(dial: Any) -> dict[str, str]:
    """`answer_detect` "1"/"0" when `agent.dial(..., detect=...)` said (`duetaspan.agent.answer`)."""
    detect = getattr(dial, "detect", None)
    return {} if detect is None else {"answer_detect": "1" if detect else "0"}


def agent_call_handler(agent: Any) -> SipCallHandler:
    """A `SipCallHandler` running `agent` (a `duetaspan.Agent`) on each call."""
    from duetaspan.pipeline.runner import EngineFull, RunnerStopped
    from duetaspan.pipeline.session import CallInfo as SessionCallInfo

    async def handle(call: SipCall) -> None:
        info = SessionCallInfo(
            call_id=call.call_sid,
            caller=call.info.caller or None,
            called=call.info.called or None,
            transport="sip",
            params={
                **call.info.params,
                "sip_source": call.info.source,
                "sip_transport": call.info.transport,
                "codec": call.media.codec,
                "direction": "outbound" if call.dial is not None else "inbound",
                **_detect_param(call.dial),
            },
        )
        session = agent.create_session(info, SipPipecatTransport(call))
        call.answer = getattr(getattr(session, "service", None), "answer", None)  # the campaign's outcome
        record_sip_facts(call, getattr(getattr(session, "service", None), "recorder", None))
        bind_actions(call, getattr(session, "context", None))
        try:
            await session.run()
        except EngineFull:
            logger.warning("call %s: no free engine slot; hanging up", call.call_sid)
            await call.end_call("no free slot", drain_s=0)
        except RunnerStopped as exc:
            logger.error("call %s: the engine is not running: %s", call.call_sid, exc)
            await call.end_call("engine unavailable", drain_s=0)

    return handle


__all__ = ["agent_call_handler", "bind_actions", "perform_action", "record_sip_facts"]
