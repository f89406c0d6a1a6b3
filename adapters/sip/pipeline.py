"""A Pipecat transport over one `SipCall`: `transport.input() -> DuetaSpanService -> transport.output()`.

Input pushes the caller's 20 ms RTP frames as `InputAudioRawFrame`s (8 kHz int16; the service resamples to
24 kHz itself, once, and feeds the 80 ms engine clock) and digits (RFC 4733 or SIP INFO) as
`InputDTMFFrame`s, exactly as the Twilio transport does; when the call ends it asks the pipeline to end
(`EndWorkerFrame` upstream) so the service closes its slot and writes the call's artifacts. Output queues each
`OutputAudioRawFrame` on the call's paced RTP sender; an `InterruptionFrame` (barge-in) drops what is queued.
Bot speaking state is reported as Pipecat's output transports do.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

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

from duetaspan.adapters.sip.call import SipCall
from duetaspan.pipeline.bot_speech import BotSpeechOutput

logger = logging.getLogger("duetaspan.sip")


class SipInput(FrameProcessor):
    """Caller audio and DTMF from the call into the pipeline."""

    def __init__(self, transport: SipPipecatTransport, call: SipCall, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._transport = transport
        self._call = call
        self._pump: asyncio.Task[None] | None = None
        self._digits: asyncio.Queue[str] = asyncio.Queue()
        call.media.on_dtmf(self._digits.put_nowait)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
        if isinstance(frame, StartFrame) and self._pump is None:
            self._pump = self.create_task(self._run(), name="sip-input")
        elif isinstance(frame, EndFrame | CancelFrame) and self._pump is not None:
            await self.cancel_task(self._pump)
            self._pump = None

    async def _run(self) -> None:
        await self._transport._fire("on_client_connected")
        keys = asyncio.ensure_future(self._forward_dtmf())
        try:
            async for pcm in self._call.media.audio():
                await self.push_frame(
                    InputAudioRawFrame(audio=pcm.tobytes(), sample_rate=self._call.in_rate, num_channels=1)
                )
        finally:
            keys.cancel()
        reason = self._call.end_reason or "media closed"
        logger.info("call %s: ended (%s); ending its pipeline", self._call.call_sid, reason)
        await self._transport._fire("on_client_disconnected")
        await self.push_frame(EndWorkerFrame(reason=reason), FrameDirection.UPSTREAM)

    async def _forward_dtmf(self) -> None:
        while True:
            digit = await self._digits.get()
            await self.push_frame(InputDTMFFrame(button=KeypadEntry(digit)))


class SipOutput(BotSpeechOutput):
    """Agent audio from the pipeline to the call's RTP sender; barge-in drops the queued audio."""

    def __init__(self, call: SipCall, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._call = call

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, OutputAudioRawFrame) and direction == FrameDirection.DOWNSTREAM:
            self._call.media.set_output_rate(frame.sample_rate)
            pcm = np.frombuffer(frame.audio, dtype="<i2").astype(np.float32) / 32768.0
            if frame.num_channels > 1:
                pcm = pcm.reshape(-1, frame.num_channels).mean(axis=1)
            self._call.media.send_audio(pcm)
            await self.push_frame(frame, direction)
            await self._track_speech(pcm, frame.sample_rate)
            return
        if isinstance(frame, InterruptionFrame):
            dropped = self._call.media.clear()
            logger.info("call %s: barge-in, dropped %d ms of agent audio", self._call.call_sid, dropped)
            await self._bot_stopped()
        await self.push_frame(frame, direction)


class SipPipecatTransport(BaseTransport):
    """Pipecat transport of one SIP call. Events: `on_client_connected`, `on_client_disconnected`."""

    def __init__(self, call: SipCall) -> None:
        super().__init__(input_name=f"SipInput#{call.call_sid}", output_name=f"SipOutput#{call.call_sid}")
        self.call = call
        self._register_event_handler("on_client_connected")
        self._register_event_handler("on_client_disconnected")
        self._input = SipInput(self, call, name=self._input_name)
        self._output = SipOutput(call, name=self._output_name)

    def input(self) -> SipInput:
        return self._input

    def output(self) -> SipOutput:
        return self._output

    async def _fire(self, event: str) -> None:
        await self._call_event_handler(event, self.call)


__all__ = ["SipInput", "SipOutput", "SipPipecatTransport"]
