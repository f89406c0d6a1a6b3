"""Prometheus metrics of a Ray Serve deployment: every process keeps its own figures, Prometheus finds them.

- Each engine replica serves `GET /metrics` on its relay endpoint (the node address and port the ingress
  already relays streams to): its calls, its engine's clock and slots, its retrievals, exactly as one
  `duetaspan serve` process does.
- Replicas announce that address to a small named Ray actor (`MetricsDirectory`, one per application) and
  renew it every `HEARTBEAT_S`; a replica that stops renewing (it was removed, or died) drops out after
  `STALE_AFTER_S`.
- The ingress serves its own `GET /metrics` (webhook refusals, calls refused for lack of a slot) and
  `GET /ray/metrics/targets`: the live replica addresses in Prometheus' HTTP service-discovery format, so
  one `http_sd_configs` entry finds replicas as Serve adds and removes them (see docs/operations.md).

All three routes take the same bearer token (`$DUETASPAN_METRICS_TOKEN` or `[server] metrics_token`); without
one they answer 403 unless the deployment is the local demo (`control.roles`, the rule of one process).

Example (what `/ray/metrics/targets` answers):
    >>> http_sd({"a1b2": "10.0.0.5:41234"})
    [{'targets': ['10.0.0.5:41234'], 'labels': {'replica': 'a1b2'}}]
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

logger = logging.getLogger("duetaspan.ray")

TARGETS_PATH = "/ray/metrics/targets"
DIRECTORY_NAMESPACE = "duetaspan"
HEARTBEAT_S = 10.0
STALE_AFTER_S = 35.0


class MetricsDirectory:
    """Replica name -> (metrics address, last renewal). A Ray actor (see `directory`); plain class for tests."""

    def __init__(self) -> None:
        self.targets: dict[str, tuple[str, float]] = {}

    def add(self, replica: str, address: str) -> None:
        self.targets[replica] = (address, time.time())

    def remove(self, replica: str) -> None:
        self.targets.pop(replica, None)

    def live(self, max_age_s: float = STALE_AFTER_S) -> dict[str, str]:
        """The addresses renewed within `max_age_s` (older ones are forgotten)."""
        now = time.time()
        self.targets = {k: v for k, v in self.targets.items() if now - v[1] <= max_age_s}
        return {name: address for name, (address, _) in self.targets.items()}


def directory(app_name: str) -> Any:
    """The application's `MetricsDirectory` actor (created by the first replica or ingress that asks)."""
    import ray

    actor = ray.remote(num_cpus=0)(MetricsDirectory)
    return actor.options(
        name=f"metrics-directory:{app_name}",
        namespace=DIRECTORY_NAMESPACE,
        get_if_exists=True,
        lifetime="detached",  # outlives any one replica: replicas come and go under it
    ).remote()


def http_sd(targets: dict[str, str]) -> list[dict[str, Any]]:
    """Prometheus HTTP service discovery: one target group per replica, labelled with the replica's name."""
    return [{"targets": [address], "labels": {"replica": name}} for name, address in sorted(targets.items())]


async def announce(app_name: str, replica: str, address: str) -> None:
    """Keep this replica's metrics address in the directory until cancelled (then remove it)."""
    actor = None
    try:
        while True:
            try:
                actor = actor or directory(app_name)
                await actor.add.remote(replica, address)
            except Exception as exc:  # the directory restarting must not take the replica down
                logger.warning("replica %s: metrics directory unreachable: %r", replica, exc)
                actor = None
            await asyncio.sleep(HEARTBEAT_S)
    finally:
        if actor is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(actor.remove.remote(replica), 2.0)


async def live_targets(app_name: str) -> dict[str, str]:
    """What `/ray/metrics/targets` lists (empty, with a warning, when the directory cannot be reached)."""
    try:
        return await directory(app_name).live.remote()
    except Exception as exc:
        logger.warning("metrics directory unreachable: %r", exc)
        return {}
