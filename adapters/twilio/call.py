"""One Twilio call as the agent sees it (`TwilioCall`) and its outbound pacing.

The agent's PCM given to `send_audio` is encoded to mu-law, cut into 20 ms chunks with playout marks between
them, and sent by the pacer (`TwilioCall._pace`) as `media` messages at real time, so Twilio's buffer stays
short and `clear` is effective. Also here: the stream's limits and timings (`StreamLimits`), who is on the
call (`CallInfo`), the REST actions bound by the server (`CallControl`) and the stream's counters.
The protocol loop that creates the call and feeds it lives in `duetaspan.adapters.twilio.stream`.

Example:
    >>> async def echo(call: TwilioCall) -> None:    # a call handler: repeat what the caller says
    ...     async for pcm in call.audio():
    ...         call.send_audio(pcm)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from duetaspan.adapters.twilio.audio import CHUNK_BYTES, CHUNK_MS, MulawEncoder
from duetaspan.adapters.twilio.errors import CLOSE_NORMAL, TwilioConfigError
from duetaspan.adapters.twilio.messages import clear_message, mark_message, media_message
from duetaspan.adapters.twilio.sockets import StreamSocket
from duetaspan.model.convention import SAMPLE_RATE

logger = logging.getLogger("duetaspan.twilio")


class StreamLimits(BaseModel):
    """Limits and timings of one stream socket (hostile-input defences and pacing)."""

    max_message_bytes: int = Field(16_384, gt=0, description="largest accepted WebSocket message")
    max_media_bytes: int = Field(1600, gt=0, description="largest mu-law payload in one media (200 ms)")
    start_timeout_s: float = Field(5.0, gt=0, description="time for `connected` + `start` after upgrade")
    inbound_queue_chunks: int = Field(250, gt=0, description="inbound chunks buffered before dropping (5 s)")
    lead_ms: int = Field(40, ge=0, description="audio sent ahead of real time as Twilio's jitter buffer")
    mark_interval_ms: int = Field(1000, ge=0, description="send a playout mark every N ms of audio; 0: never")
    handler_grace_s: float = Field(10.0, gt=0, description="time the handler gets to finish after the end")


@dataclass(frozen=True)
class CallInfo:
    """Who is on the call, from the stream's `start` (numbers from the webhook that minted the token)."""

    call_sid: str
    stream_sid: str
    account_sid: str
    from_number: str
    to_number: str
    custom_parameters: dict[str, str]


@dataclass(frozen=True)
class CallControl:
    """Call actions carried out outside the stream (Twilio's REST API), bound by the server."""

    hang_up: Callable[[str], Awaitable[object]]  # (call_sid)
    transfer: Callable[[str, str], Awaitable[object]]  # (call_sid, to)
    apologize: Callable[[str], Awaitable[object]] | None = None  # (call_sid): say sorry, then hang up


@dataclass
class StreamStats:
    """Counters of one stream, for tests, logs and the benchmark."""

    media_in: int = 0
    media_out: int = 0
    bytes_out: int = 0
    dropped_in: int = 0
    marks_sent: int = 0
    marks_played: int = 0
    clears: int = 0
    dtmf: int = 0
    first_media_out_at: float | None = None
    last_media_out_at: float | None = None


@dataclass
class TwilioCall:
    """One live call as the agent sees it. Created by `run_stream` after a valid `start`.

    Example:
        >>> async def handler(call: TwilioCall) -> None:
        ...     call.on_dtmf(lambda digit: print("caller pressed", digit))
        ...     async for pcm in call.audio():       # float32, 24 kHz, ~20 ms per item
        ...         call.send_audio(np.zeros_like(pcm))
    """

    info: CallInfo
    limits: StreamLimits
    socket: StreamSocket
    sample_rate: int = SAMPLE_RATE  # of the agent's audio given to `send_audio`
    in_rate: int = SAMPLE_RATE  # of the caller's audio yielded by `audio()` (8000: mu-law decoded only)
    control: CallControl | None = None
    stats: StreamStats = field(default_factory=StreamStats)
    dtmf_digits: list[str] = field(default_factory=list)
    played_ms: int = 0  # outbound audio Twilio has confirmed playing (last echoed mark)
    end_reason: str = ""
    dial: Any = None  # a call the server placed: its `duetaspan.adapters.twilio.outbound.TwilioDialResult`
    answer: Any = None  # its `AnswerGate` when who answered is detected (a campaign's attempt outcome)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    _inbound: asyncio.Queue[np.ndarray | None] = field(init=False)
    _outbound: deque[bytes | str] = field(default_factory=deque)  # mu-law chunks and mark names, in order
    _pending: bytearray = field(default_factory=bytearray)  # encoded bytes short of a 20 ms chunk
    _out_ready: asyncio.Event = field(default_factory=asyncio.Event)
    _drained: asyncio.Event = field(default_factory=asyncio.Event)
    _queued_ms: int = 0  # outbound audio position (ms) of everything handed to send_audio
    _next_mark_ms: int = 0
    _marks: dict[str, int] = field(default_factory=dict)  # sent, not yet echoed: name -> position ms
    _dtmf_listeners: list[Callable[[str], object]] = field(default_factory=list)
    _encoder: MulawEncoder = field(init=False)

    def __post_init__(self) -> None:
        self._inbound = asyncio.Queue(maxsize=self.limits.inbound_queue_chunks)
        self._encoder = MulawEncoder(self.sample_rate)
        self._next_mark_ms = self.limits.mark_interval_ms

    # --- what the agent side calls -------------------------------------------------------------------
    async def audio(self) -> AsyncIterator[np.ndarray]:
        """The caller's audio as float32 PCM at `sample_rate`, until the call ends."""
        while True:
            item = await self._inbound.get()
            if item is None:
                return
            yield item

    def send_audio(self, pcm: np.ndarray) -> None:
        """Queue agent audio (float32 at `sample_rate`); the pacer sends it as 20 ms media messages."""
        if self.ended.is_set():
            return
        self._pending += self._encoder.encode(pcm)
        while len(self._pending) >= CHUNK_BYTES:
            self._outbound.append(bytes(self._pending[:CHUNK_BYTES]))
            del self._pending[:CHUNK_BYTES]
            self._queued_ms += CHUNK_MS
            if self.limits.mark_interval_ms and self._queued_ms >= self._next_mark_ms:
                self._outbound.append(f"a{self._queued_ms}")
                self._next_mark_ms += self.limits.mark_interval_ms
        self._drained.clear()
        self._out_ready.set()

    def set_output_rate(self, rate: int) -> None:
        """Change the rate of the audio given to `send_audio` (rebuilds the encoder; call between utterances)."""
        if rate != self.sample_rate:
            self.sample_rate = rate
            self._encoder = MulawEncoder(rate)

    def mark(self, name: str) -> None:
        """Queue a named mark after the audio queued so far; Twilio echoes it once that audio has played."""
        if not self.ended.is_set():
            self._outbound.append(name)
            self._out_ready.set()

    async def clear(self) -> int:
        """Barge-in: drop agent audio not yet played, here and in Twilio's buffer. Returns the ms dropped."""
        dropped_ms = sum(CHUNK_MS for item in self._outbound if isinstance(item, bytes))
        self._outbound.clear()
        self._drained.set()
        self._pending.clear()
        self._encoder.reset()
        self.stats.clears += 1
        if not self.ended.is_set():
            await self.socket.send_text(clear_message(self.info.stream_sid))
        logger.info("call %s: clear (dropped %d ms queued here)", self.info.call_sid, dropped_ms)
        return dropped_ms

    async def end_call(self, reason: str = "agent", drain_s: float = 3.0) -> None:
        """Hang up: let queued agent audio play (up to `drain_s`), hang up through REST, close the stream."""
        await self.drain(drain_s)
        if self.control is not None and not self.ended.is_set():
            await self.control.hang_up(self.info.call_sid)
        logger.info("call %s: end_call (%s)", self.info.call_sid, reason)
        self._end(f"end_call: {reason}")
        await self.socket.close(CLOSE_NORMAL, "call ended")

    async def end_with_apology(self, reason: str) -> None:
        """The agent cannot go on (its engine went down): the caller hears an apology (REST: the call's TwiML
        becomes `<Say>` + `<Hangup>`), then the stream closes. Without REST control the stream just closes."""
        if self.control is not None and self.control.apologize is not None and not self.ended.is_set():
            try:
                await self.control.apologize(self.info.call_sid)
            except Exception as exc:  # the stream still closes: Twilio then ends the call
                logger.error("call %s: the apology failed: %s", self.info.call_sid, exc)
        logger.warning("call %s: ended with an apology (%s)", self.info.call_sid, reason)
        self._end(f"apology: {reason}")
        await self.socket.close(CLOSE_NORMAL, "call ended")

    async def transfer_call(self, to: str, drain_s: float = 3.0) -> None:
        """Hand the caller to `to` through REST (`<Dial>`); the agent's stream ends."""
        if self.control is None:
            raise TwilioConfigError(
                "transfer_call needs Twilio REST credentials (TWILIO_ACCOUNT_SID/AUTH_TOKEN)"
            )
        await self.drain(drain_s)
        await self.control.transfer(self.info.call_sid, to)
        self._end(f"transferred to {to}")
        await self.socket.close(CLOSE_NORMAL, "call transferred")

    async def drain(self, timeout_s: float) -> None:
        """Wait until queued agent audio has been sent (or `timeout_s`)."""
        if self._outbound and not self.ended.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), timeout_s)

    def on_dtmf(self, listener: Callable[[str], object]) -> None:
        """Call `listener(digit)` for every key the caller presses."""
        self._dtmf_listeners.append(listener)

    @property
    def queued_ms(self) -> int:
        """Agent audio queued here and not yet sent to Twilio."""
        return sum(CHUNK_MS for item in self._outbound if isinstance(item, bytes))

    @property
    def pending_marks(self) -> dict[str, int]:
        """Marks sent to Twilio and not yet echoed (name -> outbound position in ms)."""
        return dict(self._marks)

    # --- what the stream loop calls ------------------------------------------------------------------
    def _push_inbound(self, pcm: np.ndarray) -> None:
        if pcm.size == 0:
            return
        if self._inbound.full():  # the agent fell behind: keep the newest audio, the call is live
            self._inbound.get_nowait()
            self.stats.dropped_in += 1
        self._inbound.put_nowait(pcm)

    def _dtmf(self, digit: str) -> None:
        self.dtmf_digits.append(digit)
        self.stats.dtmf += 1
        for listener in self._dtmf_listeners:
            try:
                listener(digit)
            except Exception:
                logger.exception("call %s: DTMF listener failed", self.info.call_sid)

    def _mark_played(self, name: str) -> None:
        position = self._marks.pop(name, None)
        if position is None:
            logger.debug("call %s: mark %r echoed but never sent (ignored)", self.info.call_sid, name[:40])
            return
        self.stats.marks_played += 1
        self.played_ms = max(self.played_ms, position)

    def _end(self, reason: str) -> None:
        if self.ended.is_set():
            return
        self.end_reason = reason
        self.ended.set()
        self._out_ready.set()
        self._drained.set()
        with contextlib.suppress(asyncio.QueueFull):
            if self._inbound.full():
                self._inbound.get_nowait()
            self._inbound.put_nowait(None)

    async def _pace(self) -> None:
        """Send queued chunks at real time: one 20 ms media message per 20 ms, marks in between.

        After an underrun the clock restarts `lead_ms` in the past, so Twilio gets that much audio at once
        as a jitter buffer; from then on exactly one chunk per period.
        """
        period = CHUNK_MS / 1000.0
        lead = self.limits.lead_ms / 1000.0
        sent_ms = 0
        next_at = 0.0
        while not self.ended.is_set():
            if not self._outbound:
                self._drained.set()
                self._out_ready.clear()
                await self._out_ready.wait()
                continue
            item = self._outbound.popleft()
            if isinstance(item, str):
                self._marks[item] = sent_ms
                self.stats.marks_sent += 1
                await self.socket.send_text(mark_message(self.info.stream_sid, item))
                continue
            now = time.monotonic()
            if next_at < now - lead - period:  # underrun (or first chunk): restart the clock
                next_at = now - lead
            if next_at > now:
                await asyncio.sleep(next_at - now)
                if self.ended.is_set():
                    return
            await self.socket.send_text(media_message(self.info.stream_sid, item))
            now = time.monotonic()
            self.stats.media_out += 1
            self.stats.bytes_out += len(item)
            self.stats.first_media_out_at = self.stats.first_media_out_at or now
            self.stats.last_media_out_at = now
            sent_ms += CHUNK_MS
            next_at += period


__all__ = ["CallControl", "CallInfo", "StreamLimits", "StreamStats", "TwilioCall"]
