"""Serve's request router for the engine deployment: a replica that drains gets no new calls.

Serve itself stops routing to a replica it stops (scale-down, redeploy), but a replica that drains on
`POST /admin/drain` stays `RUNNING` for Serve, and, idle, would draw every new call (Serve's power of two
choices picks the shorter queue). Each replica reports `{"draining": ...}` in its routing stats
(`EngineReplica.record_routing_stats`, every `ROUTING_STATS_PERIOD_S`); this router picks two random replicas
among those that are not draining (Serve then takes the one with the shorter queue that accepts), and none
while all drain (the ingress's placement timeout answers the caller). Between a drain and the next stats, the
replica refuses the call (`draining`) and the ingress asks again.

Imports Ray: used only by `duetaspan.adapters.ray.app.build_app`.

Example:
    >>> # serve.deployment(EngineReplica, request_router_config=router_config())
"""

from __future__ import annotations

import random
from typing import Any

from ray.serve.config import RequestRouterConfig
from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

ROUTING_STATS_PERIOD_S = 1.0


class OpenReplicaRouter(FIFOMixin, RequestRouter):
    """Power of two choices over the replicas that take calls (not draining)."""

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        open_ = [r for r in candidate_replicas if not (r.routing_stats or {}).get("draining")]
        if len(open_) > 2:
            open_ = random.sample(open_, 2)
        return [open_] if open_ else []


def router_config() -> Any:
    options: dict[str, Any] = {
        "request_router_class": OpenReplicaRouter,
        "request_routing_stats_period_s": ROUTING_STATS_PERIOD_S,
        "request_routing_stats_timeout_s": 10.0,
    }
    return RequestRouterConfig(**options)


__all__ = ["ROUTING_STATS_PERIOD_S", "OpenReplicaRouter", "router_config"]
