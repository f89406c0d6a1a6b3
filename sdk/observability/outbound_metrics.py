"""Metrics of calls the server places and of answer detection (`duetaspan.outbound`), in a server's
`ServeMetrics` registry.

| metric | type | labels |
|---|---|---|
| `duetaspan_twilio_dial_total` | counter | `outcome`: answered, busy, no-answer, failed |
| `duetaspan_answer_verdicts_total` | counter | `verdict`: human, voicemail, beep, ivr, screening, silence, fax |
| `duetaspan_answer_decision_seconds` | histogram | none: from the answer to the verdict |

Example:
    >>> from prometheus_client import CollectorRegistry, generate_latest
    >>> m = OutboundMetrics(CollectorRegistry())
    >>> m.dialled("busy")
    >>> b'duetaspan_twilio_dial_total{outcome="busy"} 1.0' in generate_latest(m.registry)
    True
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

DIAL_OUTCOMES = ("answered", "busy", "no-answer", "failed")
VERDICTS = ("human", "voicemail", "beep", "ivr", "screening", "silence", "fax")
DECISION_BUCKETS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 8.0)
METRIC_NAMES = (
    "duetaspan_twilio_dial_total",
    "duetaspan_answer_verdicts_total",
    "duetaspan_answer_decision_seconds",
)


class OutboundMetrics:
    """Dial outcomes of Twilio calls we place, and answer-detection verdicts with their decision times."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.twilio_dials = Counter(
            "duetaspan_twilio_dial", "Twilio calls the server placed, by outcome.", ["outcome"], registry=registry
        )
        self.verdicts = Counter(
            "duetaspan_answer_verdicts", "Answer-detection verdicts, by verdict.", ["verdict"], registry=registry
        )
        self.decision = Histogram(
            "duetaspan_answer_decision_seconds",
            "Seconds from the answer to the answer-detection verdict.",
            buckets=DECISION_BUCKETS,
            registry=registry,
        )
        for outcome in DIAL_OUTCOMES:
            self.twilio_dials.labels(outcome)
        for verdict in VERDICTS:
            self.verdicts.labels(verdict)

    def dialled(self, outcome: str) -> None:
        self.twilio_dials.labels(outcome).inc()

    def verdict(self, verdict: str, decided_at_s: float) -> None:
        self.verdicts.labels(verdict).inc()
        self.decision.observe(max(0.0, decided_at_s))


__all__ = ["DECISION_BUCKETS", "DIAL_OUTCOMES", "METRIC_NAMES", "VERDICTS", "OutboundMetrics"]
