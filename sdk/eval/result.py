"""What one scenario run produced, before scoring (both modes fill the same record).

Example:
    >>> run = ScenarioRun("weather")
    >>> run.answer_parts.append("(tool result) sunny, 24 C")
    >>> run.answer
    '(tool result) sunny, 24 C'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from duetaspan.eval.tools import ActualCall


@dataclass
class ScenarioRun:
    """One scenario's outcome.

    Attributes:
        id: the scenario id.
        calls: tool calls that ran, in order.
        answer_parts: what the agent said (text mode: the reference lines; audio mode: its text stream).
        error: why the run failed (LLM down or timed out, audio missing...), or None.
        elapsed_s: wall time of the run.
        latency_s: seconds from the end of the routed caller turn to the first tool call.
        response_latency_s: audio mode: seconds from the end of the caller's speech to the agent's first word.
        trace: per-step details (router decisions in text mode, retrieval events in audio mode).
        stream: audio mode: the FDB-v3 timing fields (`asr_chunks`, `user_speech_end_rel`,
            `audio_agent_speech_start`, seconds from the stream start; see `duetaspan.eval.fdb_export`).
    """

    id: str
    calls: list[ActualCall] = field(default_factory=list)
    answer_parts: list[str] = field(default_factory=list)
    error: str | None = None
    elapsed_s: float = 0.0
    latency_s: float | None = None
    response_latency_s: float | None = None
    trace: list[dict[str, Any]] = field(default_factory=list)
    stream: dict[str, Any] | None = None

    @property
    def answer(self) -> str:
        return " ".join(p.strip() for p in self.answer_parts if p.strip())
