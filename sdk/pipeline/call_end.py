"""How a `DuetaSpanService` call ends when the engine cannot carry it: refused at start (no free slot, the
engine not running) or ended under the call when the engine goes down; and how any call ends when it runs
past `[server] max_call_s` (`max_duration`: the pipeline ends, so every transport hangs up, and the record
says `ended_by: "max_duration"`).

Both tell the pipeline with a permanent `ErrorFrame` upstream (`on_pipeline_error` fires) and end it, so the
transport hangs up instead of leaving the caller in silence. An engine that went down under the call
(`EngineFailed`: its steps kept failing, a fatal device error, its process died) gives a fatal `ErrorFrame`,
cancels the pipeline and sets the service's `engine_error`, so the record says `ended_by: "engine_error"`
and a transport can apologise (the Twilio bridge says so to the caller through the REST API). One failed
step that the engine survives is a plain, non-fatal error.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from typing import Any

from pipecat.frames.frames import CancelWorkerFrame, EndWorkerFrame, ErrorFrame
from pipecat.processors.frame_processor import FrameDirection

log = logging.getLogger(__name__)


def close_record(service: Any, how: str) -> None:
    """Write the call's record with why it ended: the service's own reason, the server's (a drain says
    `shutdown`), `refused` without a slot, `engine_error` when the engine went down under it, else `how`."""
    if service.recorder is None:
        return
    admitted = service.admitted
    ended_by = service.ended_by or (admitted and admitted.ended_by) or how
    ended_by = "refused" if service.refused is not None else ended_by
    if service.engine_error is not None:
        ended_by = "engine_error"
    service.recorder.close(ended_by=ended_by, **service.summary())


async def close_retrieval(retrieval: Any) -> None:
    """Close the call's retrieval (sync or async `close`); its failure does not stop the call's end."""
    if retrieval is None:
        return
    with contextlib.suppress(Exception):
        closing = retrieval.close()
        if inspect.isawaitable(closing):
            await closing


async def refuse(service: Any, exc: BaseException) -> None:
    """No slot for this call: tell the pipeline (a permanent error) and end it, so the caller is hung up
    on instead of hearing silence."""
    service.refused = exc
    log.warning("call %s: refused at start: %s", service.call_id, exc)
    if service.recorder is not None:
        service.recorder.event("error", stage="admission", message=str(exc))
    await service.push_error(f"call {service.call_id}: {exc}", exception=exc, force_treat_as_permanent=True)
    await service.push_frame(EndWorkerFrame(reason=f"no engine slot: {exc}"), FrameDirection.UPSTREAM)


def engine_failed(service: Any, exc: BaseException) -> None:
    """The engine reported `exc` for the call (on the call's loop): a failed step, or the engine's end."""
    if service.engine_error is not None:
        return  # the call is already ending with the engine
    ends_call = bool(getattr(exc, "ends_call", False))
    crashed = ends_call and bool(getattr(exc, "crashed", True))
    if service.recorder is not None:
        service.recorder.event("error", stage="engine", message=str(exc), fatal=crashed)
    if not ends_call:  # one failed step: the next may succeed
        service.spawn(service.push_error(f"duplex engine step failed: {exc}", exception=exc))
        return
    if crashed:  # the engine went down under the call: a fatal error for the pipeline
        service.engine_error = exc
        log.error("call %s: ending the call, the engine is down: %s", service.call_id, exc)
        error = ErrorFrame(
            error=f"call {service.call_id}: the duplex engine is down: {exc}",
            exception=exc if isinstance(exc, Exception) else None,
        )
        error.fatal = True  # set after construction, as Pipecat does, to skip its deprecation warning
        service.spawn(service.push_error_frame(error, force_treat_as_permanent=True))
    # the engine is gone (it crashed, or was stopped under the call): hang up
    service.spawn(service.push_frame(CancelWorkerFrame(reason=str(exc)), FrameDirection.UPSTREAM))


MAX_DURATION = "max_duration"


def watch_duration(service: Any) -> asyncio.Task[None] | None:
    """At the call's start: end it `service.max_call_s` later (None: no limit); the task is cancelled at its end."""
    limit = service.max_call_s
    if not limit:
        return None

    async def end_after() -> None:
        await asyncio.sleep(limit)
        service.ended_by = service.ended_by or MAX_DURATION
        log.warning("call %s: reached the maximum call length (%.0f s); ending it", service.call_id, limit)
        if service.recorder is not None:
            service.recorder.event("error", stage="max_duration", message=f"call longer than {limit:g} s")
        await service.push_frame(EndWorkerFrame(reason=f"maximum call length {limit:g} s"), FrameDirection.UPSTREAM)

    return asyncio.ensure_future(end_after())
