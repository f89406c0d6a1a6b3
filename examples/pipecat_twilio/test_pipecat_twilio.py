"""The Pipecat bot on Pipecat's own Twilio stack, driven by a real Twilio Media Streams client over a real
WebSocket with recorded mu-law audio: `FastAPIWebsocketTransport` + `TwilioFrameSerializer` +
`LLMContextAggregatorPair` around `agent.service(call)`, served like Pipecat's development runner serves its
`/ws` route, hanging up through a loopback stand-in of Twilio's REST API.

The engine is the deterministic scripted engine of the pipeline tests (it speaks 6 frames, is silent for 8,
says " hi" every 2nd frame): what is under test is the Pipecat contract, not what a random model says. The
router and the ASR are the scripted loopback servers.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from fastapi import FastAPI, WebSocket
from pipecat.frames.frames import (
    EndFrame,
    Frame,
    LLMServiceMetadataFrame,
    MetricsFrame,
    TranscriptionFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.metrics.metrics import ProcessingMetricsData, TTFBMetricsData
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.runner.types import WebSocketRunnerArguments
from twilio.request_validator import RequestValidator
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from duetaspan import Agent, CallInfo
from duetaspan.logs import bridge_logging
from duetaspan.pipeline.artifacts import load_call_record
from duetaspan.pipeline.service import DuetaSpanService
from duetaspan.pipeline.service_metrics import ClockLatenessMetricsData, DuplexUsageMetricsData
from duetaspan.testing import ScriptedASR, ScriptedLLM, tool_call, wait_until
from examples.pipecat_twilio.bot import CallRun, run_bot
from tests.adapters.twilio.peer import ACCOUNT_SID, AUTH_TOKEN, FakeTwilioRest, renumber, run_uvicorn
from tests.pipeline.scripted_engine import ScriptedEngine
from tests.support import REPO_ROOT, free_port, load_twilio_stream, stop_process

BOT = Path(__file__).parent / "bot.py"
CALL_SID = "CA" + "7" * 32
CALLER = "+15550001111"
HEARD = "I'd like to book a table for four people at seven tonight."  # book_table's words
SILENCE_ULAW = base64.b64encode(b"\xff" * 160).decode()  # 20 ms of mu-law silence


class FramesSeen(BaseObserver):
    """Every frame the service pushes, with its direction."""

    def __init__(self) -> None:
        super().__init__()
        self.pushed: list[tuple[Frame, Any]] = []

    async def on_push_frame(self, data: FramePushed) -> None:
        if isinstance(data.source, DuetaSpanService):
            self.pushed.append((data.frame, data.direction))

    def of(self, cls: type) -> list:
        return [f for f, _ in self.pushed if isinstance(f, cls)]


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class Served:
    """The bot behind a runner-style `/ws` route, and what it did."""

    url: str
    runs: list[CallRun] = field(default_factory=list)
    services: list[DuetaSpanService] = field(default_factory=list)
    observer: FramesSeen = field(default_factory=FramesSeen)


@contextlib.asynccontextmanager
async def serve_bot(agent: Agent):
    """A FastAPI app with the route Pipecat's runner gives a `-t twilio` bot: `/ws` accepts, builds the
    `WebSocketRunnerArguments` and awaits the bot for the whole call."""
    app = FastAPI()
    served = Served("")
    service = agent.service

    def capture(call: Any) -> DuetaSpanService:
        made = service(call)
        served.services.append(made)
        return made

    agent.service = capture  # type: ignore[method-assign]

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        runner_args = WebSocketRunnerArguments(websocket=websocket, session_id="test-session")
        served.runs.append(await run_bot(agent, runner_args, observers=[served.observer]))

    async with run_uvicorn(app) as base:
        served.url = base.replace("http://", "ws://") + "/ws"
        yield served


def media(payload: str) -> dict:
    return {"event": "media", "streamSid": "", "media": {"track": "inbound", "payload": payload}}


async def play_call(
    url: str, messages: list[dict], then_silence_s: float, during=None, ready=None
) -> dict[str, Any]:
    """Twilio's side of one call: `connected` and `start`, then (once `ready()` returns, when given) the
    recorded media paced at 20 ms, then silence, then the caller hangs up (the socket closes). Returns the
    server's messages with arrival times."""
    got: dict[str, Any] = {"messages": [], "times": [], "closed_by_server": False}
    head, stream = messages[:2], [m for m in messages[2:] if m.get("event") != "stop"]
    silence = [media(SILENCE_ULAW)] * int(then_silence_s / 0.02)
    async with connect(url, max_size=None) as ws:

        async def read() -> None:
            with contextlib.suppress(ConnectionClosed):
                async for raw in ws:
                    got["messages"].append(json.loads(raw))
                    got["times"].append(time.monotonic())

        reader = asyncio.create_task(read())
        jobs = [asyncio.create_task(during())] if during else []
        for msg in head:
            await ws.send(json.dumps(msg))
        if ready is not None:  # a loaded machine may take a while to start the pipeline: speak once it runs
            await ready()
        start, n = time.monotonic(), 0
        for msg in stream + silence:
            if msg.get("event") == "media":
                msg = {**msg, "streamSid": head[1]["streamSid"]}
                await asyncio.sleep(max(0.0, start + n * 0.02 - time.monotonic()))
                n += 1
            if reader.done():
                break
            with contextlib.suppress(ConnectionClosed):
                await ws.send(json.dumps(msg))
        got["closed_by_server"] = reader.done()  # before the caller was done talking
        for job in jobs:
            await job
    await asyncio.wait_for(reader, 10)
    return got


def scripted_agent(engine: ScriptedEngine, llm_url: str, asr_url: str, record_dir: Any, **kw: Any) -> Agent:
    return Agent(
        persona="You are Ada, the front desk of a small hotel.",
        engine=engine,
        builtins=["get_time"],
        router={"base_url": f"{llm_url}/v1", "model": "scripted", "api_key_env": None},
        asr={"kind": "transcribe", "url": f"{asr_url}/transcribe"},
        record_dir=record_dir,
        seed=0,
        **kw,
    )


# serial: a real-time call whose TTFB (wall clock: the caller's stop to the agent's first audio) is held to one
# speak/silence cycle; at the workers' nice 19 the engine's ticks waited for a core and it read 1.66 s (r31, 3.13)
@pytest.mark.serial
async def test_pipecat_twilio_bot_speaks_records_and_hangs_up(tmp_path, monkeypatch):
    rest = FakeTwilioRest()
    llm = ScriptedLLM({"default": {**tool_call("get_time", city="Tokyo"), "delay_s": 1.5}})
    asr = ScriptedASR({"default": HEARD})
    # speaks 6 frames, silent 8: it stops at 1.6 s, 2.7 s ..., while the caller talks
    engine = ScriptedEngine(max_slots=2, speak=(6, 8), word_every=2)
    handler = ListHandler()
    bridge = bridge_logging(logging.DEBUG, handler=handler)
    try:
        async with rest.running() as rest_url, llm.serve() as llm_url, asr.serve() as asr_url:
            monkeypatch.setenv("TWILIO_ACCOUNT_SID", ACCOUNT_SID)
            monkeypatch.setenv("TWILIO_AUTH_TOKEN", AUTH_TOKEN)
            monkeypatch.setenv("TWILIO_API_BASE_URL", rest_url)
            # a generous retrieval deadline: the span must land on a loaded machine too
            agent = scripted_agent(
                engine, llm_url, asr_url, tmp_path / "calls", retrieval={"deadline_s": 8.0}
            )
            async with agent, serve_bot(agent) as served:
                spans: list[Any] = []

                async def running() -> DuetaSpanService:
                    svc = await wait_until(lambda: served.services and served.services[0], 30, "the service")
                    await asyncio.wait_for(svc.started.wait(), 30)
                    return svc

                async def ask_mid_call() -> None:
                    # a <ret> while the caller talks: its tool runs across the barge-ins that follow
                    svc = await running()

                    @svc.event_handler("on_span")
                    async def _span(_service: Any, frame: Any) -> None:
                        spans.append(frame)

                    await asyncio.sleep(0.9)  # the tool then runs 1.5 s (the deadline is 2.5 s) over 1.6 s
                    svc.slot.force_ret()

                # book_table: the caller talks from 0.5 s to 4 s almost without a pause
                stream = renumber(load_twilio_stream("book_table"), CALL_SID)
                stream[1]["start"]["customParameters"] = {"from_number": CALLER}
                got = await play_call(
                    served.url, stream, then_silence_s=3.0, during=ask_mid_call, ready=running
                )
                await wait_until(lambda: served.runs, 20, "the bot to return")
    finally:
        bridge.close()
    run, service, seen = served.runs[0], served.services[0], served.observer

    # 6: the pipeline's 8 kHz end to end: the service resamples once; Twilio gets steady 40 ms chunks
    sizes = [len(base64.b64decode(m["media"]["payload"])) for m in got["messages"] if m["event"] == "media"]
    times = [t for m, t in zip(got["messages"], got["times"], strict=True) if m["event"] == "media"]
    assert len(sizes) > 100 and max(sizes) == 320  # 40 ms of 8 kHz mu-law, never an 1100-byte burst
    # never ahead of real time, so never in bursts (this loop also plays the caller, so single arrival gaps are
    # noisy; the pace over the call is not). Slower is a loaded machine's skipped engine ticks.
    pace = (len(times) - 1) * 0.04 / (times[-1] - times[0])
    assert 0.5 <= pace <= 1.2, pace

    # 2: agent speech reached the context through Pipecat's own aggregators
    meta = seen.of(LLMServiceMetadataFrame)
    assert meta and all(m.is_realtime_service for m in meta)
    agent_lines = [m for m in run.context.get_messages() if m.get("role") == "assistant"]
    assert len(agent_lines) >= 2 and all("hi" in m["content"] for m in agent_lines)
    assert run.assistant_turns_started >= 2
    assert sum(1 for line in run.transcript if line["role"] == "assistant") >= 2

    # 3: the caller's turns from the capture's VAD; the transcript (ISO time, caller id) in the context
    assert seen.of(UserStartedSpeakingFrame) and seen.of(UserStoppedSpeakingFrame)
    transcripts = seen.of(TranscriptionFrame)
    assert transcripts and transcripts[0].text == HEARD and transcripts[0].user_id == CALLER
    assert dt.datetime.fromisoformat(transcripts[0].timestamp).tzinfo is not None
    assert {"role": "user", "content": HEARD} in [dict(m) for m in run.context.get_messages()]

    # 4: TTFB, processing per tick, clock lateness apart, usage
    data = [d for f in seen.of(MetricsFrame) for d in f.data if d.model == "duetaspan"]
    ttfb = [d.value for d in data if isinstance(d, TTFBMetricsData)]
    assert ttfb and all(0.0 <= v < 1.5 for v in ttfb)  # within one 1.12 s speak/silence cycle
    assert any(isinstance(d, ProcessingMetricsData) for d in data)
    assert any(isinstance(d, ClockLatenessMetricsData) for d in data)
    usage = [d.value for d in data if isinstance(d, DuplexUsageMetricsData)]
    assert usage and usage[-1].frames_out > 50 and usage[-1].speaking_frames > 0

    # 5: the model stopping for the caller clears Twilio's buffer; the call and its retrieval go on
    clears = [i for i, m in enumerate(got["messages"]) if m["event"] == "clear"]
    assert clears and service.stats["barge_ins"] >= len(clears) >= 1
    assert any(m["event"] == "media" for m in got["messages"][clears[-1] :])
    assert len(spans) == 1 and spans[0].tool == "get_time"  # the tool's answer landed all the same

    # 7: one log stream: Pipecat's (loguru) and ours (logging), each record stamped with the call id
    in_call = [r for r in handler.records if getattr(r, "call_id", "-") == CALL_SID]
    assert any(r.name.startswith("pipecat.") for r in in_call)
    assert any(r.name.startswith("duetaspan.") for r in in_call)

    # the contract: artifacts written when the pipeline ended (the caller hung up: cancelled), the slot freed
    record = load_call_record(tmp_path / "calls", CALL_SID)
    assert record["complete"] and record["summary"]["ended_by"] == "cancel"
    assert record["meta"]["caller"] == CALLER and record["spans"][0]["tool"] == "get_time"
    asked, landed = record["rets"][0]["t"], record["spans"][0]["t"]
    assert any(asked < b["t"] < landed for b in record["barge_ins"])  # a barge-in while the tool ran
    assert engine.opened and engine.closed == engine.opened  # the call's slot was freed


async def test_no_free_slot_ends_the_pipeline_with_an_error_and_hangs_up(tmp_path, monkeypatch):
    rest = FakeTwilioRest()
    engine = ScriptedEngine(max_slots=1)
    async with rest.running() as rest_url:
        monkeypatch.setenv("TWILIO_ACCOUNT_SID", ACCOUNT_SID)
        monkeypatch.setenv("TWILIO_AUTH_TOKEN", AUTH_TOKEN)
        monkeypatch.setenv("TWILIO_API_BASE_URL", rest_url)
        agent = Agent(engine=engine, router=False, max_calls=1, record_dir=tmp_path / "calls")
        async with agent, serve_bot(agent) as served:
            busy = agent.service(CallInfo("CA-busy"))  # a call in progress holds the only slot
            await busy.attach()
            stream = renumber(load_twilio_stream("greeting"), CALL_SID)
            # the caller would stay on the line for 20 s: the pipeline has to end the call by itself
            got = await asyncio.wait_for(play_call(served.url, stream, then_silence_s=16.0), 40)
            await wait_until(lambda: served.runs, 20, "the bot to return")
            await busy.close()
    run = served.runs[0]
    assert got["closed_by_server"]  # the pipeline ended on its own: the transport closed the stream
    heard = b"".join(
        base64.b64decode(m["media"]["payload"]) for m in got["messages"] if m["event"] == "media"
    )
    assert set(heard) <= {0xFF}  # nothing but the end silence Pipecat's output transport sends at EndFrame
    assert len(run.errors) == 1 and "call slots are busy" in run.errors[0].error
    assert seen_end(served.observer)
    hangups = [r for r in rest.requests if r["path"].endswith(f"/Calls/{CALL_SID}.json")]
    assert len(hangups) == 1 and hangups[0]["form"]["Status"] == "completed"
    record = load_call_record(tmp_path / "calls", CALL_SID)
    assert record["complete"] and record["summary"]["ended_by"] == "refused"
    assert record["errors"][0]["stage"] == "admission"


def seen_end(observer: FramesSeen) -> bool:
    return any(isinstance(f, EndFrame) for f, _ in observer.pushed)


RUNNER_CONFIG = """
[persona]
prompt = "You answer the phone for a test."
[model]
preset = "tiny-random"
device = "cpu"
[router]
base_url = "{llm}/v1"
model = "scripted"
api_key_env = ""
[asr]
kind = "transcribe"
url = "{asr}/transcribe"
[recording]
enabled = true
dir = "{calls}"
"""


async def test_pipecat_development_runner_starts_the_bot(tmp_path):
    """`python bot.py -t twilio -x HOST`, Pipecat's own runner in its own process: its TwiML webhook points
    Twilio at `/ws`, where a Media Stream reaches `bot(runner_args)`, which loads the agent and answers."""
    llm, asr, rest = ScriptedLLM({}), ScriptedASR({"default": HEARD}), FakeTwilioRest()
    async with llm.serve() as llm_url, asr.serve() as asr_url, rest.running() as rest_url:
        config = tmp_path / "agent.toml"
        config.write_text(RUNNER_CONFIG.format(llm=llm_url, asr=asr_url, calls=tmp_path / "calls"))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TWILIO_", "OPENAI_", "PIPECAT_"))}
        env |= {
            "AGENT_CONFIG": str(config),
            "TWILIO_ACCOUNT_SID": ACCOUNT_SID,
            "TWILIO_AUTH_TOKEN": AUTH_TOKEN,
            "TWILIO_API_BASE_URL": rest_url,
            "PYTHONPATH": str(REPO_ROOT),
        }
        port = free_port()
        cmd = [sys.executable, str(BOT), "-t", "twilio", "-x", RUNNER_HOST, "--port", str(port)]
        proc = _spawn(cmd, env, tmp_path)
        try:
            base = f"http://localhost:{port}"
            twiml = await _wait_for_runner(base, proc, tmp_path / "runner.log")
            assert '<Stream url="wss://agent.example.test/ws">' in twiml
            refused = await _unsigned_requests(base)
            got = await _call_until_answered(base.replace("http://", "ws://") + "/ws")
        finally:
            stop_process(proc)
    # Twilio's signatures are checked on the webhook and the stream: unsigned or forged requests never reach
    # the bot (no TwiML, no call), signed ones do
    assert refused == {"webhook": [403, 403], "stream": [403, 403]}, refused
    assert (tmp_path / "runner.log").read_text().count("refused Twilio") == 4
    assert got["media"] >= 25, (tmp_path / "runner.log").read_text()[-3000:]  # the model answered, paced
    assert got["sizes"] <= {320}  # 40 ms chunks of 8 kHz mu-law
    record = await wait_until(lambda: _record(tmp_path / "calls"), 15, "the call's record")
    assert record["complete"] and record["summary"]["frames"] >= 10


RUNNER_HOST = "agent.example.test"  # the runner's -x: the public host Twilio signs URLs for


def _sign(url: str, params: dict[str, str] | None = None) -> str:
    return RequestValidator(AUTH_TOKEN).compute_signature(url, params or {})


async def _unsigned_requests(base: str) -> dict[str, list[int]]:
    """What the runner answers to a webhook and a stream upgrade without or with a forged signature."""
    out: dict[str, list[int]] = {"webhook": [], "stream": []}
    forged = {"X-Twilio-Signature": _sign(f"https://{RUNNER_HOST}/", {"CallSid": "CAforged"})}
    async with aiohttp.ClientSession() as http:
        for headers in ({}, forged):
            async with http.post(base + "/", headers=headers) as resp:
                out["webhook"].append(resp.status)
    for headers in ({}, {"X-Twilio-Signature": _sign("wss://elsewhere.test/ws")}):
        try:
            async with connect(base.replace("http://", "ws://") + "/ws", additional_headers=headers):
                out["stream"].append(101)
        except InvalidStatus as exc:
            out["stream"].append(exc.response.status_code)
    return out


def _spawn(cmd: list[str], env: dict[str, str], folder: Path) -> subprocess.Popen:
    with (folder / "runner.log").open("wb") as log:
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=folder)


def _record(calls: Any) -> dict | None:
    path = calls / f"{CALL_SID}.json"
    return json.loads(path.read_text()) if path.exists() else None


async def _wait_for_runner(base: str, proc: Any, log: Any, timeout_s: float = 120) -> str:
    """Poll the runner's `/status` until it is up; returns the TwiML of its `POST /` webhook."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the runner never came up"
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(base + "/status") as resp:
                    if resp.status == 200:
                        signed = {"X-Twilio-Signature": _sign(f"https://{RUNNER_HOST}/")}
                        async with http.post(base + "/", headers=signed) as twiml:
                            assert twiml.status == 200, twiml.status
                            return await twiml.text()
            await asyncio.sleep(0.3)


async def _call_until_answered(url: str, timeout_s: float = 120) -> dict[str, Any]:
    """Twilio's side: start the stream, speak, then keep the line open (silence) until a second of the
    agent's audio came back (the bot loads the model on its first call), then hang up."""
    stream = renumber(load_twilio_stream("greeting"), CALL_SID)
    head, media_msgs = stream[:2], [m for m in stream[2:] if m.get("event") == "media"]
    got: dict[str, Any] = {"media": 0, "sizes": set()}
    signed = {"X-Twilio-Signature": _sign(f"wss://{RUNNER_HOST}/ws")}
    async with connect(url, max_size=None, additional_headers=signed) as ws:
        for msg in head:
            await ws.send(json.dumps(msg))
        answered = asyncio.Event()

        async def read() -> None:
            with contextlib.suppress(ConnectionClosed):
                async for raw in ws:
                    msg = json.loads(raw)
                    if msg.get("event") == "media":
                        got["media"] += 1
                        got["sizes"].add(len(base64.b64decode(msg["media"]["payload"])))
                        if got["media"] >= 25:
                            answered.set()

        reader = asyncio.create_task(read())
        start, n = time.monotonic(), 0
        sid = head[1]["streamSid"]
        while not answered.is_set() and time.monotonic() - start < timeout_s:
            msg = media_msgs[n] if n < len(media_msgs) else {**media(SILENCE_ULAW), "streamSid": sid}
            await ws.send(json.dumps(msg))
            n += 1
            await asyncio.sleep(max(0.0, start + n * 0.02 - time.monotonic()))
        reader.cancel()
    return got
