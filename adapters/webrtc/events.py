"""What the page sees of a call, as data-channel messages, and the two Pipecat processors that produce them.

Every message is a JSON object with `"label": "duetaspan"` and a `type`:
    hello        the call id and what the page may do (force a `<ret>`)
    agent_text   a word piece of the agent's speech, sent in order with the agent's audio
    caller_text  a caller utterance, as the router's question capture transcribed it
    ret          the model asked for a Context Span
    span         a span landed: reference, tool, arguments, latency `<ret>` -> landed
    no_span, late_span, barge_in, retrieval   the other retrieval and turn events
    stats        server-side counters twice a second: caller audio received, agent audio sent, levels

`CallerEvents` sits right after the transport's input (it sees the caller's audio and, travelling upstream from
the model's service, the caller's transcribed utterances); `AgentEvents` sits right before the transport's
output (it sees the agent's audio, words and span frames). Both turn what they see into
`OutputTransportMessage(Urgent)Frame`s, which Pipecat's SmallWebRTC output sends over the data channel.

Example:
    >>> SpanEvent(reference="It is 3 PM in Tokyo.", tool="get_time", t=3.2).model_dump()["type"]
    'span'
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Literal

import numpy as np
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    Frame,
    InputAudioRawFrame,
    OutputAudioRawFrame,
    OutputTransportMessageFrame,
    OutputTransportMessageUrgentFrame,
    StartFrame,
    TranscriptionFrame,
    TTSTextFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pydantic import BaseModel, ConfigDict, Field

from duetaspan.pipeline.frames import (
    AgentBargedInFrame,
    LateSpanFrame,
    NoSpanFrame,
    RetFrame,
    RetrievalEventFrame,
    SpanFrame,
)

LABEL = "duetaspan"
SILENCE_DBFS = -120.0
SOUND_DBFS = -50.0  # frames louder than this count as "sound" (speech, music), quieter ones as silence


class PageEvent(BaseModel):
    """Base of every server -> page message."""

    model_config = ConfigDict(extra="forbid")
    label: Literal["duetaspan"] = LABEL
    type: str
    t: float | None = Field(None, description="call time in seconds, where the event has one")


class HelloEvent(PageEvent):
    type: Literal["hello"] = "hello"
    call_id: str
    force_ret: bool = False


class AgentTextEvent(PageEvent):
    type: Literal["agent_text"] = "agent_text"
    text: str


class CallerTextEvent(PageEvent):
    type: Literal["caller_text"] = "caller_text"
    text: str


class RetEvent(PageEvent):
    type: Literal["ret"] = "ret"
    frame_index: int


class SpanEvent(PageEvent):
    type: Literal["span"] = "span"
    reference: str
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    question: str | None = None
    latency_ms: float | None = None
    n_frames: int = 0
    prefill_ms: float = 0.0


class NoSpanEvent(PageEvent):
    type: Literal["no_span"] = "no_span"
    question: str | None = None
    reason: str = ""


class LateSpanEvent(PageEvent):
    type: Literal["late_span"] = "late_span"
    question: str | None = None
    reference: str | None = None
    seconds: float = 0.0
    stage: str | None = None


class BargeInEvent(PageEvent):
    type: Literal["barge_in"] = "barge_in"


class RetrievalEvent(PageEvent):
    type: Literal["retrieval"] = "retrieval"
    event: dict[str, Any]


class StatsEvent(PageEvent):
    type: Literal["stats"] = "stats"
    caller_frames: int = Field(description="audio frames received from the page")
    caller_seconds: float
    caller_dbfs: float = Field(description="loudest caller frame since the previous stats message")
    caller_sound_seconds: float = Field(description=f"caller audio louder than {SOUND_DBFS} dBFS so far")
    agent_seconds: float
    agent_dbfs: float


class PageCommand(BaseModel):
    """Page -> server messages (anything else on the data channel is ignored)."""

    model_config = ConfigDict(extra="ignore")
    label: Literal["duetaspan"]
    type: Literal["force_ret"]


def audio_dbfs(audio: bytes) -> float:
    """RMS level of int16 PCM in dBFS (`SILENCE_DBFS` for digital silence)."""
    pcm = np.frombuffer(audio, dtype="<i2").astype(np.float32) / 32768.0
    if pcm.size == 0:
        return SILENCE_DBFS
    rms = float(np.sqrt(np.mean(np.square(pcm))))
    return max(SILENCE_DBFS, 20.0 * math.log10(rms)) if rms > 0 else SILENCE_DBFS


class _Meter:
    """Seconds of audio seen and the loudest frame since the last read."""

    def __init__(self) -> None:
        self.frames = 0
        self.seconds = 0.0
        self.sound_seconds = 0.0
        self.peak = SILENCE_DBFS

    def add(self, audio: bytes, sample_rate: int, channels: int) -> None:
        seconds = len(audio) / 2 / max(1, channels) / sample_rate
        level = audio_dbfs(audio)
        self.frames += 1
        self.seconds += seconds
        if level > SOUND_DBFS:
            self.sound_seconds += seconds
        self.peak = max(self.peak, level)

    def take_peak(self) -> float:
        peak, self.peak = self.peak, SILENCE_DBFS
        return round(peak, 1)


def message_frame(event: PageEvent, *, urgent: bool = False) -> Frame:
    """The Pipecat frame that carries `event` to the page (urgent: ahead of queued audio)."""
    payload = event.model_dump(mode="json", exclude_none=True)
    return (
        OutputTransportMessageUrgentFrame(message=payload)
        if urgent
        else OutputTransportMessageFrame(message=payload)
    )


class AgentEvents(FrameProcessor):
    """Before the transport's output: the agent's words, spans and turn events become page messages.

    Words and spans are queued with the audio (they reach the page when the audio they belong to is played);
    barge-in is urgent.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.meter = _Meter()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
        if direction != FrameDirection.DOWNSTREAM:
            return
        event: PageEvent | None = None
        if isinstance(frame, OutputAudioRawFrame):
            self.meter.add(frame.audio, frame.sample_rate, frame.num_channels)
        elif isinstance(frame, TTSTextFrame):
            event = AgentTextEvent(text=frame.text)
        elif isinstance(frame, SpanFrame):
            event = SpanEvent(
                reference=frame.reference,
                tool=frame.tool,
                arguments=frame.arguments,
                question=frame.question,
                latency_ms=frame.latency_ms,
                n_frames=frame.n_frames,
                prefill_ms=round(frame.prefill_ms, 2),
                t=round(frame.t, 2),
            )
        elif isinstance(frame, RetFrame):
            event = RetEvent(frame_index=frame.frame_index, t=round(frame.t, 2))
        elif isinstance(frame, NoSpanFrame):
            event = NoSpanEvent(question=frame.question, reason=frame.reason, t=round(frame.t, 2))
        elif isinstance(frame, LateSpanFrame):
            event = LateSpanEvent(
                question=frame.question,
                reference=frame.reference,
                seconds=frame.seconds,
                stage=frame.stage,
                t=round(frame.t, 2),
            )
        elif isinstance(frame, RetrievalEventFrame):
            event = RetrievalEvent(event=frame.event)
        elif isinstance(frame, AgentBargedInFrame):
            await self.push_frame(message_frame(BargeInEvent(t=round(frame.t, 2)), urgent=True))
        if event is not None:
            await self.push_frame(message_frame(event))


class CallerEvents(FrameProcessor):
    """After the transport's input: caller audio counters, caller utterances and the periodic stats message.

    Args:
        agent_events: the call's `AgentEvents` (its meter feeds the stats message).
        stats_interval_s: how often `stats` goes to the page.
    """

    def __init__(self, agent_events: AgentEvents, *, stats_interval_s: float = 0.5, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.meter = _Meter()
        self._agent = agent_events
        self._interval = stats_interval_s
        self._stats_task: asyncio.Task | None = None

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TranscriptionFrame) and direction == FrameDirection.UPSTREAM:
            # the service sends caller utterances upstream; the page is downstream
            await self.push_frame(message_frame(CallerTextEvent(text=frame.text), urgent=True))
        elif isinstance(frame, InputAudioRawFrame) and direction == FrameDirection.DOWNSTREAM:
            self.meter.add(frame.audio, frame.sample_rate, frame.num_channels)
        await self.push_frame(frame, direction)
        if isinstance(frame, StartFrame) and self._stats_task is None:
            self._stats_task = self.create_task(self._send_stats(), f"{self}::stats")
        elif isinstance(frame, EndFrame | CancelFrame) and self._stats_task is not None:
            await self.cancel_task(self._stats_task)
            self._stats_task = None

    async def send(self, event: PageEvent) -> None:
        """Send an event to the page now (ahead of queued audio)."""
        await self.push_frame(message_frame(event, urgent=True))

    def stats(self) -> StatsEvent:
        return StatsEvent(
            caller_frames=self.meter.frames,
            caller_seconds=round(self.meter.seconds, 2),
            caller_dbfs=self.meter.take_peak(),
            caller_sound_seconds=round(self.meter.sound_seconds, 2),
            agent_seconds=round(self._agent.meter.seconds, 2),
            agent_dbfs=self._agent.meter.take_peak(),
        )

    async def _send_stats(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.send(self.stats())

    async def cleanup(self) -> None:
        await super().cleanup()
        if self._stats_task is not None:
            await self.cancel_task(self._stats_task)
            self._stats_task = None
