"""Builds the Ray Serve application (engine replicas + Twilio ingress) and runs it: `duetaspan serve --ray`,
or `serve run` / `serve deploy` with the application builder `duetaspan.adapters.ray.app:app_builder`.

Ray is imported here only, when a Ray deployment is actually built: the SDK works without it (install the
`ray` extra: `pip install 'duetaspan[ray]'`).

Example (a Serve config file, `serve deploy serve.yaml` on a running cluster):

    applications:
      - name: duetaspan
        route_prefix: /
        import_path: duetaspan.adapters.ray.app:app_builder
        args:
          public_url: https://agent.example.com
          agent_config: /srv/agent/agent.toml    # same path on every node
          replica: {max_calls: 8, num_gpus: 1, min_replicas: 2, max_replicas: 8}
        runtime_env:
          env_vars: {TWILIO_ACCOUNT_SID: AC..., TWILIO_AUTH_TOKEN: ...}

Or in Python:
    >>> # serve.run(build_app(RayServeConfig(public_url=..., credentials=...)), name="duetaspan", route_prefix="/")
"""

from __future__ import annotations

import argparse
import logging
import secrets
import signal
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from duetaspan.adapters.ray.config import AgentSpec, RayServeConfig, ReplicaOptions
from duetaspan.adapters.twilio.rest import TwilioCredentials
from duetaspan.errors import ConfigError, DuetaspanError

logger = logging.getLogger("duetaspan.ray")

ENGINE_DEPLOYMENT = "EngineReplica"
INGRESS_DEPLOYMENT = "RayIngress"


class RayUnavailable(DuetaspanError):
    """Ray Serve is not installed."""


def import_serve() -> Any:
    """`ray.serve`, or an actionable error when the `ray` extra is missing."""
    try:
        from ray import serve
    except ImportError as exc:
        raise RayUnavailable(
            f"Ray Serve is not installed ({exc}); install it with: pip install 'duetaspan[ray]'"
        ) from None
    return serve


def build_app(config: RayServeConfig, *, key: bytes | None = None) -> Any:
    """The Serve application: `EngineReplica` (autoscaled, one per GPU) bound into `RayIngress`.

    `key` seals stream tokens; every ingress replica of this application shares it (random by default).
    """
    serve = import_serve()
    from duetaspan.adapters.ray.ingress import RayIngress
    from duetaspan.adapters.ray.replica import EngineReplica

    r = config.replica
    actor_options: dict[str, Any] = {"num_cpus": r.num_cpus, "num_gpus": r.num_gpus}
    env = {"OMP_NUM_THREADS": str(max(1, int(r.num_cpus))), **r.env}
    actor_options["runtime_env"] = {"env_vars": env}
    engine = serve.deployment(
        EngineReplica,
        name=ENGINE_DEPLOYMENT,
        ray_actor_options=actor_options,
        max_ongoing_requests=r.max_calls,
        autoscaling_config=r.autoscaling(),
        graceful_shutdown_timeout_s=r.drain_timeout_s,
        graceful_shutdown_wait_loop_s=1.0,
        health_check_period_s=r.health_check_period_s,
    )
    ingress = serve.deployment(
        serve.ingress()(RayIngress),
        name=INGRESS_DEPLOYMENT,
        num_replicas=config.ingress_replicas,
        ray_actor_options={"num_cpus": config.ingress_num_cpus},
        # every live call holds one WebSocket on an ingress replica for its whole length
        max_ongoing_requests=10_000,
        graceful_shutdown_timeout_s=r.drain_timeout_s,
    )
    return ingress.bind(config, engine.bind(config), key or secrets.token_bytes(32))


class BuilderArgs(BaseModel):
    """The `args:` of a Serve config file for `app_builder` (Twilio credentials from the environment)."""

    public_url: str
    agent_config: Path | None = None
    model: str | None = None
    device: str | None = None
    record_dir: str | None = None
    retrieval: bool = True
    replica: ReplicaOptions = Field(default_factory=ReplicaOptions)
    ingress_replicas: int = 1
    placement_timeout_s: float = 5.0
    app_name: str = "duetaspan"


def app_builder(args: BuilderArgs) -> Any:
    """Serve application builder (`import_path: duetaspan.adapters.ray.app:app_builder`)."""
    return build_app(config_from_builder_args(args))


def config_from_builder_args(args: BuilderArgs | dict[str, Any]) -> RayServeConfig:
    args = BuilderArgs.model_validate(args)
    agent_config = None
    if args.agent_config is not None:
        from duetaspan.config import AgentConfig

        if not args.agent_config.is_file():
            raise ConfigError(f"agent_config {args.agent_config}: no such file")
        agent_config = AgentConfig.load(args.agent_config)
    try:
        credentials = TwilioCredentials.from_env()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return RayServeConfig(
        public_url=args.public_url,
        credentials=credentials,
        agent=AgentSpec(
            config=agent_config,
            model=args.model,
            device=args.device,
            record_dir=args.record_dir,
            retrieval=args.retrieval,
        ),
        replica=args.replica,
        ingress_replicas=args.ingress_replicas,
        placement_timeout_s=args.placement_timeout_s,
        app_name=args.app_name,
    )


# --- `duetaspan serve --ray` -----------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `--ray` flags of `duetaspan serve`."""
    parser.add_argument(
        "--ray",
        action="store_true",
        help="run on Ray Serve: engine replicas (one per GPU) behind a Twilio ingress (needs --twilio)",
    )
    parser.add_argument(
        "--ray-address",
        help="Ray cluster to join (e.g. auto, ray://head:10001; default: $RAY_ADDRESS or a local cluster)",
    )
    parser.add_argument(
        "--min-replicas", type=int, default=1, help="engine replicas kept running (default 1)"
    )
    parser.add_argument("--max-replicas", type=int, help="autoscaling ceiling (default: --min-replicas)")
    parser.add_argument(
        "--gpus-per-replica", type=float, default=None, help="default 1 (0 with --device cpu)"
    )
    parser.add_argument("--cpus-per-replica", type=float, default=1.0, help="CPUs reserved per replica")


def config_from_cli(args: argparse.Namespace) -> RayServeConfig:
    if not args.twilio:
        raise ConfigError("--ray serves Twilio calls: add --twilio (and --public-url)")
    if getattr(args, "webrtc", False):
        raise ConfigError("--webrtc is not available with --ray yet; run WebRTC demos without --ray")
    if not args.public_url:
        raise ConfigError("--public-url is required with --twilio (e.g. https://abc123.ngrok.app)")
    agent_config = None
    if args.config:
        from duetaspan.config import AgentConfig

        if not args.config.is_file():
            raise ConfigError(f"--config {args.config}: no such file")
        agent_config = AgentConfig.load(args.config)
    try:
        credentials = TwilioCredentials.from_env()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
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
            public_url=args.public_url,
            credentials=credentials,
            agent=AgentSpec(
                config=agent_config,
                model=args.model,
                device=args.device,
                record_dir=str(args.record_dir) if args.record_dir else None,
                retrieval=not args.no_retrieval,
            ),
            replica=ReplicaOptions(**replica),
        )
    except ValueError as exc:
        raise ConfigError(f"--ray: {exc}") from None


def run_cli(args: argparse.Namespace) -> int:
    """Join (or start) a Ray cluster, deploy the application on Serve's proxy at --host:--port, and wait
    until interrupted; then delete the application (its replicas drain first)."""
    config = config_from_cli(args)
    serve = import_serve()
    import ray

    ray.init(address=args.ray_address or None, logging_level=logging.WARNING)
    serve.start(http_options={"host": args.host, "port": args.port})
    logger.warning(
        "deploying on Ray Serve (%s)... replicas load the model first", ray.get_runtime_context().gcs_address
    )
    serve.run(build_app(config), name=config.app_name, route_prefix="/")
    logger.warning(
        "ready: Twilio voice webhook %s/twilio/voice (Serve proxy on %s:%d, %d-%d engine replicas x %d slots)",
        config.public_url,
        args.host,
        args.port,
        config.replica.min_replicas,
        config.replica.max_replicas,
        config.replica.max_calls,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    logger.warning("stopping: deleting the application (live calls drain first)")
    serve.delete(config.app_name)
    return 0
