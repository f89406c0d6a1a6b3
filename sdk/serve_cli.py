"""`duetaspan serve`: run an agent behind a web server that telephony transports mount onto.

Relied-on contract (issue #6; keep these flags exactly):

    duetaspan serve --twilio --host H --port P --public-url https://PUBLIC [--config agent.toml]
                    [--model PRESET] [--record-dir DIR]

    duetaspan serve --webrtc [--host H --port P] [--config agent.toml] [--model PRESET] [--allow-force-ret]

    duetaspan serve --twilio --ray [--ray-address auto] [--min-replicas N --max-replicas M] ...  (same routes,
                    served by Ray Serve's proxy; see `duetaspan.adapters.ray` and docs/SCALING.md)

`--webrtc` serves the browser page at `/?token=...` (the URL is printed at start; see
`duetaspan.adapters.webrtc`). Twilio credentials come from `TWILIO_ACCOUNT_SID` / `TWILIO_AUTH_TOKEN` (and
optionally `TWILIO_API_BASE_URL` to send REST calls somewhere other than api.twilio.com). Routes: `POST /twilio/voice`
(point the number's voice webhook there), `WS /twilio/stream/<token>`, `POST /twilio/status`, `GET /health`
(503 until the model is loaded, then 200).

Example:
    $ export TWILIO_ACCOUNT_SID=AC... TWILIO_AUTH_TOKEN=...
    $ duetaspan serve --twilio --host 0.0.0.0 --port 8080 --public-url https://agent.example.com \\
          --config agent.toml --record-dir calls
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path
from typing import Any

from duetaspan.errors import ConfigError

logger = logging.getLogger("duetaspan.serve")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="answer calls with an agent (Twilio Media Streams, WebRTC browser page)",
        description="Serve an agent over telephony transports. Twilio credentials: TWILIO_ACCOUNT_SID, "
        "TWILIO_AUTH_TOKEN (optional TWILIO_API_BASE_URL).",
    )
    p.add_argument("--twilio", action="store_true", help="serve Twilio Media Streams (/twilio/voice, ...)")
    from duetaspan.adapters.webrtc.serve import add_arguments as add_webrtc_arguments

    add_webrtc_arguments(p)
    from duetaspan.adapters.ray.cli import add_arguments as add_ray_arguments

    add_ray_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    p.add_argument(
        "--public-url",
        help="the https URL Twilio reaches this server at (signatures are checked against it)",
    )
    p.add_argument("--config", type=Path, help="agent.toml (persona, voice, tools, router, ...)")
    p.add_argument("--model", help="model preset, overriding the config (e.g. duetaspan-7b, tiny-random)")
    p.add_argument("--record-dir", type=Path, help="write each call's wav + JSON artifacts here")
    p.add_argument("--max-calls", type=int, help="concurrent calls (engine slots; default from the agent)")
    p.add_argument("--device", help="cuda, cpu or auto (default from the config)")
    p.add_argument(
        "--engine-process",
        action="store_true",
        help="run the model in its own process (one per GPU); a crashed engine ends its calls, not the server",
    )
    p.add_argument(
        "--no-retrieval",
        action="store_true",
        help="run without the LLM router (<ret> lands no span); for demos without an LLM",
    )
    p.set_defaults(func=run)


def _build_agent(args: argparse.Namespace) -> Any:
    from duetaspan.agent import Agent

    overrides: dict[str, Any] = {}
    if args.model:
        overrides["model"] = args.model
    if args.record_dir:
        overrides["record_dir"] = args.record_dir
    if args.max_calls:
        overrides["max_calls"] = args.max_calls
    if args.device:
        overrides["device"] = args.device
    if args.no_retrieval:
        overrides["router"] = False
    if args.engine_process:
        overrides["engine_process"] = True
    if args.config:
        if not args.config.is_file():
            raise ConfigError(f"--config {args.config}: no such file")
        return Agent.from_config(args.config, **overrides)
    return Agent(**overrides)


async def run(args: argparse.Namespace) -> int:
    """Load the agent, mount the transports, serve until interrupted."""
    from duetaspan.server import create_app, mount, serve

    if getattr(args, "ray", False):  # engine replicas on a Ray cluster instead of this process
        from duetaspan.adapters.ray.cli import run as run_on_ray

        return await run_on_ray(args)
    if not args.twilio and not args.webrtc:
        raise ConfigError("choose a transport to serve: --twilio and/or --webrtc")
    if args.twilio and not args.public_url:
        raise ConfigError("--public-url is required with --twilio (e.g. https://abc123.ngrok.app)")
    twilio = _twilio_service(args) if args.twilio else None  # credential errors before the model loads
    agent = _build_agent(args)
    ready = False
    app = create_app(ready=lambda: ready)
    if twilio is not None:
        mount(app, twilio, "twilio")
    webrtc = None
    if args.webrtc:
        from duetaspan.adapters.webrtc.serve import build_service

        webrtc = build_service(args, agent)
        mount(app, webrtc, "webrtc")
    server = asyncio.create_task(serve(app, host=args.host, port=args.port), name="duetaspan-server")
    try:
        async with agent:
            if twilio is not None:
                twilio.handler = _agent_handler(agent)
                # A dead engine (e.g. its process crashed) answers new calls with the busy message.
                twilio.set_max_calls(lambda: agent.max_calls if agent.runner and agent.runner.running else 0)
            if webrtc is not None:
                from duetaspan.adapters.webrtc.serve import announce

                webrtc.agent = agent
                announce(webrtc, args.host, args.port)
            ready = True
            if twilio is not None:
                logger.warning(
                    "ready: Twilio voice webhook %s (listening on %s:%d)",
                    twilio.settings.voice_url,
                    args.host,
                    args.port,
                )
            await server
    finally:
        if not server.done():
            server.cancel()
            await asyncio.gather(server, return_exceptions=True)
        if twilio is not None:  # the app's shutdown does this too, but not when the agent failed to start
            await twilio.aclose()
    return 0


def _twilio_service(args: argparse.Namespace) -> Any:
    from duetaspan.adapters.twilio.bridge import AGENT_IN_RATE
    from duetaspan.adapters.twilio.rest import TwilioCredentials
    from duetaspan.adapters.twilio.service import TwilioService, TwilioSettings

    try:
        settings = TwilioSettings(public_url=args.public_url, credentials=TwilioCredentials.from_env())
    except ValueError as exc:
        raise ConfigError(f"--public-url: {exc}") from None

    async def not_ready(call: Any) -> None:  # the webhook refuses calls (0 slots) until the agent is up
        await call.end_call("agent not ready", drain_s=0)

    return TwilioService(settings, not_ready, max_calls=0, in_rate=AGENT_IN_RATE)


def _agent_handler(agent: Any) -> Any:
    from duetaspan.adapters.twilio.bridge import agent_call_handler

    return agent_call_handler(agent)
