"""A Pipecat transport over one `SipCall`: `transport.input() -> DuetaSpanService -> transport.output()`.

Input pushes the caller's 20 ms RTP frames as `InputAudioRawFrame`s (8 kHz int16; the service resamples to
24 kHz itself, once, and feeds the 80 ms engine clock) and digits (RFC 4733 or SIP INFO) as
`InputDTMFFrame`s, exactly as the Twilio transport does; when the call ends it asks the pipeline to end
(`EndWorkerFrame` upstream) so the service closes its slot and writes the call's artifacts. Output queues each
`OutputAudioRawFrame` on the call's paced RTP sender; an `InterruptionFrame` (barge-in) drops what is queued.
Bot speaking state is reported as Pipecat's output transports do.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import numpy as np

from duetaspan.adapters.sip.call import SipCall
from duetaspan.adapters.sip.liveness import MEDIA_TIMEOUT
from duetaspan.pipeline.phone import PhoneInput, PhoneOutput, PhoneTransport

logger = logging.getLogger("duetaspan.sip")


class SipInput(PhoneInput):
    """Caller audio and DTMF from the call into the pipeline."""

    task_name = "sip-input"

    def audio(self) -> AsyncIterator[np.ndarray]:
        return self._call.media.audio()

    def listen_dtmf(self, listener: Callable[[str], object]) -> None:
        self._call.media.on_dtmf(listener)

    def end_reason(self) -> str:
        return self._call.end_reason or "media closed"

    def ended_by(self) -> str | None:
        return MEDIA_TIMEOUT if self._call.end_reason == MEDIA_TIMEOUT else None


class SipOutput(PhoneOutput):
    """Agent audio from the pipeline to the call's RTP sender; barge-in drops the queued audio."""

    def send(self, pcm: np.ndarray, rate: int) -> None:
        self._call.media.set_output_rate(rate)
        self._call.media.send_audio(pcm)

    async def drop_queued(self) -> None:
        dropped = self._call.media.clear()
        logger.info("call %s: barge-in, dropped %d ms of agent audio", self._call.call_sid, dropped)


class SipPipecatTransport(PhoneTransport):
    """Pipecat transport of one SIP call. Events: `on_client_connected`, `on_client_disconnected`."""

    input_class = SipInput
    output_class = SipOutput
    logger = logger

    def __init__(self, call: SipCall) -> None:
        super().__init__(call, call.call_sid)


__all__ = ["SipInput", "SipOutput", "SipPipecatTransport"]
