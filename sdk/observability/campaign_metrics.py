"""Per-campaign counters in a server's `ServeMetrics` registry (`/metrics`):

| metric | type | labels |
|---|---|---|
| `duetaspan_campaign_dials_total` | counter | `campaign`: attempts this server placed (the call left) |
| `duetaspan_campaign_attempts_total` | counter | `campaign`, `outcome`: attempts this server finished, by outcome |

Example:
    >>> from prometheus_client import CollectorRegistry, generate_latest
    >>> m = CampaignMetrics(CollectorRegistry())
    >>> m.started("spring"); m.finished("spring", "busy")
    >>> b'duetaspan_campaign_attempts_total{campaign="spring",outcome="busy"} 1.0' in generate_latest(m.registry)
    True
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class CampaignMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.dials = Counter("duetaspan_campaign_dials", "Campaign attempts this server placed (the call left), per campaign.",
                             ["campaign"], registry=registry)
        self.attempts = Counter("duetaspan_campaign_attempts", "Campaign attempts this server finished, by "
                                "campaign and outcome.", ["campaign", "outcome"], registry=registry)

    def started(self, campaign: str) -> None:
        self.dials.labels(campaign).inc()

    def finished(self, campaign: str, outcome: str) -> None:
        self.attempts.labels(campaign, outcome).inc()


__all__ = ["CampaignMetrics"]
