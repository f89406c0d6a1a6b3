"""Pipecat metrics of a duplex call: TTFB, model processing time per tick, clock lateness, usage.

Reported as `MetricsFrame`s when the pipeline runs with `PipelineParams(enable_metrics=True)` (usage with
`enable_usage_metrics=True`), so `MetricsLogObserver`, RTVI and OpenTelemetry see them like any service's:

- `TTFBMetricsData`: caller stops -> agent's first audio. The caller's stop is when the end of the
  utterance the voice detection cut reached the service (the detection itself notices `end_silence_s`
  later); the agent's first audio is the first speaking frame the engine delivered after that moment.
- `ProcessingMetricsData`: how long the engine step of each 80 ms tick took.
- `ClockLatenessMetricsData` (ours): how late the tick started against the clock's grid. Waiting is not
  processing, so it is kept out of `ProcessingMetricsData`.
- `DuplexUsageMetricsData` (ours): frames in/out, spans and their frames, `<ret>`s, word pieces; every
  `usage_every_frames` ticks and at the end of the call.

Example:
    >>> ttfb = TTFB()
    >>> ttfb.caller_stopped(2.0), ttfb.agent_frame(2.16, silent=True), ttfb.agent_frame(2.24, silent=False)
    (None, None, 0.24)
"""

from __future__ import annotations

from dataclasses import dataclass

from pipecat.frames.frames import MetricsFrame
from pipecat.metrics.metrics import MetricsData, ProcessingMetricsData, TTFBMetricsData
from pydantic import BaseModel


class ClockLatenessMetricsData(MetricsData):
    """How late an engine tick started against its `t0 + k * 80 ms` deadline, in seconds."""

    value: float


class DuplexUsage(BaseModel):
    """What a call used of the duplex model so far."""

    frames_in: int = 0  # caller frames the model heard (80 ms each)
    frames_out: int = 0  # agent frames produced
    speaking_frames: int = 0  # agent frames that were not silent
    text_pieces: int = 0
    rets: int = 0
    spans: int = 0
    span_frames: int = 0  # frames the spans took in the model's streams


class DuplexUsageMetricsData(MetricsData):
    """A call's `DuplexUsage`."""

    value: DuplexUsage


@dataclass
class TTFB:
    """Caller-stop to agent-first-audio, on one clock (the service passes `time.monotonic()`)."""

    _stop_t: float | None = None  # the caller's last stop still waiting for agent audio
    _onset_t: float | None = None  # start of the agent's current run of speech
    _speaking: bool = False

    def caller_stopped(self, t: float) -> float | None:
        """The caller's utterance ended at `t`; the TTFB at once if the agent already answered after it."""
        if self._speaking and self._onset_t is not None and self._onset_t >= t:
            return round(self._onset_t - t, 3)
        self._stop_t = t
        return None

    def agent_frame(self, t: float, *, silent: bool) -> float | None:
        """An agent frame at stream time `t`; the TTFB when it is the answer's first audio."""
        if silent:
            self._speaking = False
            return None
        if not self._speaking:
            self._speaking, self._onset_t = True, t
        # a run that began before the caller stopped (talking over them) is no answer to that stop
        if self._stop_t is not None and self._onset_t is not None and self._onset_t >= self._stop_t:
            value, self._stop_t = round(self._onset_t - self._stop_t, 3), None
            return value
        return None


def processing_frame(processor: str, model: str, step_ms: float, lateness_ms: float) -> MetricsFrame:
    """One tick's engine step (processing) and clock lateness (not processing), in seconds."""
    return MetricsFrame(
        data=[
            ProcessingMetricsData(processor=processor, model=model, value=step_ms / 1e3),
            ClockLatenessMetricsData(processor=processor, model=model, value=lateness_ms / 1e3),
        ]
    )


def ttfb_frame(processor: str, model: str, seconds: float) -> MetricsFrame:
    return MetricsFrame(data=[TTFBMetricsData(processor=processor, model=model, value=seconds)])


def usage_frame(processor: str, model: str, usage: DuplexUsage) -> MetricsFrame:
    return MetricsFrame(
        data=[DuplexUsageMetricsData(processor=processor, model=model, value=usage.model_copy())]
    )


__all__ = [
    "TTFB",
    "ClockLatenessMetricsData",
    "DuplexUsage",
    "DuplexUsageMetricsData",
    "processing_frame",
    "ttfb_frame",
    "usage_frame",
]
