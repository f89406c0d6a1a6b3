"""What the telephone transports (Twilio Media Streams, SIP) share: a Pipecat transport over one call, so an
agent pipeline runs `transport.input() -> DuetaSpanService -> transport.output()` on it.

Input pushes the caller's audio as `InputAudioRawFrame`s (int16 at the call's own rate: the service
resamples to 24 kHz itself, once) and keypresses as `InputDTMFFrame`s; when the call's audio ends it fires
`on_client_disconnected` and asks the pipeline to end gracefully (`EndWorkerFrame` upstream), so the service
closes its slot and writes the call's artifacts. Output hands each `OutputAudioRawFrame` to the call (mono
float) and turns an `InterruptionFrame` (barge-in) into the call's own way of dropping queued audio; the
bot-speaking state is `BotSpeechOutput`'s. A transport subclasses the three classes with the few hooks
that differ (where audio, digits and the end reason come from; how audio is sent and dropped).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar

import numpy as np
from pipecat.audio.dtmf.types import KeypadEntry
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    EndWorkerFrame,
    Frame,
    InputAudioRawFrame,
    InputDTMFFrame,
    InterruptionFrame,
    OutputAudioRawFrame,
    StartFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.transports.base_transport import BaseTransport

from duetaspan.pipeline.bot_speech import BotSpeechOutput
from duetaspan.pipeline.frames import CallEndedByFrame


class PhoneInput(FrameProcessor):
    """Caller audio and DTMF from the call into the pipeline. Hooks: `audio`, `listen_dtmf`, `in_rate`,
    `end_reason`, `ended_by`."""

    task_name: ClassVar[str] = "phone-input"

    def __init__(self, transport: PhoneTransport, call: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._transport = transport
        self._call = call
        self._pump: asyncio.Task[None] | None = None
        self._digits: asyncio.Queue[str] = asyncio.Queue()
        self.listen_dtmf(self._digits.put_nowait)

    def audio(self) -> AsyncIterator[np.ndarray]:
        raise NotImplementedError

    def listen_dtmf(self, listener: Callable[[str], object]) -> None:
        raise NotImplementedError

    @property
    def in_rate(self) -> int:
        return int(self._call.in_rate)

    def end_reason(self) -> str:
        return str(self._call.end_reason)

    def ended_by(self) -> str | None:
        """The record's `ended_by` when the call ended for a reason of the transport's own (None: a hang-up)."""
        return None

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
        if isinstance(frame, StartFrame) and self._pump is None:
            self._pump = self.create_task(self._run(), name=self.task_name)
        elif isinstance(frame, EndFrame | CancelFrame) and self._pump is not None:
            await self.cancel_task(self._pump)
            self._pump = None

    async def _run(self) -> None:
        await self._transport.fire("on_client_connected")
        keys = asyncio.ensure_future(self._forward_dtmf())
        try:
            async for pcm in self.audio():
                audio = pcm.tobytes() if pcm.dtype == np.int16 else _to_int16_bytes(pcm)
                await self.push_frame(InputAudioRawFrame(audio=audio, sample_rate=self.in_rate, num_channels=1))
        finally:
            keys.cancel()
        reason, ended_by = self.end_reason(), self.ended_by()
        self._transport.logger.info("call %s: ended (%s); ending its pipeline", self._transport.call_id, reason)
        if ended_by:
            await self.push_frame(CallEndedByFrame(ended_by=ended_by))
        await self._transport.fire("on_client_disconnected")
        await self.push_frame(EndWorkerFrame(reason=reason), FrameDirection.UPSTREAM)

    async def _forward_dtmf(self) -> None:
        while True:
            digit = await self._digits.get()
            await self.push_frame(InputDTMFFrame(button=KeypadEntry(digit)))


class PhoneOutput(BotSpeechOutput):
    """Agent audio from the pipeline to the call; barge-in drops what the call has queued. Hooks: `send`,
    `drop_queued`."""

    def __init__(self, transport: PhoneTransport, call: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._transport = transport
        self._call = call

    def send(self, pcm: np.ndarray, rate: int) -> None:
        raise NotImplementedError

    async def drop_queued(self) -> None:
        raise NotImplementedError

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, OutputAudioRawFrame) and direction == FrameDirection.DOWNSTREAM:
            pcm = np.frombuffer(frame.audio, dtype="<i2").astype(np.float32) / 32768.0
            if frame.num_channels > 1:
                pcm = pcm.reshape(-1, frame.num_channels).mean(axis=1)
            self.send(pcm, frame.sample_rate)
            await self.push_frame(frame, direction)
            await self._track_speech(pcm, frame.sample_rate)
            return
        if isinstance(frame, InterruptionFrame):
            await self.drop_queued()
            await self._bot_stopped()
        await self.push_frame(frame, direction)


class PhoneTransport(BaseTransport):
    """Pipecat transport of one phone call. Events: `on_client_connected`, `on_client_disconnected` (with the
    call). Subclasses name their `input_class`, `output_class`, `logger` and the call's id."""

    input_class: ClassVar[type[PhoneInput]] = PhoneInput
    output_class: ClassVar[type[PhoneOutput]] = PhoneOutput
    logger: ClassVar[logging.Logger] = logging.getLogger("duetaspan")

    def __init__(self, call: Any, call_id: str) -> None:
        super().__init__(
            input_name=f"{self.input_class.__name__}#{call_id}",
            output_name=f"{self.output_class.__name__}#{call_id}",
        )
        self.call = call
        self.call_id = call_id
        self._register_event_handler("on_client_connected")
        self._register_event_handler("on_client_disconnected")
        self._input = self.input_class(self, call, name=self._input_name)
        self._output = self.output_class(self, call, name=self._output_name)

    def input(self) -> PhoneInput:
        return self._input

    def output(self) -> PhoneOutput:
        return self._output

    async def fire(self, event: str) -> None:
        await self._call_event_handler(event, self.call)


def _to_int16_bytes(pcm: np.ndarray) -> bytes:
    return np.clip(np.rint(pcm * 32768.0), -32768, 32767).astype("<i2").tobytes()


__all__ = ["PhoneInput", "PhoneOutput", "PhoneTransport"]
