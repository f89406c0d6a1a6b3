"""One SIP call as the agent sees it: the dialog (`aiosipua.IncomingCall`), its media (`CallMedia`), how it
ended, and the call actions the agent's tools can take on it (BYE, REFER, RFC 4733 digits).

Example:
    >>> async def handler(call: SipCall) -> None:             # doctest: +SKIP
    ...     call.media.on_dtmf(print)
    ...     async for pcm in call.media.audio():              # int16, media.pcm_rate, 20 ms frames
    ...         call.media.send_audio(pcm.astype("float32") / 32768)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from duetaspan.adapters.sip.media import CallMedia

logger = logging.getLogger("duetaspan.sip")
PENDING = "pending"  # our request is out, its answer (or give-up at 64*T1) still to come


@dataclass(frozen=True)
class SipCallInfo:
    """Who called whom: the SIP Call-ID, the From and To URIs' user parts, the signalling source."""

    call_id: str
    caller: str
    called: str
    source: str
    transport: str = "udp"
    params: dict[str, Any] = field(default_factory=dict)  # a placed call's own (a campaign's id, its variables)


@dataclass
class SipCall:
    """A live SIP call. `ended` is set once, with `end_reason`, by whichever side ends it first. `confirmed`
    is set when the dialog is confirmed: the caller's ACK of our 200 arrived (inbound), or we ACKed the
    callee's 200 (a call we placed); no media should flow toward the peer before it. `signalling` keeps the
    outcome of our in-dialog requests (`{"BYE": "200"}`, `{"BYE": "no response"}`; `"pending"` from our BYE
    until its answer or give-up); `on_signalled` listeners hear each outcome as it lands, also after the call
    ended (the bridge writes our BYE's into the stored record: `duetaspan.adapters.sip.records.bye_meta`)."""

    info: SipCallInfo
    dialog: Any  # an `aiosipua.IncomingCall` (answered) or `OutgoingCall` (placed by `dial`)
    media: CallMedia
    in_rate: int = 0  # of the caller's audio frames (0: the codec's PCM rate, `media.pcm_rate`)
    end_reason: str = ""
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    confirmed: asyncio.Event = field(default_factory=asyncio.Event)
    signalling: dict[str, str] = field(default_factory=dict)
    started_at: float = field(default_factory=time.monotonic)
    ended_at: float | None = None  # monotonic, when `ended` was set
    on_hangup: Callable[[SipCall], object] | None = None  # the endpoint sends the BYE and forgets the dialog
    on_refer: Callable[[SipCall, str], Any] | None = None  # the endpoint sends the REFER (transfer)
    dial: Any = None  # a call we placed: its `duetaspan.adapters.sip.outbound.DialResult`
    answer: Any = None  # its `AnswerGate` when who answered is detected (a campaign's attempt outcome)
    quality: Any = None  # its `duetaspan.adapters.sip.records.RtpQuality` (RTP/RTCP figures) once it runs
    bye_sent_at: float | None = None  # monotonic, when our BYE went out
    on_signalled: list[Callable[[str, str], object]] = field(default_factory=list)  # (method, outcome)
    details: dict[str, str] = field(default_factory=dict)  # e.g. {"BYE": "no answer in 32 s"}
    bye_after_s: float | None = None  # from our BYE to its answer (or give-up)

    def __post_init__(self) -> None:
        self.in_rate = self.in_rate or self.media.pcm_rate
        if getattr(self.dialog, "acked", True):  # an inbound dialog says when its ACK came; ours are ACKed
            self.confirmed.set()

    @property
    def call_sid(self) -> str:
        return self.info.call_id

    def bye_sent(self) -> None:
        """Our BYE went out: its outcome is pending until `signalled("BYE", ...)`."""
        self.bye_sent_at = time.monotonic()
        self.signalling["BYE"] = PENDING

    def signalled(self, method: str, outcome: str, detail: str | None = None) -> None:
        """The outcome of our in-dialog `method` (its final status, or `no response`): kept, and told to the
        `on_signalled` listeners (a listener that fails is logged)."""
        self.signalling[method] = outcome
        if method == "BYE" and self.bye_sent_at is not None:
            self.bye_after_s = round(time.monotonic() - self.bye_sent_at, 3)
        if detail:
            self.details[method] = detail
        for listener in list(self.on_signalled):
            try:
                listener(method, outcome)
            except Exception:
                logger.exception("call %s: a signalling listener failed", self.info.call_id)

    def _end(self, reason: str) -> None:
        """Mark the call over (the media loop ends, the pipeline ends); idempotent."""
        if self.ended.is_set():
            return
        self.end_reason, self.ended_at = reason, time.monotonic()
        self.ended.set()
        self.media.end_input()  # the endpoint closes the RTP session once the handler is done

    async def end_call(self, reason: str = "agent", drain_s: float = 3.0) -> None:
        """Hang up from our side: let queued agent audio play (up to `drain_s`), then BYE."""
        if self.ended.is_set():
            return
        await self.media.drain(drain_s)
        logger.info("call %s: end_call (%s): BYE", self.info.call_id, reason)
        if self.on_hangup is not None:
            self.on_hangup(self)
        self._end(f"end_call: {reason}")

    async def transfer_call(self, target: str, drain_s: float = 3.0) -> None:
        """Blind transfer: REFER the caller to `target` (raises `SipActionFailed` when the peer refuses)."""
        await self.media.drain(drain_s)
        if self.on_refer is None:
            raise SipActionFailed("transfer_call: this endpoint cannot send REFER")
        await self.on_refer(self, target)
        self._end(f"transferred to {target}")

    async def send_dtmf(self, digits: str, duration_ms: int = 160, gap_ms: int = 90) -> None:
        """Press `digits` as RFC 4733 events, one after the other, paced in real time (each `duration_ms`, the
        marker bit on its first packet, then `gap_ms`: `CallMedia.send_dtmf_paced`)."""
        for digit in digits:
            if self.ended.is_set():
                return
            await self.media.send_dtmf_paced(digit, duration_ms)
            await asyncio.sleep(gap_ms / 1000)


class SipActionFailed(RuntimeError):
    """A call action (REFER, BYE) the peer refused or never answered."""


__all__ = ["PENDING", "SipActionFailed", "SipCall", "SipCallInfo"]
