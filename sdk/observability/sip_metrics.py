"""The SIP endpoint's call-quality and dialling metrics, in a server's `ServeMetrics` registry: every call we
place counts once by outcome, and each answered SIP call adds its RTP figures (the same figures as its record's
`rtp`, `duetaspan.adapters.sip.records`): the counters grow once a second while the call runs (what arrived,
was lost, came too late or was dropped since the last report), the histograms get one observation at its end.

| metric | type | labels |
|---|---|---|
| `duetaspan_sip_dial_total` | counter | `outcome`: answered, busy, no-answer, failed |
| `duetaspan_rtp_packets_received_total` | counter | `transport="sip"` |
| `duetaspan_rtp_packets_lost_total` | counter | `transport="sip"` (RFC 3550 cumulative loss of each call) |
| `duetaspan_rtp_jitter_seconds` | histogram | `transport="sip"`: one observation per call, its interarrival jitter at the end |
| `duetaspan_rtp_loss_ratio` | histogram | `transport="sip"`: one per call, lost / expected |
| `duetaspan_rtp_round_trip_seconds` | histogram | `transport="sip"`: one per RTCP round trip measured |
| `duetaspan_rtp_frames_late_total` | counter | `transport="sip"`: audio frames that came after their playout time (dropped by the playout buffer) |
| `duetaspan_rtp_packets_dropped_total` | counter | `transport="sip"`, `reason`: `foreign` (not from the latched address), `ssrc` (another source while the latched one is live), `early` (before the ACK), `malformed`, `srtp_auth` (failed SRTP authentication) |

Example:
    >>> from prometheus_client import CollectorRegistry, generate_latest
    >>> m = SipMetrics(CollectorRegistry())
    >>> m.dialled("busy")
    >>> b'duetaspan_sip_dial_total{outcome="busy"} 1.0' in generate_latest(m.registry)
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

DIAL_OUTCOMES = ("answered", "busy", "no-answer", "failed")
JITTER_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.5)
LOSS_BUCKETS = (0.0, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
RTT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.4, 0.6, 1.0, 2.0)
METRIC_NAMES = (
    "duetaspan_sip_dial_total",
    "duetaspan_rtp_packets_received_total",
    "duetaspan_rtp_packets_lost_total",
    "duetaspan_rtp_jitter_seconds",
    "duetaspan_rtp_loss_ratio",
    "duetaspan_rtp_round_trip_seconds",
    "duetaspan_rtp_packets_dropped_total",
    "duetaspan_rtp_frames_late_total",
)
DROP_REASONS = ("foreign", "ssrc", "early", "malformed", "srtp_auth")


class SipMetrics:
    """Dial outcomes and RTP quality (see the module docstring), registered in `registry`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = r = registry
        self.dials = Counter(
            "duetaspan_sip_dial", "SIP calls we placed, by outcome.", ["outcome"], registry=r
        )
        self.received = Counter("duetaspan_rtp_packets_received", "RTP packets received on calls.",
                                ["transport"], registry=r)  # fmt: skip
        self.lost = Counter("duetaspan_rtp_packets_lost", "RTP packets lost on the way to us (RFC 3550).",
                            ["transport"], registry=r)  # fmt: skip
        self.jitter = Histogram("duetaspan_rtp_jitter_seconds", "Interarrival jitter of each call's RTP at its end.",
                                ["transport"], buckets=JITTER_BUCKETS, registry=r)  # fmt: skip
        self.loss = Histogram("duetaspan_rtp_loss_ratio", "Share of each call's RTP packets lost (lost/expected).",
                              ["transport"], buckets=LOSS_BUCKETS, registry=r)  # fmt: skip
        self.rtt = Histogram("duetaspan_rtp_round_trip_seconds", "RTCP round-trip times (arrival - LSR - DLSR).",
                             ["transport"], buckets=RTT_BUCKETS, registry=r)  # fmt: skip
        self.dropped = Counter("duetaspan_rtp_packets_dropped", "RTP packets dropped before the call (latching, SRTP).",
                               ["transport", "reason"], registry=r)  # fmt: skip
        self.late = Counter("duetaspan_rtp_frames_late", "Audio frames that came after their playout time.",
                            ["transport"], registry=r)  # fmt: skip
        self._reported: dict[str, dict[str, int]] = {}  # per running call: the counts already added
        for reason in DROP_REASONS:
            self.dropped.labels("sip", reason)
        for outcome in DIAL_OUTCOMES:  # at zero from the start: the names are a contract
            self.dials.labels(outcome)
        for family in (self.received, self.lost, self.jitter, self.loss, self.rtt, self.late):
            family.labels("sip")

    def dialled(self, outcome: str) -> None:
        self.dials.labels(outcome if outcome in DIAL_OUTCOMES else "failed").inc()

    def call_rtp(
        self,
        figures: Mapping[str, Any],
        rtt_ms: list[float] | None = None,
        transport: str = "sip",
        *,
        call_id: str | None = None,
        final: bool = True,
    ) -> None:
        """One call's RTP figures (`duetaspan.adapters.sip.records.rtp_figures`): `final=False` while it runs
        (the counters get what grew since the call's last report), `final=True` at its end (the rest, and the
        histograms). Without `call_id` the figures are the whole call's, reported once."""
        done = self._reported.pop(call_id, {}) if final else self._reported.setdefault(call_id or "", {})
        counts = {"received": figures.get("packets_received", 0), "lost": figures.get("packets_lost", 0),
                  "late": figures.get("late", 0)}  # fmt: skip
        counts |= {
            f"dropped:{reason}": n
            for reason, n in (figures.get("dropped") or {}).items()
            if reason in DROP_REASONS
        }
        for key, value in counts.items():
            grown = max(0, int(value or 0)) - done.get(key, 0)
            if grown <= 0:
                continue
            done[key] = done.get(key, 0) + grown
            if key.startswith("dropped:"):
                self.dropped.labels(transport, key.split(":", 1)[1]).inc(grown)
            else:
                getattr(self, key).labels(transport).inc(grown)
        if not final:
            return
        if figures.get("packets_received"):
            self.jitter.labels(transport).observe(float(figures.get("jitter_ms", 0.0)) / 1000.0)
            self.loss.labels(transport).observe(float(figures.get("loss_fraction", 0.0)))
        for ms in rtt_ms or ():
            self.rtt.labels(transport).observe(ms / 1000.0)


__all__ = ["DIAL_OUTCOMES", "METRIC_NAMES", "SipMetrics"]
