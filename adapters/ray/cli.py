"""`duetaspan serve --ray`: the flags, their mapping onto a `RayServeConfig`, and the command that joins
(or starts) a Ray cluster, deploys the application and waits. Imports nothing heavy until it runs.

Example:
    $ export TWILIO_ACCOUNT_SID=AC... TWILIO_AUTH_TOKEN=...
    $ duetaspan serve --twilio --ray --ray-address auto --host 0.0.0.0 --port 8000 \\
          --public-url https://agent.example.com --config agent.toml --max-calls 8 \\
          --min-replicas 2 --max-replicas 8
    $ duetaspan serve --webrtc --ray --model tiny-random --device cpu --port 8080   # the page, on replicas
    WebRTC page: http://localhost:8080/?token=...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from typing import Any

from duetaspan.errors import ConfigError

logger = logging.getLogger("duetaspan.ray")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `--ray` flags of `duetaspan serve`."""
    parser.add_argument(
        "--ray",
        action="store_true",
        help="run on Ray Serve: engine replicas (one per GPU, --max-calls slots each) behind an ingress on "
        "Serve's proxy at --host:--port (with --twilio and/or --webrtc)",
    )
    parser.add_argument(
        "--ray-address",
        help="Ray cluster to join (auto, ray://head:10001; default: $RAY_ADDRESS, else a local cluster)",
    )
    parser.add_argument(
        "--min-replicas", type=int, default=1, help="engine replicas kept running (default 1)"
    )
    parser.add_argument("--max-replicas", type=int, help="autoscaling ceiling (default: --min-replicas)")
    parser.add_argument(
        "--gpus-per-replica", type=float, help="GPUs per engine replica (default 1; 0 with --device cpu)"
    )
    parser.add_argument("--cpus-per-replica", type=float, default=1.0, help="CPUs reserved per replica")


def config_from_cli(args: argparse.Namespace) -> Any:
    """The `RayServeConfig` the flags and `--config` describe (flags first; credentials from the variables
    `[twilio]` names, TWILIO_ACCOUNT_SID / TWILIO_AUTH_TOKEN by default)."""
    from duetaspan.adapters.ray.config import AgentSpec, RayServeConfig, ReplicaOptions, webrtc_settings

    webrtc = bool(getattr(args, "webrtc", False))
    if not args.twilio and not webrtc:
        raise ConfigError(
            "--ray serves Twilio and/or WebRTC calls: add --twilio (and --public-url) or --webrtc"
        )
    from duetaspan.access import admin_token, local_demo
    from duetaspan.config import AgentConfig
    from duetaspan.observability.metrics import metrics_token

    agent_config = None
    if args.config:
        if not args.config.is_file():
            raise ConfigError(f"--config {args.config}: no such file")
        agent_config = AgentConfig.load(args.config)
    twilio: dict[str, Any] = {}
    if args.twilio:
        from duetaspan.serving import twilio_settings

        # --public-url, else [twilio] public_url; credentials from the variables [twilio] names
        settings = twilio_settings(agent_config or AgentConfig(), args.public_url)
        twilio = {"public_url": settings.public_url, "credentials": settings.credentials}
    page = None
    if webrtc:
        page = webrtc_settings(agent_config or AgentConfig(), bool(getattr(args, "allow_force_ret", False)))
    gpus = args.gpus_per_replica
    if gpus is None:
        gpus = 0.0 if (args.device or "").startswith("cpu") else 1.0
    replica: dict[str, Any] = {
        "num_gpus": gpus,
        "num_cpus": args.cpus_per_replica,
        "min_replicas": args.min_replicas,
        "max_replicas": max(args.max_replicas or args.min_replicas, args.min_replicas, 1),
    }
    if args.max_calls:
        replica["max_calls"] = args.max_calls
    try:
        return RayServeConfig(
            **twilio,
            webrtc=page,
            agent=AgentSpec(
                config=agent_config,
                model=args.model,
                device=args.device,
                record_dir=str(args.record_dir) if args.record_dir else None,
                retrieval=not args.no_retrieval,
                engine_process=bool(getattr(args, "engine_process", False)),
            ),
            replica=ReplicaOptions(**replica),
            metrics_token=metrics_token(agent_config.server.metrics_token if agent_config else None),
            admin_token=admin_token(),
            # the first-run demo (Serve's proxy on loopback, no public URL): roles go without their tokens
            local_demo=local_demo(
                getattr(args, "host", None) or (agent_config or AgentConfig()).server.host,
                twilio.get("public_url"),
            ),
        )
    except ValueError as exc:
        raise ConfigError(f"--ray: {exc}") from None


async def run(args: argparse.Namespace) -> int:
    """Join (or start) a Ray cluster, deploy on Serve's proxy at --host:--port, wait until interrupted, then
    delete the application (its replicas drain their calls first)."""
    from duetaspan.adapters.ray.app import build_app, import_serve
    from duetaspan.config import AgentConfig

    config = config_from_cli(args)
    server = (config.agent.config or AgentConfig()).server
    host, port = args.host or server.host, server.port if args.port is None else args.port
    serve = import_serve()
    import ray

    await asyncio.to_thread(ray.init, address=args.ray_address or None, logging_level=logging.WARNING)
    deployed = False
    try:
        await asyncio.to_thread(serve.start, http_options={"host": host, "port": port})
        logger.info("deploying on Ray Serve; the engine replicas load the model first")
        app = build_app(config)
        deployed = True
        await asyncio.to_thread(serve.run, app, name=config.app_name, route_prefix="/")
        logger.info(
            "ready: Serve proxy on %s:%d; %d-%d engine replicas x %d slots",
            host,
            port,
            config.replica.min_replicas,
            config.replica.max_replicas,
            config.replica.max_calls,
        )
        if config.twilio:
            print(f"ready: {config.public_url}/twilio/voice", flush=True)
        if config.webrtc is not None:
            from duetaspan.adapters.webrtc.serve import announce
            from duetaspan.adapters.webrtc.service import WebRTCService

            announce(WebRTCService(config.webrtc), host, port)
        await asyncio.Event().wait()
    finally:
        if deployed:
            logger.info("stopping: deleting the application (live calls drain first)")
            with contextlib.suppress(Exception):
                serve.delete(config.app_name)
        ray.shutdown()
    return 0
