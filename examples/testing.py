"""Drives example bots through real calls in their tests: a scripted caller on an in-process transport or on a
real Twilio Media Stream socket, a forced `<ret>` after each question, and the outcome of each retrieval.

The router and the ASR are the scripted loopback servers of the test suite (`tests/fakes/`), so each example
test runs the full path on CPU: caller audio -> Silero VAD question capture -> ASR -> LLM router -> the
example's tools -> a Context Span written into the `tiny-random` model's streams -> call artifacts.

Example (inside an async test):
    >>> async def script(caller: LoopbackCaller) -> None:       # doctest: +SKIP
    ...     await caller.say("book_table")
    ...     span = await caller.ask()                          # forced <ret>, then the span (or no span)
    >>> outcome = await run_loopback_call(agent, CallInfo("CA1", caller="+15550001111"), script)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pipecat.audio.dtmf.types import KeypadEntry
from pipecat.frames.frames import InputAudioRawFrame, InputDTMFFrame
from websockets.exceptions import ConnectionClosed

from duetaspan.adapters.twilio.audio import int16_to_ulaw
from duetaspan.agent import Agent
from duetaspan.pipeline.frames import LateSpanFrame, NoSpanFrame, SpanFrame
from duetaspan.pipeline.session import CallInfo, CallSession
from tests.pipeline.harness import chunks_at
from tests.pipeline.loopback import LoopbackTransport
from tests.support import load_wav

Outcome = SpanFrame | NoSpanFrame | LateSpanFrame
SILENCE_S = 0.7  # after each question: long enough for VAD to close the utterance (end silence) at once


def speech(name: str, seconds: float | None = None) -> np.ndarray:
    """A shared fixture recording (24 kHz float) trimmed to its speech, optionally to its first `seconds`.

    What the words are does not matter to the tests (the scripted ASR server says what was heard); the audio
    has to be speech so that voice detection cuts a real utterance.
    """
    pcm, rate = load_wav(name)
    loud = np.flatnonzero(np.abs(pcm) > 0.02)
    pcm = pcm[max(0, loud[0] - rate // 10) : loud[-1] + rate // 10] if loud.size else pcm
    return pcm[: int(seconds * rate)] if seconds else pcm


class _Outcomes:
    """A scripted caller's speech (`say`, `silence`, over its transport's `_play`) and the retrieval outcome
    of each forced `<ret>` (span, no span, late span), in order."""

    def __init__(self, session: CallSession | None = None) -> None:
        self.session: CallSession | None = None
        self.queue: asyncio.Queue[Outcome] = asyncio.Queue()
        self.history: list[Outcome] = []
        if session is not None:
            self.bind(session)

    def bind(self, session: CallSession) -> None:
        """Follow `session`'s retrieval outcomes (spans, no spans, late spans)."""
        self.session = session
        service = session.service

        @service.event_handler("on_span")
        async def _span(_service: Any, frame: SpanFrame) -> None:
            self.queue.put_nowait(frame)

        @service.event_handler("on_no_span")
        async def _no_span(_service: Any, frame: NoSpanFrame) -> None:
            self.queue.put_nowait(frame)

        @service.event_handler("on_late_span")
        async def _late(_service: Any, frame: LateSpanFrame) -> None:
            self.queue.put_nowait(frame)

    async def _play(self, pcm24k: np.ndarray) -> None:
        """Send 24 kHz float audio the way this caller's transport carries it, in real time."""
        raise NotImplementedError

    async def say(self, fixture: str, seconds: float | None = None, silence_s: float = SILENCE_S) -> None:
        """Speak a fixture recording in real time, then stay silent for `silence_s`."""
        await self._play(
            np.concatenate([speech(fixture, seconds), np.zeros(int(24000 * silence_s), np.float32)])
        )

    async def silence(self, seconds: float) -> None:
        await self._play(np.zeros(int(24000 * seconds), np.float32))

    async def ask(self, within_s: float = 15.0) -> Outcome:
        """Force `<ret>` on the call's slot (as if the model asked) and wait for what the retrieval gives."""
        assert self.session is not None, "bind() the call's session first"
        slot = self.session.service.slot
        assert slot is not None, "the call has no engine slot"
        slot.force_ret()
        outcome = await asyncio.wait_for(self.queue.get(), within_s)
        self.history.append(outcome)
        return outcome


class LoopbackCaller(_Outcomes):
    """A caller on an in-process transport: paced 8 kHz audio (like a phone), DTMF, forced `<ret>`s."""

    rate = 8000

    async def started(self) -> None:
        assert self.session is not None
        await asyncio.wait_for(self.session.service.started.wait(), 60)

    async def _play(self, pcm24k: np.ndarray) -> None:
        assert self.session is not None and self.session.worker is not None
        worker = self.session.worker
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for i, chunk in enumerate(chunks_at(pcm24k, self.rate)):
            await worker.queue_frame(InputAudioRawFrame(chunk, self.rate, 1))
            await asyncio.sleep(max(0.0, t0 + (i + 1) * 0.02 - loop.time()))

    async def dtmf(self, digits: str) -> None:
        """Press keys (what a telephony transport turns DTMF events into)."""
        assert self.session is not None and self.session.worker is not None
        worker = self.session.worker
        for digit in digits:
            await worker.queue_frame(InputDTMFFrame(button=KeypadEntry(digit)))
            await asyncio.sleep(0.05)


@dataclass
class CallOutcome:
    """What a driven call produced."""

    record: dict[str, Any] | None
    context: Any
    outcomes: list[Outcome] = field(default_factory=list)
    received: list[Any] = field(default_factory=list)

    def spans(self) -> list[SpanFrame]:
        return [o for o in self.outcomes if isinstance(o, SpanFrame)]


def tool_call(name: str, **arguments: Any) -> dict[str, Any]:
    """A scripted router reply (`tests/fakes/llm_server.py`) that calls tool `name` with `arguments`."""
    return {"tool_call": {"name": name, "arguments": arguments}}


def scripted_agent(config: Any, engine: Any, llm_url: str, asr_url: str, record_dir: Path) -> Agent:
    """An example's agent (its `agent.toml` path or `AgentConfig`) on the test engine, one call at a time, its
    router and ASR pointed at the scripted loopback servers and its artifacts written to `record_dir`."""
    return Agent.from_config(
        config,
        engine=engine,
        max_calls=1,
        seed=0,
        router={"base_url": f"{llm_url}/v1", "model": "scripted", "api_key_env": None},
        asr={"kind": "transcribe", "url": f"{asr_url}/transcribe"},
        record_dir=record_dir,
    )


async def run_loopback_call(
    agent: Any, call: CallInfo, script: Callable[[LoopbackCaller], Awaitable[None]]
) -> CallOutcome:
    """Run one call on `agent` (started) over an in-process transport while `script` plays the caller."""
    transport = LoopbackTransport()
    session = agent.create_session(call, transport)
    caller = LoopbackCaller(session)

    async def drive() -> None:
        await caller.started()
        try:
            await script(caller)
            await caller.silence(0.3)
        finally:
            await session.end()

    record, _ = await asyncio.gather(session.run(), drive())
    return CallOutcome(record, session.context, caller.history, transport.received)


# Twilio ----------------------------------------------------------------------------------------------------
def ulaw_chunks(pcm24k: np.ndarray) -> list[bytes]:
    """24 kHz float audio as the 20 ms mu-law payloads a Twilio stream carries."""
    out = []
    for chunk in chunks_at(pcm24k, 8000):
        out.append(int16_to_ulaw(np.frombuffer(chunk, "<i2")))
    return out


class TwilioCaller(_Outcomes):
    """Plays Twilio's side of a Media Stream on a real WebSocket: start, paced media, DTMF, marks, stop.

    Once the server has made the call's session (captured with `capture_sessions`), `bind(session)` it to
    force `<ret>`s with `ask()`.
    """

    def __init__(self, ws: Any, call_sid: str) -> None:
        super().__init__()
        self.ws = ws
        self.call_sid = call_sid
        self.stream_sid = "MZ" + call_sid[2:].ljust(32, "0")[:32]
        self.received: list[dict[str, Any]] = []
        self._seq = 0
        self._chunk = 0
        self._lock = asyncio.Lock()
        self.closed = False  # the server closed the stream (hang-up, transfer): nothing more is sent

    async def send(self, event: str, **body: Any) -> None:
        async with self._lock:  # numbered and sent atomically: the server checks the order
            if self.closed:
                return
            self._seq += 1
            msg = {"event": event, "sequenceNumber": str(self._seq), "streamSid": self.stream_sid, **body}
            try:
                await self.ws.send(json.dumps(msg))
            except ConnectionClosed:
                self.closed = True

    async def read(self) -> None:
        """Collect what the server sends; echo marks the way Twilio does once audio has played."""
        with contextlib.suppress(ConnectionClosed):
            async for raw in self.ws:
                msg = json.loads(raw)
                self.received.append(msg)
                if msg.get("event") == "mark":
                    await self.send("mark", mark=msg["mark"])
        self.closed = True

    async def start(self, account_sid: str, parameters: dict[str, str] | None = None) -> None:
        await self.ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        start = {
            "accountSid": account_sid,
            "streamSid": self.stream_sid,
            "callSid": self.call_sid,
            "tracks": ["inbound"],
            "customParameters": parameters or {},
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        }
        await self.send("start", start=start)

    async def _play(self, pcm24k: np.ndarray) -> None:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for i, payload in enumerate(ulaw_chunks(pcm24k)):
            if self.closed:
                return
            self._chunk += 1
            media = {
                "track": "inbound",
                "chunk": str(self._chunk),
                "timestamp": str(self._chunk * 20),
                "payload": base64.b64encode(payload).decode(),
            }
            await self.send("media", media=media)
            await asyncio.sleep(max(0.0, t0 + (i + 1) * 0.02 - loop.time()))

    async def dtmf(self, digits: str) -> None:
        for digit in digits:
            await self.send("dtmf", dtmf={"track": "inbound_track", "digit": digit})
            await self.silence(0.1)

    async def stop(self) -> None:
        """The caller hangs up."""
        await self.send("stop", stop={"accountSid": "", "callSid": self.call_sid})


async def answer_twilio_stream(
    ws: Any, call_sid: str, account_sid: str, sessions: list[CallSession]
) -> tuple[TwilioCaller, asyncio.Task[None]]:
    """Play Twilio's side of a just-opened Media Stream: start it, bind to the call's session (the first one
    `capture_sessions` sees) and wait until the model's service runs. Returns the caller and its reader task,
    which ends when the server closes the stream."""
    caller = TwilioCaller(ws, call_sid)
    reader = asyncio.create_task(caller.read())
    await caller.start(account_sid)
    caller.bind(await wait_for(lambda: sessions and sessions[0], what="the call's session"))
    assert caller.session is not None
    await asyncio.wait_for(caller.session.service.started.wait(), 30)
    return caller, reader


@contextlib.asynccontextmanager
async def capture_sessions(agent: Any) -> AsyncIterator[list[CallSession]]:
    """Every `CallSession` the agent creates while inside, in order (to force `<ret>` on a served call)."""
    sessions: list[CallSession] = []
    create = agent.create_session

    def wrapped(*args: Any, **kwargs: Any) -> CallSession:
        session = create(*args, **kwargs)
        sessions.append(session)
        return session

    agent.create_session = wrapped
    try:
        yield sessions
    finally:
        del agent.create_session


async def wait_for(predicate: Callable[[], Any], within_s: float = 10.0, what: str = "condition") -> Any:
    """Poll `predicate` until it is truthy (returns its value) or fail after `within_s` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within_s
    while True:
        value = predicate()
        if value:
            return value
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
