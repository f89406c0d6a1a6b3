"""A Pipecat bot on Pipecat's own Twilio stack, with the duplex model in place of STT + LLM + TTS.

Everything around the model is stock Pipecat: the development runner's `/ws` route, its Twilio handshake
parser, `TwilioFrameSerializer` over `FastAPIWebsocketTransport`, `LLMContextAggregatorPair` keeping the
conversation, a `PipelineWorker` with metrics on. Only the service is ours:

    Pipeline([transport.input(), ctx.user(), agent.service(call), transport.output(), ctx.assistant()])

Run it with Pipecat's runner (the agent loads once per process, from `agent.toml` beside this file or the
file `AGENT_CONFIG` names):

    python examples/pipecat_twilio/bot.py -t twilio -x YOUR-TUNNEL-HOST

Twilio credentials (`TWILIO_ACCOUNT_SID`, `TWILIO_AUTH_TOKEN`) let the serializer hang up the call when the
pipeline ends (also when the engine has no free slot for it); `TWILIO_API_BASE_URL` points those REST calls
elsewhere (a test double).

Pipecat's runner checks no Twilio signature: anyone who finds the tunnel's URL could start calls and run the
agent's tools. `protect(app, host)` puts `TwilioSignatureMiddleware` in front of the runner's app, so the
webhook (`POST /`) and the stream (`/ws`) must carry Twilio's `X-Twilio-Signature` for `https://HOST/` and
`wss://HOST/ws` (`TWILIO_AUTH_TOKEN`, or the webhook shared key `TWILIO_WEBHOOK_KEY_ID` /
`TWILIO_WEBHOOK_KEY_SECRET`); anything else is refused with 403 before the bot sees it.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipecat.frames.frames import ErrorFrame
from pipecat.observers.base_observer import BaseObserver
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.runner.types import RunnerArguments, WebSocketRunnerArguments
from pipecat.runner.utils import parse_telephony_websocket
from pipecat.serializers.twilio import TwilioFrameSerializer
from pipecat.transports.websocket.fastapi import FastAPIWebsocketParams, FastAPIWebsocketTransport
from pipecat.workers.runner import WorkerRunner

from duetaspan import Agent, CallInfo
from duetaspan.adapters.twilio.guard import TwilioSignatureMiddleware

HERE = Path(__file__).parent
TWILIO_RATE = 8000  # run the whole pipeline at Twilio's rate: nothing resamples but the service, once

log = logging.getLogger("examples.pipecat_twilio")


@dataclass
class CallRun:
    """What one call left behind: the conversation as the aggregators recorded it, and pipeline errors."""

    call_id: str
    context: LLMContext
    transcript: list[dict[str, str]] = field(default_factory=list)  # {"role", "content"} per finished turn
    assistant_turns_started: int = 0
    errors: list[ErrorFrame] = field(default_factory=list)


def twilio_serializer(stream_sid: str, call_sid: str) -> TwilioFrameSerializer:
    """Pipecat's Twilio serializer; it hangs up through Twilio's REST API when credentials are set."""
    account_sid, auth_token = os.getenv("TWILIO_ACCOUNT_SID"), os.getenv("TWILIO_AUTH_TOKEN")
    hang_up = bool(account_sid and auth_token)
    return TwilioFrameSerializer(
        stream_sid=stream_sid,
        call_sid=call_sid,
        account_sid=account_sid,
        auth_token=auth_token,
        base_url=os.getenv("TWILIO_API_BASE_URL") or None,
        params=TwilioFrameSerializer.InputParams(auto_hang_up=hang_up),
    )


async def run_bot(
    agent: Agent,
    runner_args: WebSocketRunnerArguments,
    *,
    observers: list[BaseObserver] | None = None,
    rate: int = TWILIO_RATE,
) -> CallRun:
    """One Twilio call on a started `agent`, from the runner's WebSocket to the call's end (`rate`: the
    pipeline's audio rates; anything but Twilio's 8 kHz makes the serializer resample)."""
    _, call_data = await parse_telephony_websocket(runner_args.websocket)
    call_sid = str(call_data.call_id)
    transport = FastAPIWebsocketTransport(
        runner_args.websocket,
        FastAPIWebsocketParams(
            audio_in_enabled=True,
            audio_out_enabled=True,
            add_wav_header=False,
            serializer=twilio_serializer(str(call_data.stream_id), call_sid),
        ),
    )
    call = CallInfo(
        call_sid,
        caller=call_data.from_number or None,  # TwiML <Parameter name="from_number"> (Pipecat's convention)
        called=call_data.to_number or None,
        transport="twilio",
        params=dict(call_data.body),
    )
    service = agent.service(call)  # takes its engine slot at StartFrame; logs from here on carry the call id
    run = CallRun(call_sid, LLMContext())
    ctx = LLMContextAggregatorPair(run.context)
    pipeline = Pipeline([transport.input(), ctx.user(), service, transport.output(), ctx.assistant()])
    worker = PipelineWorker(
        pipeline,
        params=PipelineParams(
            audio_in_sample_rate=rate,
            audio_out_sample_rate=rate,
            enable_metrics=True,
            enable_usage_metrics=True,
        ),
        observers=observers or [],
        idle_timeout_secs=runner_args.pipeline_idle_timeout_secs,
        enable_rtvi=False,  # Twilio carries no RTVI messages
    )

    @ctx.user().event_handler("on_user_turn_message_added")
    async def _user_said(_aggregator: Any, message: Any) -> None:
        run.transcript.append({"role": "user", "content": message.content})
        log.info("caller: %s", message.content)

    @ctx.assistant().event_handler("on_assistant_turn_started")
    async def _agent_starts(_aggregator: Any) -> None:
        run.assistant_turns_started += 1

    @ctx.assistant().event_handler("on_assistant_turn_stopped")
    async def _agent_said(_aggregator: Any, message: Any) -> None:
        if message.content:
            run.transcript.append({"role": "assistant", "content": message.content})
            log.info("agent: %s", message.content)

    @worker.event_handler("on_pipeline_error")
    async def _error(_worker: Any, frame: ErrorFrame) -> None:
        run.errors.append(frame)  # e.g. no free engine slot: the pipeline then ends and Twilio hangs up

    @transport.event_handler("on_client_disconnected")
    async def _hung_up(_transport: Any, _websocket: Any) -> None:
        await worker.cancel()

    runner = WorkerRunner(handle_sigint=runner_args.handle_sigint)
    await runner.add_workers(worker)
    await runner.run()
    return run


@functools.cache  # the runner gives `bot()` no app state to keep it in; one engine per process is the point
def _process_agent() -> tuple[Agent, asyncio.Lock]:
    """The agent of this process (one engine for all its calls), configured by `agent.toml`."""
    return Agent.from_config(os.getenv("AGENT_CONFIG") or HERE / "agent.toml"), asyncio.Lock()


async def bot(runner_args: RunnerArguments) -> None:
    """Pipecat's development runner calls this once per call."""
    if not isinstance(runner_args, WebSocketRunnerArguments):
        raise TypeError(
            f"this bot answers Twilio Media Streams (-t twilio), got {type(runner_args).__name__}"
        )
    agent, lock = _process_agent()
    async with lock:
        await agent.start()  # loads the model on the first call; later calls find it running
    await run_bot(agent, runner_args)


def protect(app: Any, host: str | None, env: Any = os.environ) -> None:
    """Refuse Twilio requests to `app` (the runner's FastAPI app) without a valid signature for `host`."""
    if not host:
        raise SystemExit("error: pass -x YOUR-TUNNEL-HOST: Twilio's signatures are checked against that host")
    if not env.get("TWILIO_AUTH_TOKEN"):
        raise SystemExit("error: set TWILIO_AUTH_TOKEN: without it Twilio's signatures cannot be checked")
    app.add_middleware(
        TwilioSignatureMiddleware,
        public_url=f"https://{host}",
        auth_token=env["TWILIO_AUTH_TOKEN"],
        shared_key_id=env.get("TWILIO_WEBHOOK_KEY_ID") or None,
        shared_key_secret=env.get("TWILIO_WEBHOOK_KEY_SECRET") or None,
        webhook_paths=["/"],  # the runner's TwiML webhook
        stream_paths=["/ws", "/ws/*"],  # its Media Stream socket
    )


def _proxy_host(argv: list[str]) -> str | None:
    """The runner's `-x/--proxy` host (the runner parses its own arguments again in `main()`)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("-x", "--proxy")
    return parser.parse_known_args(argv)[0].proxy


if __name__ == "__main__":
    import sys

    from pipecat.runner.run import app, main

    from duetaspan.logs import bridge_logging

    bridge_logging(logging.INFO)  # Pipecat's loguru and the SDK's logging, one stream with call ids
    protect(app, _proxy_host(sys.argv[1:]))
    main()
