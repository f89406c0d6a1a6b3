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

import logging
import secrets
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from duetaspan.access import admin_token
from duetaspan.adapters.ray.config import AgentSpec, RayServeConfig, ReplicaOptions, webrtc_settings
from duetaspan.adapters.twilio.rest import TwilioCredentials
from duetaspan.errors import ConfigError, DuetaspanError
from duetaspan.observability.metrics import metrics_token

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
    from duetaspan.adapters.ray.control import SHUTDOWN_MARGIN_S
    from duetaspan.adapters.ray.ingress import RayIngress
    from duetaspan.adapters.ray.replica import EngineReplica
    from duetaspan.adapters.ray.router import router_config

    r = config.replica
    # a stopping replica ends its calls at the drain timeout (records written) before Serve would kill it
    grace_s = config.drain_timeout_s + SHUTDOWN_MARGIN_S
    actor_options: dict[str, Any] = {"num_cpus": r.num_cpus, "num_gpus": r.num_gpus}
    env = {"OMP_NUM_THREADS": str(max(1, int(r.num_cpus))), **r.env}
    actor_options["runtime_env"] = {"env_vars": env}
    engine = serve.deployment(
        EngineReplica,
        name=ENGINE_DEPLOYMENT,
        ray_actor_options=actor_options,
        max_ongoing_requests=r.max_calls,
        autoscaling_config=r.autoscaling(),
        graceful_shutdown_timeout_s=grace_s,
        graceful_shutdown_wait_loop_s=1.0,
        health_check_period_s=r.health_check_period_s,
        request_router_config=router_config(),  # no new calls for a draining replica
    )
    ingress = serve.deployment(
        serve.ingress()(RayIngress),
        name=INGRESS_DEPLOYMENT,
        num_replicas=config.ingress_replicas,
        ray_actor_options={"num_cpus": config.ingress_num_cpus},
        # every live call holds one WebSocket on an ingress replica for its whole length
        max_ongoing_requests=10_000,
        graceful_shutdown_timeout_s=grace_s,
    )
    key = key or secrets.token_bytes(32)  # the replicas derive their drain token from it (`control`)
    return ingress.bind(config, engine.bind(config, key), key)


class BuilderArgs(BaseModel):
    """The `args:` of a Serve config file for `app_builder`: Twilio when `public_url` is given (credentials
    from the environment), the WebRTC page with `webrtc: true` (its token from `$DUETASPAN_WEBRTC_TOKEN`)."""

    public_url: str | None = None
    webrtc: bool = False
    allow_force_ret: bool = False
    agent_config: Path | None = None
    model: str | None = None
    device: str | None = None
    record_dir: str | None = None
    retrieval: bool = True
    replica: ReplicaOptions = Field(default_factory=ReplicaOptions)
    ingress_replicas: int = 1
    placement_timeout_s: float = 5.0
    app_name: str = "duetaspan"


def app_builder(args: BuilderArgs | dict[str, Any]) -> Any:
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
    credentials = None
    if args.public_url is not None:
        try:
            credentials = TwilioCredentials.from_env()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    webrtc = None
    if args.webrtc:
        import os

        from duetaspan.adapters.webrtc.serve import TOKEN_ENV
        from duetaspan.config import AgentConfig

        if not os.environ.get(TOKEN_ENV):  # every ingress replica, and the operator, must know the token
            raise ConfigError(f"webrtc: true needs the page token in ${TOKEN_ENV} (runtime_env.env_vars)")
        webrtc = webrtc_settings(agent_config or AgentConfig(), args.allow_force_ret)
    if credentials is None and webrtc is None:
        raise ConfigError("app_builder args: give public_url (Twilio) and/or webrtc: true")
    return RayServeConfig(
        public_url=args.public_url,
        credentials=credentials,
        webrtc=webrtc,
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
        metrics_token=metrics_token(agent_config.server.metrics_token if agent_config else None),
        admin_token=admin_token(),
    )
