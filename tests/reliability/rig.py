"""A served agent for call-level fault, hostile-input and secrets tests: an in-process `Agent` (tiny-random
engine, loaded once per test module and shared) behind the real Twilio routes on uvicorn, its router and ASR
pointed at scripted loopback servers, calls placed by `TwilioPeer` over real sockets.

`Rig.call(sid, script)` streams a short recorded phrase then silence at real time while `script(live)` drives
the call: force `<ret>`s (as the model would sample them), wait for call time or for retrievals to end, hang
up. Each fault is thus provoked at a known moment of a live call.

Example:
    >>> async def test_x(tiny_engine, tmp_path):                     # doctest: +SKIP
    ...     async with served(tiny_engine, tmp_path, asr={"default": "what time is it in tokyo"}) as rig:
    ...         async def script(live):
    ...             await live.until(2.5); live.ret(); await live.retrievals(1)
    ...         result = await rig.call("CA1", script)
    ...         assert rig.outcomes(result.record)[0][-1] == "delivered"
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from duetaspan.adapters.twilio.service import TwilioService
from duetaspan.agent import Agent
from duetaspan.pipeline.artifacts import read_events
from tests.adapters.twilio.peer import ACCOUNT_SID, Received, TwilioPeer, serve_agent_on_twilio
from tests.fakes.asr_server import ScriptedASRServer
from tests.fakes.llm_server import ScriptedLLMServer
from tests.support import load_twilio_stream

TERMINAL = ("delivered", "late", "no_span", "error", "cancelled")
SILENCE = base64.b64encode(b"\xff" * 160).decode()
TOKYO = {"tool_call": {"name": "get_time", "arguments": {"place": "Tokyo"}}}
ROUTER_KEY = "sk-rig-router-key-5b1e0d77"  # a fake secret: the router's API key


@dataclass
class CallResult:
    call_sid: str
    got: Received
    record: dict[str, Any]
    session: Any


@dataclass
class Rig:
    peer: TwilioPeer
    service: TwilioService
    agent: Agent
    llm: ScriptedLLMServer
    asr: ScriptedASRServer
    record_dir: Path
    sessions: dict[str, Any] = field(default_factory=dict)

    async def session(self, call_sid: str, timeout_s: float = 20.0) -> Any:
        for _ in range(int(timeout_s / 0.02)):
            session = self.sessions.get(call_sid)
            if session is not None and session.service.slot is not None:
                return session
            await asyncio.sleep(0.02)
        raise AssertionError(f"call {call_sid} never reached the agent")

    async def call(
        self,
        call_sid: str,
        script: Callable[[LiveCall], Awaitable[Any]],
        *,
        phrase: str = "greeting",
        speech_s: float = 2.0,
        max_s: float = 30.0,
    ) -> CallResult:
        """One call: `speech_s` of `phrase`, then silence for as long as `script(live)` runs (at most `max_s`),
        then `stop` (or, when the script called `live.hang_up()`, the socket just drops)."""
        messages = call_stream(call_sid, phrase, speech_s, max_s)[:-1]  # the script decides when it ends
        stream_sid = messages[1]["streamSid"]
        url = await self.peer.stream_url(call_sid)
        async with self.peer.open_stream(url) as ws:
            play = asyncio.create_task(self.peer.play(ws, messages, wait_close_s=15))
            live = LiveCall(self, call_sid, await self.session(call_sid), asyncio.get_running_loop().time())
            await asyncio.wait_for(script(live), max_s)
            if live.hung_up:
                play.cancel()
                await ws.close()
            else:  # a sequence number past anything `play` will have used
                await ws.send(
                    json.dumps({"event": "stop", "sequenceNumber": "999999", "streamSid": stream_sid})
                )
            with contextlib.suppress(asyncio.CancelledError):
                got = await play
        if live.hung_up:
            got = Received(close_code=ws.close_code)
        record = await self.record(call_sid)
        return CallResult(call_sid, got, record, live.session)

    async def record(self, call_sid: str, timeout_s: float = 20.0) -> dict[str, Any]:
        path = self.record_dir / f"{call_sid}.json"
        for _ in range(int(timeout_s / 0.05)):
            if path.exists() and call_sid in self.service.finished:
                return json.loads(path.read_text())
            await asyncio.sleep(0.05)
        raise AssertionError(f"no complete record for {call_sid}")

    @staticmethod
    def outcomes(record: dict[str, Any]) -> list[list[str]]:
        """The event kinds of each retrieval of a call, in order (dedup'd `<ret>`s left out)."""
        runs: dict[int, list[str]] = {}
        for ev in record["retrieval_events"] + record["late_spans"] + record["no_spans"]:
            rid = ev.get("retrieval_id", 0)
            if rid:
                runs.setdefault(rid, []).append(ev.get("kind", ev["type"]))
        for kinds in runs.values():
            kinds.sort(key=lambda k: TERMINAL.index(k) if k in TERMINAL else -1)
        return [runs[r] for r in sorted(runs)]

    @staticmethod
    def events(record: dict[str, Any], kind: str) -> list[dict[str, Any]]:
        every = record["retrieval_events"] + record["late_spans"] + record["no_spans"]
        return [e for e in every if e.get("kind") == kind]


@dataclass
class LiveCall:
    """What a call script drives: `<ret>`s, waits on call time and on finished retrievals, a hang-up."""

    rig: Rig
    call_sid: str
    session: Any
    t0: float
    hung_up: bool = False

    def ret(self) -> None:
        """Force a `<ret>` on the next frame, as if the model sampled it."""
        self.session.service.slot.force_ret()

    async def until(self, t: float) -> None:
        """Sleep until call time `t` (seconds since the call reached the agent)."""
        await asyncio.sleep(max(0.0, self.t0 + t - asyncio.get_running_loop().time()))

    def finished_retrievals(self) -> int:
        events = read_events(self.session.service.recorder.jsonl_path)
        return sum(1 for e in events if e.get("retrieval_id") and e.get("kind") in TERMINAL)

    async def retrievals(self, n: int, timeout_s: float = 15.0) -> None:
        """Wait until `n` retrievals of this call have ended (delivered, late, no span, failed, cancelled)."""
        for _ in range(int(timeout_s / 0.05)):
            if self.finished_retrievals() >= n:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{self.call_sid}: {self.finished_retrievals()} of {n} retrievals ended")

    async def landed(self, timeout_s: float = 15.0) -> None:
        """Wait until every span delivered so far has landed in the model's streams (a `span` event each):
        `delivered` only says the engine took it, and the call's end drops one still queued."""
        for _ in range(int(timeout_s / 0.05)):
            events = read_events(self.session.service.recorder.jsonl_path)
            queued = sum(1 for e in events if e.get("type") == "retrieval" and e.get("kind") == "delivered")
            if sum(1 for e in events if e.get("type") == "span") >= queued:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{self.call_id}: a delivered span has not landed in {timeout_s} s")

    async def spoken(self, seconds: float) -> None:
        """Let the call run `seconds` longer (audio flows both ways)."""
        await asyncio.sleep(seconds)

    def hang_up(self) -> None:
        self.hung_up = True


def call_stream(call_sid: str, phrase: str, speech_s: float, silence_s: float) -> list[dict[str, Any]]:
    recorded = load_twilio_stream(phrase)
    connected, start = recorded[0], json.loads(json.dumps(recorded[1]))
    start["start"]["callSid"], start["start"]["accountSid"] = call_sid, ACCOUNT_SID
    sid = start["streamSid"]
    payloads = [m["media"]["payload"] for m in recorded if m["event"] == "media"][: round(speech_s / 0.02)]
    payloads += [SILENCE] * round(silence_s / 0.02)
    media = [
        {
            "event": "media",
            "streamSid": sid,
            "media": {"track": "inbound", "chunk": str(n + 1), "timestamp": str(20 * n), "payload": p},
        }
        for n, p in enumerate(payloads)
    ]
    return [connected, start, *media, {"event": "stop", "streamSid": sid, "stop": {"callSid": call_sid}}]


@contextlib.asynccontextmanager
async def served(
    engine: Any,
    tmp_path: Path,
    *,
    llm: dict[str, Any] | None = None,
    asr: dict[str, Any] | None = None,
    tools: Sequence[Any] = (),
    builtins: Sequence[str] = ("get_time",),
    mcp_servers: Sequence[Any] = (),
    deadline_s: float = 2.0,
    router_timeout_s: float = 1.0,
    max_calls: int = 4,
) -> AsyncIterator[Rig]:
    llm_server = ScriptedLLMServer(llm or {"default": TOKYO})
    asr_server = ScriptedASRServer(asr or {"default": "What time is it in Tokyo?"})
    record_dir = tmp_path / "calls"
    async with llm_server.serve() as llm_url, asr_server.serve() as asr_url:
        agent = Agent(
            engine=engine,
            persona="You answer the phone for a test.",
            builtins=list(builtins),
            tools=list(tools),
            mcp_servers=list(mcp_servers),
            router={
                "base_url": f"{llm_url}/v1",
                "model": "scripted",
                "api_key_env": "DUETASPAN_RIG_KEY",
                "timeout_s": router_timeout_s,
            },
            asr={"kind": "transcribe", "url": f"{asr_url}/transcribe", "timeout_s": 1.0},
            capture={"final_window_s": 0.5, "wait_s": 0.3},
            retrieval={"deadline_s": deadline_s},
            max_calls=max_calls,
            record_dir=record_dir,
            seed=0,
        )
        rig_sessions: dict[str, Any] = {}
        create = agent.create_session

        def capture(*args: Any, **kwargs: Any) -> Any:
            session = create(*args, **kwargs)
            rig_sessions[session.call.call_id] = session
            return session

        agent.create_session = capture  # type: ignore[method-assign]
        async with agent, serve_agent_on_twilio(agent) as (peer, service):
            yield Rig(peer, service, agent, llm_server, asr_server, record_dir, rig_sessions)
