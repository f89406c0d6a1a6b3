"""How a scripted caller's audio and keys reach a call: an in-process transport (`LoopbackLine`) or a real
Twilio Media Streams WebSocket (`TwilioLine`, in `duetaspan.testing.twilio`). Both carry 20 ms of audio every
20 ms from the call's start to its hang-up, as a phone line does (Twilio streams media the whole call): what
the caller says when `play` queues it, silence otherwise (`PacedLine`).

Example:
    >>> chunks = chunks_at(np.zeros(24000, np.float32), 24000)    # one second of 24 kHz audio
    >>> len(chunks), len(chunks[0])                                # 50 chunks of 20 ms, int16
    (50, 960)
    >>> len(chunks_at(np.zeros(24000, np.float32), 8000)[0])       # at a phone's 8 kHz
    320
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import numpy as np

from duetaspan.pipeline.resample import StreamResampler, float_to_int16_bytes


def chunks_at(pcm24k: np.ndarray, rate: int, chunk_ms: int = 20) -> list[bytes]:
    """24 kHz float audio -> int16 chunks at `rate` (what a transport hands the pipeline)."""
    audio = StreamResampler(24000, rate, "HQ").process(pcm24k) if rate != 24000 else pcm24k
    n = rate * chunk_ms // 1000
    return [float_to_int16_bytes(audio[i : i + n]) for i in range(0, audio.size - n + 1, n)]


Send = Callable[[bytes], Awaitable[bool]]  # sends one 20 ms chunk; False: the line is closed, stop


class PacedLine:
    """A line's 20 ms clock: each tick sends the next queued chunk, or `silence` when nothing is queued.

    `play` queues chunks and returns once they were sent; `then` queues an action (a DTMF key) in order with
    the audio. A real line never pauses between utterances: a caller's silence still arrives as audio (the
    agent's voice detection ends an utterance on that silence, not on the line going quiet).
    """

    period_s = 0.02

    def __init__(self, send: Send, silence: bytes) -> None:
        self._send = send
        self._silence = silence
        self._queue: deque[bytes | Callable[[], Awaitable[Any]] | asyncio.Future[None]] = deque()
        self._task: asyncio.Task[None] | None = None
        self.done = False  # the line closed (hang-up, or the far end went away)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="scripted-line")

    async def play(self, chunks: list[bytes]) -> None:
        await self._enqueue(list(chunks))

    async def then(self, action: Callable[[], Awaitable[Any]]) -> None:
        await self._enqueue([action])

    async def _enqueue(self, items: list[Any]) -> None:
        if self.done:
            return
        self.start()
        finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.extend([*items, finished])
        await finished

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        try:
            while True:
                item = self._queue.popleft() if self._queue else self._silence
                if isinstance(item, asyncio.Future):
                    if not item.done():
                        item.set_result(None)
                    continue
                if callable(item):
                    await item()
                    continue
                if not await self._send(item):
                    return
                due += self.period_s
                await asyncio.sleep(max(0.0, due - loop.time()))
        finally:
            self.done = True
            for item in self._queue:  # nobody waits forever for audio a closed line will not carry
                if isinstance(item, asyncio.Future) and not item.done():
                    item.set_result(None)
            self._queue.clear()

    async def stop(self) -> None:
        """Stop the clock (before the hang-up: a phone sends nothing after it)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.done = True


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
        self.paced = PacedLine(self._send, bytes(2 * self.rate // 50))

    @property
    def received(self) -> list[Any]:
        """The frames the agent's pipeline sent to the transport's output (audio, text, spans, events)."""
        return list(self.transport.received) if self.transport is not None else []

    def start(self) -> None:
        """The call is answered: the line carries audio from now on."""
        self.paced.start()

    async def _send(self, chunk: bytes) -> bool:
        from pipecat.frames.frames import InputAudioRawFrame

        if self.session.service.closed:
            return False
        worker = self.session.worker
        if worker is not None:  # the pipeline runs: the line is live
            await worker.queue_frame(InputAudioRawFrame(chunk, self.rate, 1))
        return True

    async def play(self, pcm24k: np.ndarray) -> None:
        await self.paced.play(chunks_at(pcm24k, self.rate))

    async def press(self, digits: str) -> None:
        from pipecat.audio.dtmf.types import KeypadEntry
        from pipecat.frames.frames import InputDTMFFrame

        for digit in digits:

            async def key(digit: str = digit) -> None:
                if self.session.worker is not None:
                    await self.session.worker.queue_frame(InputDTMFFrame(button=KeypadEntry(digit)))

            await self.paced.then(key)
            await self.play(np.zeros(2400, np.float32))  # 100 ms between keys

    async def hang_up(self) -> None:
        await self.paced.stop()
        await self.session.end()


__all__ = ["Line", "LoopbackLine", "PacedLine", "chunks_at"]
