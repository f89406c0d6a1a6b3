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
    """A live SIP call. `ended` is set once, with `end_reason`, by whichever side ends it first."""

    info: SipCallInfo
    dialog: Any  # an `aiosipua.IncomingCall` (answered) or `OutgoingCall` (placed by `dial`)
    media: CallMedia
    in_rate: int = 0  # of the caller's audio frames (0: the codec's PCM rate, `media.pcm_rate`)
    end_reason: str = ""
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    started_at: float = field(default_factory=time.monotonic)
    on_hangup: Callable[[SipCall], object] | None = None  # the endpoint sends the BYE and forgets the dialog
    on_refer: Callable[[SipCall, str], Any] | None = None  # the endpoint sends the REFER (transfer)
    dial: Any = None  # a call we placed: its `duetaspan.adapters.sip.outbound.DialResult`
    quality: Any = None  # its `duetaspan.adapters.sip.records.RtpQuality` (RTP/RTCP figures) once it runs

    def __post_init__(self) -> None:
        self.in_rate = self.in_rate or self.media.pcm_rate

    @property
    def call_sid(self) -> str:
        return self.info.call_id

    def _end(self, reason: str) -> None:
        """Mark the call over (the media loop ends, the pipeline ends); idempotent."""
        if self.ended.is_set():
            return
        self.end_reason = reason
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
        """Press `digits` as RFC 4733 events, one after the other (each `duration_ms`, then `gap_ms`)."""
        for digit in digits:
            if self.ended.is_set():
                return
            self.media.send_dtmf(digit, duration_ms)
            await asyncio.sleep((duration_ms + gap_ms) / 1000)


class SipActionFailed(RuntimeError):
    """A call action (REFER, BYE) the peer refused or never answered."""


__all__ = ["SipActionFailed", "SipCall", "SipCallInfo"]
