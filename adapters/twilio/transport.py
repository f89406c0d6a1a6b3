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

import logging
from collections.abc import AsyncIterator, Callable

import numpy as np

from duetaspan.adapters.twilio.stream import TwilioCall
from duetaspan.pipeline.phone import PhoneInput, PhoneOutput, PhoneTransport


class TwilioInput(PhoneInput):
    """Caller audio and DTMF from the call into the pipeline."""

    task_name = "twilio-input"

    def audio(self) -> AsyncIterator[np.ndarray]:
        return self._call.audio()

    def listen_dtmf(self, listener: Callable[[str], object]) -> None:
        self._call.on_dtmf(listener)


class TwilioOutput(PhoneOutput):
    """Agent audio from the pipeline to the call (paced there), barge-in to `clear`."""

    def send(self, pcm: np.ndarray, rate: int) -> None:
        self._call.set_output_rate(rate)
        self._call.send_audio(pcm)

    async def drop_queued(self) -> None:
        await self._call.clear()


class TwilioTransport(PhoneTransport):
    """Pipecat transport of one Twilio call. Events: `on_client_connected`, `on_client_disconnected`."""

    input_class = TwilioInput
    output_class = TwilioOutput
    logger = logging.getLogger("duetaspan.twilio")

    def __init__(self, call: TwilioCall) -> None:
        super().__init__(call, call.info.call_sid)
