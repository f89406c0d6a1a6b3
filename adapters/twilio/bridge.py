"""Runs an agent on Twilio calls: each stream gets a `CallSession` over a `TwilioTransport`, and the call
actions the agent's tools request (`end_call`, `transfer_call`) are carried out on the live call through
Twilio's REST API; `send_dtmf` keys go in band, as tones in the stream's audio.

Example:
    >>> # service = TwilioService(settings, agent_call_handler(agent), max_calls=agent.max_calls)
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from duetaspan.adapters.twilio.audio import dtmf_tones
from duetaspan.adapters.twilio.errors import TwilioError
from duetaspan.adapters.twilio.outbound import dial_meta
from duetaspan.adapters.twilio.stream import CallHandler, TwilioCall
from duetaspan.adapters.twilio.transport import TwilioTransport
from duetaspan.registry.context import act_on_actions

logger = logging.getLogger("duetaspan.twilio")

AGENT_IN_RATE = 8000
# A tool's hang-up or transfer waits this long, so that the span carrying its confirmation ("Transferring you
# now") lands and the agent can say it before Twilio takes the call away; the call ending first cancels it.
ACTION_GRACE_S = 2.0
END_KINDS = frozenset({"end_call", "hang_up"})
TRANSFER_KINDS = frozenset({"transfer_call", "transfer"})
DTMF_KINDS = frozenset({"send_dtmf"})


async def perform_action(call: TwilioCall, action: Any, *, drain_s: float = 3.0) -> None:
    """Carry out one `duetaspan.registry.CallAction` on `call` after at most `drain_s` of queued agent audio;
    failures are logged, never raised."""
    kind = getattr(action, "kind", "")
    try:
        if kind in END_KINDS:
            await call.end_call(getattr(action, "reason", None) or "agent", drain_s=drain_s)
        elif kind in TRANSFER_KINDS:
            target = getattr(action, "target", None)
            if not target:
                logger.warning("call %s: transfer_call without a target; ignored", call.info.call_sid)
                return
            await call.transfer_call(target, drain_s=drain_s)
        elif kind in DTMF_KINDS:  # in-band tones in the stream's audio (no RFC 4733 on Media Streams)
            digits = str(getattr(action, "target", None) or "")
            call.send_audio(dtmf_tones(digits, call.sample_rate))
            logger.info("call %s: sent DTMF %s in band", call.info.call_sid, digits)
        else:
            logger.warning("call %s: unknown call action %r; ignored", call.info.call_sid, kind)
    except TwilioError as exc:
        logger.error("call %s: %s failed: %s", call.info.call_sid, kind, exc)


def bind_actions(call: TwilioCall, context: Any, *, grace_s: float = ACTION_GRACE_S) -> None:
    """Have `context.request_action(...)` (from any tool) act on `call` `grace_s` seconds after it is requested
    (unless the call has ended by then)."""

    async def act(action: Any) -> None:
        if action.kind not in DTMF_KINDS:  # keys are pressed at once; hang-ups and transfers wait
            await asyncio.sleep(grace_s)
        if call.ended.is_set():
            logger.info("call %s: %s dropped, the call ended first", call.info.call_sid, action.kind)
            return
        # the grace already let the agent speak: only a short drain, the model never stops producing frames
        await perform_action(call, action, drain_s=0.5)

    act_on_actions(context, act)


def _detect_param(dial: Any) -> dict[str, str]:
    """`answer_detect` "1"/"0" when `agent.dial(..., detect=...)` said (`duetaspan.agent.answer`)."""
    detect = getattr(dial, "detect", None)
    return {} if detect is None else {"answer_detect": "1" if detect else "0"}


def _call_params(call: Any) -> dict[str, Any]:
    """The session's `CallInfo.params`: the stream's custom parameters, then (a call this server placed) what
    `agent.dial(..., params=...)` gave, which the stream cannot override (a campaign's id, the row's `profile`)."""
    dial = getattr(call, "dial", None)
    return dict(call.info.custom_parameters) | dict(getattr(dial, "params", None) or {}) | _detect_param(dial)


def agent_call_handler(agent: Any) -> CallHandler:
    """A `CallHandler` running `agent` (a `duetaspan.Agent`) on each call.

    Serve it with `TwilioService(..., in_rate=AGENT_IN_RATE)`: the agent's service resamples the caller's
    8 kHz audio to 24 kHz itself, once, with its own low-latency resampler.
    """
    from duetaspan.pipeline.runner import EngineFull, RunnerStopped
    from duetaspan.pipeline.session import CallInfo as SessionCallInfo

    async def handle(call: TwilioCall) -> None:
        info = SessionCallInfo(
            call_id=call.info.call_sid,
            caller=call.info.from_number or None,
            called=call.info.to_number or None,
            transport="twilio",
            params=_call_params(call),
        )
        session = agent.create_session(info, TwilioTransport(call))
        call.answer = getattr(getattr(session, "service", None), "answer", None)  # the campaign's outcome
        recorder = getattr(getattr(session, "service", None), "recorder", None)
        if recorder is not None and (meta := dial_meta(call)) is not None:  # a call the server placed
            recorder.event("meta", **meta)
        bind_actions(call, getattr(session, "context", None))
        try:
            await session.run()
        except EngineFull:
            logger.warning("call %s: refused, the engine has no free slot", call.info.call_sid)
            await call.end_call("no free slot", drain_s=0)
        except RunnerStopped as exc:  # the engine is gone (EngineFailed, EngineCrashed: its process died)
            logger.error("call %s: refused, the engine is not running: %s", call.info.call_sid, exc)
            if getattr(exc, "crashed", False):
                await call.end_with_apology("engine unavailable")
            else:
                await call.end_call("engine unavailable", drain_s=0)
        else:
            if getattr(session.service, "engine_error", None) is not None:  # the engine went down under it
                await call.end_with_apology("engine error")

    return handle
