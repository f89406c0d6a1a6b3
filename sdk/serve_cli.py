"""`duetaspan serve`: run an agent behind a web server that telephony transports mount onto. It builds the
agent from the flags and `--config`, then runs `Agent.serve` (`duetaspan.serving`): a script calling
`agent.serve(twilio=True, ...)` gets exactly the same server.

Relied-on contract (issue #6; keep these flags exactly):

    duetaspan serve --twilio --host H --port P --public-url https://PUBLIC [--config agent.toml]
                    [--model PRESET] [--model-dir DIR] [--record-dir DIR]

    duetaspan serve --webrtc [--host H --port P] [--config agent.toml] [--model PRESET] [--allow-force-ret]

    duetaspan serve --sip [--sip-port 5060] [--sip-transport udp|tcp|tls] [--sip-allow CIDR[,CIDR...]]
                    [--config agent.toml] [--model PRESET] [--max-calls N]   (a native SIP endpoint; docs/sip.md)

    duetaspan serve --twilio --ray [--ray-address auto] [--min-replicas N --max-replicas M] ...  (same routes,
                    served by Ray Serve's proxy; see `duetaspan.adapters.ray` and docs/SCALING.md)

Flags override `agent.toml`: `--host` / `--port` default to `[server]` (127.0.0.1:8080), `--public-url` to
`[twilio] public_url`. `--webrtc` serves the browser page at `/?token=...` (the URL is printed at start; see
`duetaspan.adapters.webrtc`). Twilio credentials come from `TWILIO_ACCOUNT_SID` / `TWILIO_AUTH_TOKEN` (or the
variables `[twilio] account_sid_env` / `auth_token_env` name; optionally `TWILIO_API_BASE_URL` to send REST
calls somewhere other than api.twilio.com). Routes: `POST /twilio/voice` (point the number's voice webhook
there), `WS /twilio/stream/<token>`, `POST /twilio/status`, `GET /health` (503 until the model is loaded,
then 200).

Example:
    export TWILIO_ACCOUNT_SID=AC... TWILIO_AUTH_TOKEN=...
    duetaspan serve --twilio --host 0.0.0.0 --port 8080 --public-url https://agent.example.com \\
        --config agent.toml --record-dir calls
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from duetaspan.errors import ConfigError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="answer calls with an agent (Twilio Media Streams, SIP, WebRTC browser page)",
        description="Serve an agent over telephony transports (what `agent.serve(...)` runs). Flags override "
        "agent.toml. Twilio credentials: TWILIO_ACCOUNT_SID, TWILIO_AUTH_TOKEN (or the variables [twilio] "
        "names; optional TWILIO_API_BASE_URL).",
    )
    p.add_argument("--twilio", action="store_true", help="serve Twilio Media Streams (/twilio/voice, ...)")
    from duetaspan.adapters.webrtc.serve import add_arguments as add_webrtc_arguments

    add_webrtc_arguments(p)
    from duetaspan.adapters.sip.serve import add_arguments as add_sip_arguments

    add_sip_arguments(p)
    from duetaspan.adapters.ray.cli import add_arguments as add_ray_arguments

    add_ray_arguments(p)
    p.add_argument("--host", help="interface to listen on (default: [server] host, else 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to listen on (default: [server] port, else 8080)")
    p.add_argument(
        "--public-url",
        help="the https URL Twilio reaches this server at (signatures are checked against it; "
        "default: [twilio] public_url)",
    )
    p.add_argument("--config", type=Path, help="agent.toml (persona, voice, tools, router, ...)")
    p.add_argument("--model", help="model preset, overriding the config (e.g. duetaspan-7b, tiny-random)")
    p.add_argument(
        "--model-dir",
        type=Path,
        help="local folder with the model's weights, looked in before the Hugging Face Hub "
        "(default: [model] dir, else $DUETASPAN_MODEL_DIR)",
    )
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
        agent = Agent.from_config(args.config, **overrides)
    else:
        agent = Agent(**overrides)
    if getattr(args, "model_dir", None) is not None:
        if not args.model_dir.is_dir():
            raise ConfigError(f"--model-dir {args.model_dir}: no such folder")
        agent.config.model.dir = args.model_dir.resolve()
    return agent


async def run(args: argparse.Namespace) -> int:
    """Build the agent from the flags, then `agent.serve(...)` until interrupted."""
    if getattr(args, "ray", False):  # engine replicas on a Ray cluster instead of this process
        from duetaspan.adapters.ray.cli import run as run_on_ray

        return await run_on_ray(args)
    from duetaspan.adapters.sip.serve import cli_options as sip_options

    sip = sip_options(args)  # flag errors before anything loads
    agent = _build_agent(args)  # cheap: the model loads inside serve, after the settings are checked
    await agent.serve(
        twilio=args.twilio,
        webrtc=args.webrtc,
        public_url=args.public_url,
        host=args.host,
        port=args.port,
        allow_force_ret=bool(getattr(args, "allow_force_ret", False)),
        sip=sip,
    )
    return 0
