"""How a scripted caller's audio and keys reach a call: an in-process transport (`LoopbackLine`) or a real
Twilio Media Streams WebSocket (`TwilioLine`, in `duetaspan.testing.twilio`). Both pace the caller's audio in
real time, 20 ms at a time, as a phone line does.

Example:
    >>> chunks = chunks_at(np.zeros(24000, np.float32), 24000)    # one second of 24 kHz audio
    >>> len(chunks), len(chunks[0])                                # 50 chunks of 20 ms, int16
    (50, 960)
    >>> len(chunks_at(np.zeros(24000, np.float32), 8000)[0])       # at a phone's 8 kHz
    320
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import numpy as np

from duetaspan.pipeline.resample import StreamResampler, float_to_int16_bytes


def chunks_at(pcm24k: np.ndarray, rate: int, chunk_ms: int = 20) -> list[bytes]:
    """24 kHz float audio -> int16 chunks at `rate` (what a transport hands the pipeline)."""
    audio = StreamResampler(24000, rate, "HQ").process(pcm24k) if rate != 24000 else pcm24k
    n = rate * chunk_ms // 1000
    return [float_to_int16_bytes(audio[i : i + n]) for i in range(0, audio.size - n + 1, n)]


class Line(Protocol):
    """What `ScriptedCall` needs from a transport."""

    session: Any  # the call's CallSession once known
    received: list[Any]  # what the agent sent: pipeline frames (loopback) or Media Stream messages (twilio)

    async def play(self, pcm24k: np.ndarray) -> None: ...
    async def press(self, digits: str) -> None: ...
    async def hang_up(self) -> None: ...


class LoopbackLine:
    """The caller on an in-process Pipecat transport: paced 8 kHz audio (like a phone) and DTMF frames."""

    rate = 8000

    def __init__(self, session: Any, transport: Any = None) -> None:
        self.session = session
        self.transport = transport

    @property
    def received(self) -> list[Any]:
        """The frames the agent's pipeline sent to the transport's output (audio, text, spans, events)."""
        return list(self.transport.received) if self.transport is not None else []

    async def play(self, pcm24k: np.ndarray) -> None:
        from pipecat.frames.frames import InputAudioRawFrame

        worker = self.session.worker
        if worker is None or self.session.service.closed:
            return
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for i, chunk in enumerate(chunks_at(pcm24k, self.rate)):
            await worker.queue_frame(InputAudioRawFrame(chunk, self.rate, 1))
            await asyncio.sleep(max(0.0, t0 + (i + 1) * 0.02 - loop.time()))

    async def press(self, digits: str) -> None:
        from pipecat.audio.dtmf.types import KeypadEntry
        from pipecat.frames.frames import InputDTMFFrame

        worker = self.session.worker
        for digit in digits:
            await worker.queue_frame(InputDTMFFrame(button=KeypadEntry(digit)))
            await self.play(np.zeros(2400, np.float32))  # 100 ms between keys, the line stays live

    async def hang_up(self) -> None:
        await self.session.end()


__all__ = ["Line", "LoopbackLine", "chunks_at"]
