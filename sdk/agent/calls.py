"""One call's parts, built from what the agent shares: its `CallInfo`, `CallContext` (what tools see),
recorder, pipeline parameters and the `DuetaSpanService` that carries it on the engine."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipecat.pipeline.worker import PipelineParams

from duetaspan.config import AgentConfig
from duetaspan.errors import DuetaspanError
from duetaspan.model.convention import SAMPLE_RATE
from duetaspan.pipeline.admission import Admission
from duetaspan.pipeline.artifacts import CallRecorder
from duetaspan.pipeline.leveller import LevellerConfig
from duetaspan.pipeline.service import DuetaSpanService, RetrievalFactory
from duetaspan.pipeline.session import CallInfo
from duetaspan.registry import CallContext

if TYPE_CHECKING:  # prometheus_client and OpenTelemetry load only when a server observes the agent
    from duetaspan.observability.observer import CallObserver


class AgentNotStarted(DuetaspanError):
    """`create_session` before `await agent.start()` (or `async with agent:`)."""


def call_info(call: CallInfo | str | None) -> CallInfo:
    """A `CallInfo` from a `CallInfo`, a call id, or nothing (a fresh id)."""
    if isinstance(call, CallInfo):
        return call
    return CallInfo(call) if call else CallInfo()


def call_context(config: AgentConfig, call: CallInfo) -> CallContext:
    """What the call's tools see: the agent's profile under the call's own, and the call's parameters."""
    return CallContext(
        call_id=call.call_id,
        caller=call.caller,
        called=call.called,
        profile={**config.profile, **call.params.get("profile", {})},
        metadata=dict(call.params),
    )


def call_recorder(record_dir: Path | None, call: CallInfo, *, audio: bool) -> CallRecorder | None:
    """The call's artifact writer when the agent records (`<call id>.wav` / `.jsonl` / `.json`)."""
    if record_dir is None:
        return None
    return CallRecorder(
        record_dir,
        call.call_id,
        meta={"caller": call.caller, "called": call.called, "transport": call.transport,
              **({"campaign_id": call.params["campaign_id"]} if call.params.get("campaign_id") else {})},
        audio=audio,
    )


def call_service(
    runner: Any,
    call: CallInfo,
    *,
    context: CallContext,
    persona: Any,
    sampling: Any,
    seed: int | None,
    leveller: LevellerConfig,
    retrieval: RetrievalFactory | None,
    recorder: CallRecorder | None,
    observer: CallObserver | None,
    admission: Admission | None = None,
) -> DuetaSpanService:
    """The call's `DuetaSpanService` on `runner`; the observer (metrics, trace) wraps its retrieval and
    watches it, and DTMF digits are appended to the context."""
    service = DuetaSpanService(
        runner,
        call_id=call.call_id,
        user_id=call.caller or call.call_id,
        persona=persona,
        sampling=sampling,
        seed=seed,
        leveller=leveller,
        retrieval=observer.retrieval(retrieval) if observer else retrieval,
        recorder=recorder,
        admission=admission,
        transport=call.transport,
    )
    if observer is not None:
        observer.bind(service)
    service.context = context

    @service.event_handler("on_dtmf")
    async def _on_dtmf(_service: DuetaSpanService, digit: str) -> None:
        if hasattr(context, "dtmf"):
            context.dtmf += digit

    return service


def session_params(
    params: PipelineParams | None, audio_in_sample_rate: int | None, audio_out_sample_rate: int
) -> PipelineParams:
    """The session's Pipecat parameters: as given, or the transport's rates (the model's by default)."""
    if params is not None:
        return params
    return PipelineParams(
        audio_in_sample_rate=audio_in_sample_rate or SAMPLE_RATE,
        audio_out_sample_rate=audio_out_sample_rate,
    )


__all__ = ["AgentNotStarted", "call_context", "call_info", "call_recorder", "call_service", "session_params"]
