"""Outbound Twilio calls placed by the server (`await agent.dial("+15551234567")`, `POST /admin/dial`).

The server reserves a call slot and mints a single-use stream token first, then asks Twilio's REST API
(`calls.create`) to dial the number with inline TwiML: `<Connect><Stream url="wss://PUBLIC/twilio/stream/
TOKEN">`, our own signed stream URL, so no webhook round trip is needed when the callee answers. Twilio
answers `calls.create` with the CallSid; the token and the slot are then bound to it. The dial's outcome:

| outcome | when | `twilio_status` |
|---|---|---|
| `answered` | the call's Media Stream sent `start` (the call then runs on the agent, record `direction: "outbound"`) | `in-progress` |
| `busy` | the status callback says `busy` | `busy` |
| `no-answer` | the status callback says `no-answer` or `canceled`, or nothing was decided in the ring timeout plus `ANSWER_MARGIN_S` (the call is then cancelled) | the status |
| `failed` | `calls.create` was refused (an unverified number, bad credentials, Twilio unreachable), no free slot, `failed`, or `completed` before any stream | the status, or None |

A dial that is cancelled (a campaign's scheduler gives up on it, the server stops) leaves no call behind: a
ringing one is cancelled through REST (its slot freed, its stream token revoked), an answered one hung up.

Every outcome goes to `dialer.on_dial(result)` (under `serve`: `duetaspan_twilio_dial_total{outcome}` and, for
calls never answered, a record of their own). Twilio's status callbacks come to `POST /twilio/status`
(signed), where `TwilioService` hands them to `TwilioDialer.status`.

Example:
    >>> # result = await service.dialer.dial("+15551234567", caller="+15557654321", ring_timeout_s=30)
    >>> # result.outcome, result.call_id   # ('answered', 'CA...') / ('busy', 'CA...')
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from duetaspan.adapters.twilio import twiml
from duetaspan.adapters.twilio.errors import TwilioRestError
from duetaspan.pipeline.admission import Refusal

if TYPE_CHECKING:
    from duetaspan.adapters.twilio.stream import TwilioCall

logger = logging.getLogger("duetaspan.twilio")

E164 = re.compile(r"^\+[1-9]\d{6,14}$")
OUTCOMES = ("answered", "busy", "no-answer", "failed")
DEFAULT_RING_S = 30.0
ANSWER_MARGIN_S = 15.0  # past Twilio's own ring timeout: a status callback lost on the way
STREAM_MARGIN_S = 30.0  # the token waits the ring time plus this for the stream's upgrade
_TERMINAL = {"busy": "busy", "no-answer": "no-answer", "canceled": "no-answer", "failed": "failed",
             "completed": "failed"}  # fmt: skip


@dataclass(frozen=True)
class TwilioDialResult:
    """How a placed Twilio call went (see the module docstring); `call` is the live `TwilioCall` when answered."""

    outcome: str
    to: str
    call_id: str = ""
    status: str | None = None
    reason: str = ""
    caller: str = ""
    ring_s: float = 0.0
    call: Any = None
    detect: bool | None = None  # answer detection asked for by `agent.dial(..., detect=...)` (None: [outbound])
    # `agent.dial(..., params=...)`: the answered call's `CallInfo.params` (a campaign's id, the row's variables as
    # `profile`); kept in this process, never sent to Twilio, and not in `summary()` (the record's `dial` field)
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def uri(self) -> str:
        return self.to

    def summary(self) -> dict[str, Any]:
        """The result as JSON (the admin endpoint's answer; the record's `dial` field)."""
        return {"outcome": self.outcome, "to": self.to, "call_id": self.call_id, "twilio_status": self.status,
                "reason": self.reason, "from": self.caller, "ring_s": round(self.ring_s, 3),
                "transport": "twilio"}  # fmt: skip


@dataclass
class _Pending:
    to: str
    caller: str
    token: str
    started_at: float
    decided: asyncio.Future[TwilioDialResult]
    status: str | None = None
    detect: bool | None = None
    params: dict[str, Any] = field(default_factory=dict)


class TwilioDialer:
    """Places calls for one `TwilioService` and learns their outcome from its stream and status routes."""

    def __init__(self, service: Any) -> None:  # a `TwilioService` (which imports this module)
        self.service = service
        self.pending: dict[str, _Pending] = {}  # CallSid -> a call we placed, not yet decided
        self.on_dial: Callable[[TwilioDialResult], None] = lambda result: None
        self.answer_margin_s = ANSWER_MARGIN_S

    async def dial(
        self, to: str, *, caller: str | None = None, ring_timeout_s: float | None = None, detect: bool | None = None,
        params: dict[str, Any] | None = None,
    ) -> TwilioDialResult:
        """Place the call and wait for its outcome (the module docstring); `on_dial` hears every outcome.
        `params` go to the answered call's `CallInfo.params` (server-side: Twilio never sees them)."""
        s = self.service.settings
        caller = caller or s.phone_number or ""
        for what, number in (("to", to), ("from", caller)):
            if not E164.match(number):
                hint = " (or set [twilio] phone_number)" if what == "from" and not number else ""
                raise ValueError(f"{what} {number!r}: an E.164 phone number like +15551234567 is needed{hint}")
        ring = float(ring_timeout_s if ring_timeout_s is not None else DEFAULT_RING_S)
        loop = asyncio.get_running_loop()
        started = loop.time()
        result = await self._place(to, caller, ring, detect, dict(params or {}))
        result = replace(result, ring_s=loop.time() - started) if result.outcome != "answered" else result
        try:
            self.on_dial(result)
        except Exception:
            logger.exception("call %s: recording the dial outcome failed", result.call_id)
        return result

    async def _place(
        self, to: str, caller: str, ring: float, detect: bool | None, params: dict[str, Any]
    ) -> TwilioDialResult:
        service, s = self.service, self.service.settings
        failed = lambda reason, sid="", status=None: TwilioDialResult(  # noqa: E731
            "failed", to, sid, status, reason, caller
        )
        placeholder = f"dial-{uuid.uuid4().hex}"
        hold_s = ring + ANSWER_MARGIN_S + STREAM_MARGIN_S
        slot = service.admission.try_acquire("twilio", placeholder, ttl_s=hold_s)
        if isinstance(slot, Refusal):
            return failed(f"no free slot ({slot.reason})")
        grant = service.tokens.issue(call_sid=placeholder, account_sid=s.credentials.account_sid,
                                     from_number=caller, to_number=to, ttl_s=ring + STREAM_MARGIN_S)  # fmt: skip
        parameters = {"from_number": caller, "to_number": to, "direction": "outbound-api"}
        status_url = s.status_url if s.stream_status_callbacks else None
        body = twiml.connect_stream(s.stream_url(grant.token), parameters, status_url)
        try:
            sid = await service.rest.place_call(
                to, caller, twiml=body, status_callback=s.status_url, timeout_s=max(1, round(ring))
            )
        except (TwilioRestError, asyncio.CancelledError) as exc:  # cancelled: a call placed meanwhile gets no stream
            slot.release()
            service.tokens.revoke(grant.token)
            if isinstance(exc, asyncio.CancelledError):
                raise
            logger.warning("dialling %s: %s", to, exc)
            return failed(str(exc))
        # no await between: the placeholder's slot and token become the CallSid's at once
        slot.release()
        held = service.admission.try_acquire("twilio", sid, ttl_s=hold_s)
        service.tokens.rebind(grant.token, sid)
        loop = asyncio.get_running_loop()
        pending = _Pending(to, caller, grant.token, loop.time(), loop.create_future(), detect=detect, params=params)
        self.pending[sid] = pending
        if isinstance(held, Refusal):  # cannot happen without an await; kept for a clear outcome
            return self._decide(sid, failed(f"no free slot ({held.reason})", sid))
        logger.info("call %s: dialling %s from %s (ring %.0f s)", sid, to, caller, ring)
        try:
            try:
                return await asyncio.wait_for(asyncio.shield(pending.decided), ring + self.answer_margin_s)
            except TimeoutError:
                logger.warning("call %s to %s: no outcome in %.1f s; cancelling", sid, to, ring + self.answer_margin_s)
                await self._cancel(sid)
                if pending.decided.done():  # the stream started while we cancelled
                    return pending.decided.result()
                return self._decide(sid, TwilioDialResult("no-answer", to, sid, pending.status,
                                                          f"no answer in {ring:.0f} s (cancelled)", caller))  # fmt: skip
        except asyncio.CancelledError:
            await asyncio.shield(self._withdraw(sid, pending))
            raise
        finally:
            self.pending.pop(sid, None)

    async def _cancel(self, sid: str) -> None:
        try:
            await self.service.rest.cancel(sid)
        except TwilioRestError as exc:
            logger.warning("call %s: %s", sid, exc)

    async def _withdraw(self, sid: str, pending: _Pending) -> None:
        """The dial was cancelled (a campaign gave up on it, the server stops): its call must not go on. An
        answered one is hung up; one still ringing is decided `no-answer` (its slot freed and its stream token
        revoked, so a late answer gets no stream) and cancelled through the REST API."""
        if pending.decided.done():
            call = pending.decided.result().call
            if call is not None and not call.ended.is_set():
                logger.info("call %s: dial given up after its answer: hanging up", sid)
                try:
                    await call.end_call("dial given up", drain_s=0.0)
                except Exception as exc:  # the REST hang-up failed: closing its stream ends the call (no TwiML after)
                    logger.warning("call %s: hanging up: %s; closing its stream", sid, exc)
                    call._end("dial given up")
                    with contextlib.suppress(Exception):
                        await call.socket.close(1000, "dial given up")
            return
        self._decide(sid, TwilioDialResult("no-answer", pending.to, sid, pending.status,
                                           "dial given up before an answer (cancelled)", pending.caller))  # fmt: skip
        logger.info("call %s: dial given up while it rang: cancelling", sid)
        await self._cancel(sid)

    def _decide(self, sid: str, result: TwilioDialResult) -> TwilioDialResult:
        pending = self.pending.get(sid)
        if pending is None or pending.decided.done():
            return result
        if result.outcome != "answered":
            self.service.tokens.revoke(pending.token)
            slot = self.service.admission.get(sid)
            if slot is not None:
                slot.release()
        pending.decided.set_result(result)
        return result

    def started(self, call: TwilioCall) -> None:
        """The stream of a call we placed sent `start`: answered (the call's `dial` says how it was placed)."""
        sid = call.info.call_sid
        pending = self.pending.get(sid)
        if pending is None:
            return
        ring_s = asyncio.get_running_loop().time() - pending.started_at
        result = TwilioDialResult("answered", pending.to, sid, "in-progress", "answered", pending.caller,
                                  ring_s, call, pending.detect, pending.params)  # fmt: skip
        call.dial = result
        self._decide(sid, result)

    def status(self, sid: str, status: str) -> None:
        """A status callback for `sid`: a final status before the stream started decides the dial."""
        pending = self.pending.get(sid)
        if pending is None:
            return
        pending.status = status or pending.status
        outcome = _TERMINAL.get(status)
        if outcome is not None:
            reason = {"completed": "ended before its media stream started"}.get(status, status)
            self._decide(sid, TwilioDialResult(outcome, pending.to, sid, status, reason, pending.caller))


def dial_meta(call: Any) -> dict[str, Any] | None:
    """The record's `meta` fields of a Twilio call we placed (None for an inbound call)."""
    dial = getattr(call, "dial", None)
    if dial is None:
        return None
    return {"direction": "outbound", "outcome": dial.outcome, "twilio_status": dial.status, "dial": dial.summary()}


def write_dial_record(record_dir: str | Path, result: TwilioDialResult) -> dict[str, Any]:
    """The record of a placed Twilio call that was never answered: no audio, no frames."""
    from duetaspan.pipeline.artifacts import CallRecorder

    call_id = result.call_id or f"dial-{uuid.uuid4().hex}"
    meta = {"caller": result.caller, "called": result.to, "transport": "twilio", "direction": "outbound",
            "outcome": result.outcome, "twilio_status": result.status, "dial": result.summary()}  # fmt: skip
    return CallRecorder(record_dir, call_id, meta=meta, audio=False).close(ended_by=result.outcome)


__all__ = ["E164", "OUTCOMES", "TwilioDialResult", "TwilioDialer", "dial_meta", "write_dial_record"]
