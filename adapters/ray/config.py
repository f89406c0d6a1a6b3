"""Settings of a Ray Serve deployment of the agent: what every replica loads, how many replicas, and how the
ingress places calls. One pydantic model, passed to every deployment (it pickles with the Twilio secret).

Example:
    >>> from duetaspan.adapters.twilio.rest import TwilioCredentials
    >>> cfg = RayServeConfig(
    ...     public_url="https://agent.example.com",
    ...     credentials=TwilioCredentials(account_sid="AC1", auth_token="t"),
    ...     replica=ReplicaOptions(max_calls=8, min_replicas=1, max_replicas=4),
    ... )
    >>> cfg.replica.target_ongoing_calls
    6.0
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from pydantic import BaseModel, Field, SecretStr, model_validator

from duetaspan.adapters.twilio.rest import TwilioCredentials
from duetaspan.adapters.twilio.stream import StreamLimits
from duetaspan.adapters.webrtc.service import WebRTCSettings
from duetaspan.config import AgentConfig


class AgentSpec(BaseModel):
    """What each engine replica builds its `Agent` from (the same on every node).

    `config` is the parsed `agent.toml`; files it names (persona prompt, voice, checkpoint) must exist at the
    same paths on every node that runs a replica.
    """

    config: AgentConfig | None = None
    model: str | None = Field(None, description="preset override, e.g. duetaspan-7b or tiny-random")
    device: str | None = Field(None, description="cuda, cpu or auto (default from the config)")
    record_dir: str | None = Field(None, description="per-call artifacts, on the replica's node")
    retrieval: bool = Field(True, description="False: no LLM router (<ret> lands no span)")
    seed: int | None = None
    engine_process: bool = Field(
        False, description="engine in a child process of the replica (a CUDA crash fails the health check)"
    )

    def overrides(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.model:
            out["model"] = self.model
        if self.device:
            out["device"] = self.device
        if self.record_dir:
            out["record_dir"] = self.record_dir
        if not self.retrieval:
            out["router"] = False
        if self.seed is not None:
            out["seed"] = self.seed
        if self.engine_process:
            out["engine_process"] = True
        return out


class ReplicaOptions(BaseModel):
    """The engine deployment: one replica per GPU, `max_calls` slots each, autoscaled on slot occupancy.

    Every call is one long-running Serve request on its replica (from the webhook to the end of the call), so
    Serve's own counters are slot counters: `max_ongoing_requests = max_calls` keeps Serve from sending a
    replica more calls than it has slots, and `target_ongoing_requests = target_occupancy * max_calls` is the
    autoscaling target.
    """

    max_calls: int = Field(4, ge=1, description="call slots per replica (engine batch size)")
    num_gpus: float = Field(1.0, ge=0, description="GPUs per replica (1: one engine per GPU; 0 on CPU)")
    num_cpus: float = Field(1.0, ge=0, description="CPUs reserved per replica (fractions allowed)")
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(1, ge=1)
    initial_replicas: int | None = Field(None, ge=0)
    target_occupancy: float = Field(0.75, gt=0, le=1, description="occupied slots per replica to aim for")
    upscale_delay_s: float = Field(10.0, ge=0)
    downscale_delay_s: float = Field(300.0, ge=0, description="idle time before a replica is removed")
    look_back_period_s: float = Field(30.0, gt=0, description="window Serve averages occupancy over")
    drain_timeout_s: float | None = Field(
        None,
        gt=0,
        description="how long a stopping (draining) replica lets its calls run before it ends them "
        "(`ended_by: shutdown`); default `[server] drain_timeout_s`",
    )
    health_check_period_s: float = Field(5.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict, description="extra environment of the replica actors")
    pipecat_log_level: str = Field("WARNING", description="Pipecat's (loguru) log level in replicas")

    @model_validator(mode="after")
    def _bounds(self) -> ReplicaOptions:
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas {self.max_replicas} < min_replicas {self.min_replicas}")
        return self

    @property
    def target_ongoing_calls(self) -> float:
        return max(self.target_occupancy * self.max_calls, 0.5)

    def autoscaling(self) -> dict[str, Any]:
        return {
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "initial_replicas": self.initial_replicas,
            "target_ongoing_requests": self.target_ongoing_calls,
            "upscale_delay_s": self.upscale_delay_s,
            "downscale_delay_s": self.downscale_delay_s,
            "look_back_period_s": self.look_back_period_s,
            # Serve checks the look-back window against this (deprecated) interval, 10 s by default
            "metrics_interval_s": min(10.0, self.look_back_period_s / 2),
        }


class RayServeConfig(BaseModel):
    """A whole Ray Serve deployment of one agent: Twilio calls (`public_url` + `credentials`), WebRTC page
    calls (`webrtc`), or both.

    `webrtc.token` is the page token every ingress replica checks: give one (a random token per ingress
    replica would break pages served by another), see `duetaspan.adapters.ray.cli`.
    """

    public_url: str | None = Field(
        None, description="https URL Twilio reaches the Serve proxy at (signatures use it)"
    )
    credentials: TwilioCredentials | None = Field(None, description="Twilio account (None: no Twilio)")
    webrtc: WebRTCSettings | None = Field(None, description="the browser page and its calls (None: off)")
    agent: AgentSpec = Field(default_factory=AgentSpec)
    replica: ReplicaOptions = Field(default_factory=ReplicaOptions)
    ingress_replicas: int = Field(1, ge=1, description="ingress (webhook + stream relay) replicas")
    ingress_num_cpus: float = Field(0.5, ge=0)
    placement_timeout_s: float = Field(
        5.0, gt=0, description="how long the webhook waits for a free slot before answering busy"
    )
    token_ttl_s: float = Field(30.0, gt=0, description="time from webhook to stream upgrade")
    internal_host: str | None = Field(
        None, description="address replicas listen on for relayed streams (default: the node's IP)"
    )
    limits: StreamLimits = Field(default_factory=StreamLimits)
    app_name: str = "duetaspan"
    calls_route: bool = Field(
        False, description="serve GET /ray/calls (which replica took which call); not for a public proxy"
    )
    metrics_token: SecretStr | None = Field(
        None, description="bearer token of /metrics and /ray/metrics/targets (ingress and replicas)"
    )
    admin_token: SecretStr | None = Field(
        None, description="bearer token of POST /admin/drain on the ingress"
    )
    local_demo: bool = Field(
        False, description="Serve's proxy on loopback with no public URL: roles open without their tokens"
    )

    @model_validator(mode="after")
    def _transports(self) -> RayServeConfig:
        if (self.public_url is None) != (self.credentials is None):
            raise ValueError("Twilio needs both public_url and credentials")
        if self.credentials is None and self.webrtc is None:
            raise ValueError("nothing to serve: give Twilio (public_url, credentials) and/or webrtc settings")
        if self.webrtc is not None and self.webrtc.token is None:
            raise ValueError(
                "webrtc.token is required (every ingress replica must check the same page token)"
            )
        return self

    @property
    def metrics_bearer(self) -> str | None:
        return self.metrics_token.get_secret_value() if self.metrics_token is not None else None

    @property
    def admin_bearer(self) -> str | None:
        return self.admin_token.get_secret_value() if self.admin_token is not None else None

    @property
    def drain_timeout_s(self) -> float:
        """How long a draining replica lets its calls run: the replica option, else `[server] drain_timeout_s`."""
        if self.replica.drain_timeout_s is not None:
            return self.replica.drain_timeout_s
        return (self.agent.config or AgentConfig()).server.drain_timeout_s

    @property
    def drain_redirect_url(self) -> str | None:
        return (self.agent.config or AgentConfig()).server.drain_redirect_url

    @property
    def twilio(self) -> bool:
        return self.credentials is not None


def webrtc_settings(agent_config: Any, allow_force_ret: bool) -> WebRTCSettings:
    """The page settings every ingress replica shares: ICE servers from `[webrtc]`, the page token from
    `$DUETASPAN_WEBRTC_TOKEN`, else one random token for the whole deployment."""
    from duetaspan.adapters.webrtc.serve import TOKEN_ENV

    token = os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(24)
    return WebRTCSettings(
        token=SecretStr(token),
        ice_servers=list(agent_config.webrtc.ice_servers),
        allow_force_ret=allow_force_ret,
    )
