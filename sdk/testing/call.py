"""`scripted_call`: a scripted caller on a real call of your agent, for your tests.

    async with scripted_call(agent, llm=scripted_llm, asr=scripted_asr) as call:
        await call.say("Please book a table for four at 7 PM")   # text, a shipped phrase, or an audio file
        outcome = await call.ask()                                 # force <ret>, wait for the retrieval
        outcome.expect_tool("book_table", people=4).expect_span(contains="7 PM")
        await call.press("1234#")                                  # DTMF
    call.record, call.spans, call.tool_calls                       # the call's JSON artifact, afterwards

The call runs the whole path: caller audio -> voice detection and question capture -> ASR -> the router's
LLM -> your tools -> a Context Span written into the model's streams -> the call's artifacts. With `llm=`
and `asr=` (a `ScriptedLLM` / `ScriptedASR`, e.g. the plugin's fixtures) the agent's router and ASR are
pointed at them before it starts; `DUETASPAN_TEST_ROUTER=real` keeps the agent's own router instead
(`duetaspan.testing.judge`). Text said without a `tts_command` is carried by a stock speech recording while
the scripted ASR hears the text; with `tts_command=("espeak-ng", "-w", "{out}", "{text}")` it is spoken.
`transport="twilio"` serves the agent with `agent.serve(twilio=True)` on loopback and calls it over a real,
signed Twilio Media Streams WebSocket (`duetaspan.testing.twilio`).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from duetaspan.testing.audio import PHRASES, RATE, is_audio_file, speech, synthesize
from duetaspan.testing.judge import check_real_router, router_mode
from duetaspan.testing.outcome import Outcome

SILENCE_S = 0.7  # after each utterance: long enough for voice detection to close it at once
CARRIER = "book_table"  # the stock recording that carries text when there is no TTS command
OUTCOME_HANDLERS = {"on_span": "span", "on_no_span": "no_span", "on_late_span": "late"}
FINAL_EVENTS = {"delivered", "no_span", "late", "error", "cancelled"}


class ScriptedCall:
    """One scripted call in progress (made by `scripted_call`). See the module docstring."""

    def __init__(
        self, line: Any, *, asr: Any = None, llm: Any = None, tts_command: Sequence[str] | str | None = None
    ) -> None:
        self.line = line
        self.asr = asr
        self.llm = llm  # the ScriptedLLM answering the router (None in real-router mode)
        self._replies_seen = 0
        self.tts_command = tts_command
        self.outcomes: list[Outcome] = []
        self.record: dict[str, Any] | None = None  # the call's JSON artifact, once the call has ended
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._seen = 0  # event-log lines already attributed to an outcome
        self._ended = False

    @property
    def session(self) -> Any:
        return self.line.session

    def bind(self, session: Any) -> None:
        """Follow `session`'s retrieval outcomes (spans, no spans, late spans)."""
        for handler, kind in OUTCOME_HANDLERS.items():

            async def put(_service: Any, frame: Any, kind: str = kind) -> None:
                self._queue.put_nowait((kind, frame))

            session.service.add_event_handler(handler, put)

    # the caller ---------------------------------------------------------------------------------
    async def say(
        self,
        what: str | Path,
        *,
        heard: str | None = None,
        seconds: float | None = None,
        silence_s: float = SILENCE_S,
    ) -> None:
        """Say `what` in real time, then stay silent for `silence_s` (the line carries silence between).

        `what` is an audio file path, one of the shipped phrases (`duetaspan.testing.audio.PHRASES`), or text
        (spoken by `tts_command`, else carried by a stock recording). The scripted ASR, when the call has one,
        hears `heard`, else the text or the phrase's words. `seconds` cuts the audio to its first seconds.
        """
        if is_audio_file(what):
            pcm, words = speech(what, seconds), None
        elif str(what) in PHRASES:
            pcm, words = speech(str(what), seconds), PHRASES[str(what)]
        elif self.tts_command is not None:
            # off the event loop: the call's pipeline keeps its pace while the TTS command runs
            pcm, words = await asyncio.to_thread(synthesize, str(what), self.tts_command), str(what)
        else:
            pcm, words = speech(CARRIER, seconds or 1.2), str(what)
        if self.asr is not None and (heard or words) is not None:
            self.asr.hears(heard or words)
        await self.line.play(np.concatenate([pcm, np.zeros(int(RATE * silence_s), np.float32)]))

    async def silence(self, seconds: float) -> None:
        """Say nothing for `seconds` (the line stays live)."""
        await self.line.play(np.zeros(int(RATE * seconds), np.float32))

    async def press(self, digits: str) -> None:
        """Press keys on the phone's keypad (DTMF), 100 ms apart: `await call.press("1234#")`."""
        await self.line.press(digits)

    async def ask(self, timeout: float = 20.0) -> Outcome:  # noqa: ASYNC109 - the documented name
        """Force `<ret>` on the call's slot (as if the model asked) and wait for the retrieval's outcome."""
        slot = self.session.service.slot
        if slot is None:
            raise AssertionError("the call has no engine slot (it ended, or never started)")
        slot.force_ret()
        return await self.wait_for_span(timeout=timeout, what="outcome of the forced <ret>")

    async def wait_for_span(
        self,
        timeout: float = 20.0,  # noqa: ASYNC109 - the documented name
        what: str = "retrieval outcome",
    ) -> Outcome:
        """Wait for the next retrieval outcome (a span, no span, or a late span), e.g. of the model's own
        `<ret>`; fails after `timeout` seconds naming what the call did meanwhile."""
        try:
            kind, frame = await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            raise AssertionError(
                f"no {what} within {timeout:g} s (spans so far: {len(self.spans)}, "
                f"retrievals: {[o.kind for o in self.outcomes]})"
            ) from None
        outcome = await self._outcome(kind, frame)
        self.outcomes.append(outcome)
        return outcome

    async def hang_up(self) -> None:
        """End the call (the caller hangs up); the artifacts are then complete on disk."""
        if not self._ended:
            self._ended = True
            await self.line.hang_up()

    # what happened ------------------------------------------------------------------------------
    @property
    def received(self) -> list[Any]:
        """What the agent sent the caller: Pipecat frames (loopback) or Twilio Media Stream messages (twilio)."""
        return list(self.line.received)

    def events(self) -> list[dict[str, Any]]:
        """The call's event log so far (its `.jsonl`), or the record's events once it ended."""
        recorder = self.session.service.recorder
        if recorder is None or not recorder.jsonl_path.exists():
            return []
        from duetaspan.pipeline.artifacts import read_events

        return read_events(recorder.jsonl_path)

    @property
    def spans(self) -> list[dict[str, Any]]:
        """Every span that landed: `{"reference", "frame_index", "tool", "arguments", ...}`."""
        if self.record is not None:
            return list(self.record["spans"])
        return [{k: v for k, v in e.items() if k != "type"} for e in self.events() if e.get("type") == "span"]

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """Every tool call of the call: `{"tool", "arguments" (redacted), "ok", "error", ...}`."""
        if self.record is not None:
            retrieval = self.record["retrieval_events"]
        else:
            retrieval = [e for e in self.events() if e.get("type") == "retrieval"]
        return [{k: v for k, v in e.items() if k != "type"} for e in retrieval if e.get("kind") == "tool"]

    async def _outcome(self, kind: str, frame: Any) -> Outcome:
        """The outcome with its retrieval's events (read from the live event log)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + 3.0
        while True:
            events = self.events()
            mine = _retrieval_events(events[self._seen :])
            if any(e.get("kind") in FINAL_EVENTS for e in mine) or loop.time() > end:
                break
            await asyncio.sleep(0.02)
        last = max((i for i, e in enumerate(events) if e in mine), default=len(events) - 1)
        self._seen = max(self._seen, last + 1)
        replies: list[str] = []
        if self.llm is not None:
            from duetaspan.testing.llm import summary

            replies = [summary(r) for r in self.llm.replies[self._replies_seen :]]
            self._replies_seen = len(self.llm.replies)
        return Outcome(
            kind=kind,  # type: ignore[arg-type]
            reference=getattr(frame, "reference", None),
            reason=getattr(frame, "reason", ""),
            events=[{k: v for k, v in e.items() if k != "type"} for e in mine],
            frame=frame,
            llm_replies=replies,
        )


def _retrieval_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events of the first retrieval in `events` (one `retrieval_id`)."""
    ids = [e["retrieval_id"] for e in events if "retrieval_id" in e and e.get("type") != "frame"]
    if not ids:
        return []
    first = ids[0]
    return [e for e in events if e.get("retrieval_id") == first and e.get("type") != "frame"]


def _prepare(agent: Any, llm: Any, asr: Any, record_dir: Path | None) -> None:
    """Point a not-yet-started agent at the scripted servers and a record dir (the call's artifact)."""
    from duetaspan.agent.options import merge_arguments

    overrides: dict[str, Any] = {}
    if llm is not None:
        if router_mode() == "real":
            check_real_router(agent.config)
        else:
            overrides["router"] = {"base_url": llm.base_url, "model": "scripted", "api_key_env": None}
    if asr is not None:
        overrides["asr"] = {"kind": "transcribe", "url": asr.transcribe_url}
    if agent.record_dir is None:
        overrides["record_dir"] = record_dir or Path(tempfile.mkdtemp(prefix="duetaspan-calls-"))
    elif record_dir is not None:
        overrides["record_dir"] = record_dir
    if overrides:
        if agent.started:
            raise RuntimeError("scripted_call(llm=/asr=/record_dir=) must get the agent before it starts")
        agent.config = merge_arguments(agent.config, **overrides)


@contextlib.asynccontextmanager
async def scripted_call(
    agent: Any,
    caller: str = "+15550001111",
    *,
    called: str = "+15552223333",
    transport: Literal["loopback", "twilio"] = "loopback",
    llm: Any = None,
    asr: Any = None,
    call_id: str | None = None,
    record_dir: str | Path | None = None,
    tts_command: Sequence[str] | str | None = None,
    rest_url: str | None = None,
    direction: str = "inbound",
    ready_timeout: float = 60.0,
) -> AsyncIterator[ScriptedCall]:
    """A scripted caller `caller` calling `agent` (started here if it is not, and stopped again).

    Args:
        transport: "loopback" (an in-process transport) or "twilio" (a real Twilio Media Streams socket
            against `agent.serve(twilio=True)` on loopback, after its signed voice webhook).
        llm, asr: a `ScriptedLLM` / `ScriptedASR` (running) for the agent's router and question capture.
        record_dir: where the call's artifacts go (default: the agent's, else a temporary folder).
        tts_command: speaks text given to `say` (`{text}`, `{out}` placeholders), e.g. espeak-ng.
        rest_url: the Twilio REST API root for hang-ups and transfers (e.g. a loopback fake).
        direction: Twilio's `Direction` ("outbound-api": an outbound call the callee answered, `caller`
            then being your number and `called` the person called).

    Example:
        >>> # async with scripted_call(agent, llm=scripted_llm, asr=scripted_asr) as call:
        >>> #     await call.say("book_table"); (await call.ask()).expect_tool("book_table", people=4)
    """
    _prepare(agent, llm, asr, Path(record_dir) if record_dir else None)
    scripted = llm if router_mode() != "real" else None
    call_id = call_id or ("CA" + uuid.uuid4().hex)
    async with contextlib.AsyncExitStack() as stack:
        if not agent.started and transport == "loopback":
            await stack.enter_async_context(agent)
        if transport == "twilio":
            from duetaspan.testing.twilio import twilio_line

            line = await stack.enter_async_context(
                twilio_line(
                    agent,
                    call_id,
                    caller,
                    called,
                    rest_url=rest_url,
                    ready_timeout=ready_timeout,
                    direction=direction,
                )
            )
            call = ScriptedCall(line, asr=asr, llm=scripted, tts_command=tts_command)
            call.bind(line.session)
            await asyncio.wait_for(line.session.service.started.wait(), ready_timeout)
            try:
                yield call
            finally:
                await call.hang_up()
                call.record = await line.finished(within_s=ready_timeout)
            return
        from duetaspan.pipeline.session import CallInfo
        from duetaspan.testing.line import LoopbackLine
        from duetaspan.testing.loopback import LoopbackTransport

        info = CallInfo(call_id, caller=caller, called=called, transport="loopback")
        transport_ = LoopbackTransport()
        session = agent.create_session(info, transport_)
        call = ScriptedCall(LoopbackLine(session, transport_), asr=asr, llm=scripted, tts_command=tts_command)
        call.bind(session)
        running = asyncio.create_task(session.run(), name=f"scripted-call-{call_id}")
        started = asyncio.create_task(session.service.started.wait())
        await asyncio.wait({running, started}, timeout=ready_timeout, return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            started.cancel()
            if running.done():
                running.result()  # the call failed to start: its error
            running.cancel()
            raise AssertionError(f"the call did not start within {ready_timeout:g} s")
        call.line.start()
        try:
            yield call
            await call.silence(0.3)
        finally:
            await call.hang_up()
            call.record = await asyncio.wait_for(running, ready_timeout)


__all__ = ["ScriptedCall", "scripted_call"]
