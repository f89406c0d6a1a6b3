"""A Pipecat transport over one `TwilioCall`, so an agent pipeline runs
`transport.input() -> DuetaSpanService -> transport.output()` on a phone call.

Input pushes the caller's audio as `InputAudioRawFrame`s (8 kHz int16: the service resamples to 24 kHz
itself, once) and keypresses as `InputDTMFFrame`s; when the call ends (Twilio `stop`, socket closed, hang-up)
it fires `on_client_disconnected` and asks the pipeline to end gracefully (`EndWorkerFrame` upstream), so the
service closes its slot and writes the call's artifacts. Output hands each `OutputAudioRawFrame` to the
call's real-time pacer and turns an `InterruptionFrame` (the service pushes one, with its
`AgentBargedInFrame`, when the model stops for the caller) into a Twilio `clear`. Like Pipecat's output
transports it reports the agent's speech as `BotStartedSpeakingFrame` / `BotStoppedSpeakingFrame` (both
directions): speaking from the first non-silent output frame, stopped after `BOT_STOP_SILENCE_S` of silence
or on an interruption.

Example:
    >>> async def handler(call: TwilioCall) -> None:           # doctest: +SKIP
    ...     transport = TwilioTransport(call)
    ...     worker = PipelineWorker(Pipeline([transport.input(), service, transport.output()]))
    ...     await WorkerRunner(handle_sigint=False).run(worker)
"""

from __future__ import annotations

import asyncio
import logging

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

from duetaspan.adapters.twilio.stream import TwilioCall
from duetaspan.pipeline.bot_speech import BotSpeechOutput

logger = logging.getLogger("duetaspan.twilio")


class TwilioInput(FrameProcessor):
    """Caller audio and DTMF from the call into the pipeline."""

    def __init__(self, transport: TwilioTransport, call: TwilioCall, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._transport = transport
        self._call = call
        self._pump: asyncio.Task[None] | None = None
        self._digits: asyncio.Queue[str] = asyncio.Queue()
        call.on_dtmf(self._digits.put_nowait)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
        if isinstance(frame, StartFrame) and self._pump is None:
            self._pump = self.create_task(self._run(), name="twilio-input")
        elif isinstance(frame, EndFrame | CancelFrame) and self._pump is not None:
            await self.cancel_task(self._pump)
            self._pump = None

    async def _run(self) -> None:
        await self._transport._fire("on_client_connected")
        keys = asyncio.ensure_future(self._forward_dtmf())
        try:
            async for pcm in self._call.audio():
                audio = pcm.tobytes() if pcm.dtype == np.int16 else _to_int16_bytes(pcm)
                await self.push_frame(
                    InputAudioRawFrame(audio=audio, sample_rate=self._call.in_rate, num_channels=1)
                )
        finally:
            keys.cancel()
        logger.info(
            "call %s: ended (%s); ending its pipeline", self._call.info.call_sid, self._call.end_reason
        )
        await self._transport._fire("on_client_disconnected")
        await self.push_frame(EndWorkerFrame(reason=self._call.end_reason), FrameDirection.UPSTREAM)

    async def _forward_dtmf(self) -> None:
        while True:
            digit = await self._digits.get()
            await self.push_frame(InputDTMFFrame(button=KeypadEntry(digit)))


class TwilioOutput(BotSpeechOutput):
    """Agent audio from the pipeline to the call (paced there), barge-in to `clear`."""

    def __init__(self, transport: TwilioTransport, call: TwilioCall, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._call = call

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, OutputAudioRawFrame) and direction == FrameDirection.DOWNSTREAM:
            self._call.set_output_rate(frame.sample_rate)
            pcm = _mono_float(frame)
            self._call.send_audio(pcm)
            await self.push_frame(frame, direction)
            await self._track_speech(pcm, frame.sample_rate)
            return
        if isinstance(frame, InterruptionFrame):
            await self._call.clear()
            await self._bot_stopped()
        await self.push_frame(frame, direction)


class TwilioTransport(BaseTransport):
    """Pipecat transport of one Twilio call. Events: `on_client_connected`, `on_client_disconnected`."""

    def __init__(self, call: TwilioCall) -> None:
        super().__init__(
            input_name=f"TwilioInput#{call.info.call_sid}", output_name=f"TwilioOutput#{call.info.call_sid}"
        )
        self.call = call
        self._register_event_handler("on_client_connected")
        self._register_event_handler("on_client_disconnected")
        self._input = TwilioInput(self, call, name=self._input_name)
        self._output = TwilioOutput(self, call, name=self._output_name)

    def input(self) -> TwilioInput:
        return self._input

    def output(self) -> TwilioOutput:
        return self._output

    async def _fire(self, event: str) -> None:
        await self._call_event_handler(event, self.call)


def _to_int16_bytes(pcm: np.ndarray) -> bytes:
    return np.clip(np.rint(pcm * 32768.0), -32768, 32767).astype("<i2").tobytes()


def _mono_float(frame: OutputAudioRawFrame) -> np.ndarray:
    pcm = np.frombuffer(frame.audio, dtype="<i2").astype(np.float32) / 32768.0
    if frame.num_channels > 1:
        pcm = pcm.reshape(-1, frame.num_channels).mean(axis=1)
    return pcm
