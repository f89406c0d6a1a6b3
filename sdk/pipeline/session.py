"""One call: its slot on the engine, its retrieval, its artifacts, and the Pipecat pipeline that runs it.

A transport (Twilio, WebRTC) gets a `CallSession` from `Agent.create_session(call, transport)`, calls
`await session.open()` first (admission control: `EngineFull` means refuse the call), then
`await session.run()`, which runs `transport.input() -> DuetaSpanService -> transport.output()` until the
call ends (the transport disconnects -> `session.cancel()`, or `session.end()` for a graceful end).
Everything the call owns is freed when `run()` returns, whatever the reason.

Example:
    >>> async def on_twilio_stream(agent, websocket_transport, call_sid):   # doctest: +SKIP
    ...     session = agent.create_session(CallInfo(call_sid, caller="+1555..."), websocket_transport)
    ...     try:
    ...         await session.open()
    ...     except EngineFull:
    ...         return await websocket_transport.refuse()
    ...     record = await session.run()
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from pipecat.frames.frames import CancelFrame, EndFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameProcessor
from pipecat.workers.runner import WorkerRunner

from duetaspan.model.convention import SAMPLE_RATE
from duetaspan.pipeline.runner import EngineFull
from duetaspan.pipeline.service import DuetaSpanService

log = logging.getLogger(__name__)


@dataclass
class CallInfo:
    """Who and what a call is, as the transport knows it."""

    call_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    caller: str | None = None
    called: str | None = None
    transport: str = "unknown"  # "twilio", "webrtc", ...
    params: dict[str, Any] = field(default_factory=dict)  # e.g. Twilio <Parameter>s


class CallSession:
    """A call in progress. Built by `Agent.create_session`; not reused across calls.

    Attributes:
        call: the `CallInfo`.
        context: the call's `duetaspan.registry.CallContext` (tools see it; DTMF digits are appended to it).
        service: the call's `DuetaSpanService`.
        record: the call's artifact record after `run()` (None without a record dir).
        outcome: how `run()` ended: `completed`, `refused` (no free engine slot) or `failed` (an error, or the
            engine went down under the call: the record's `ended_by` is then `engine_error`); None before it
            ends. `on_close(session)` can read it.
    """

    def __init__(
        self,
        call: CallInfo,
        service: DuetaSpanService,
        transport: Any = None,
        *,
        context: Any = None,
        pipeline_params: PipelineParams | None = None,
        processors_before: list[FrameProcessor] | None = None,
        processors_after: list[FrameProcessor] | None = None,
        on_close: Any = None,
    ) -> None:
        self.call = call
        self.service = service
        self.transport = transport
        self.context = context
        self.pipeline_params = pipeline_params or PipelineParams(audio_out_sample_rate=SAMPLE_RATE)
        self._before = processors_before or []
        self._after = processors_after or []
        self._on_close = on_close
        self.worker: PipelineWorker | None = None
        self.record: dict[str, Any] | None = None
        self.outcome: str | None = None
        self._ended = asyncio.Event()

    async def open(self) -> None:
        """Take an engine slot now; raises `EngineFull` when the agent is at capacity."""
        if self.service.slot is None:
            try:
                await self.service.attach()
            except EngineFull as exc:
                if self.service.recorder is not None:
                    self.service.recorder.event("error", stage="admission", message=str(exc))
                raise

    def build_pipeline(self) -> Pipeline:
        """`transport.input() -> [before...] -> service -> [after...] -> transport.output()`."""
        if self.transport is None:
            raise ValueError(f"call {self.call.call_id}: no transport given to create_session()")
        return Pipeline(
            [self.transport.input(), *self._before, self.service, *self._after, self.transport.output()]
        )

    async def run(self) -> dict[str, Any] | None:
        """Run the call to its end; returns the consolidated call record (or None without recording)."""
        self.outcome = "failed"  # until the call is seen through
        try:
            try:
                await self.open()
            except EngineFull:
                self.outcome = "refused"
                raise
            self.worker = PipelineWorker(
                self.build_pipeline(),
                params=self.pipeline_params,
                # The model may listen in silence for minutes; the call ends when the transport says so.
                idle_timeout_secs=None,
                cancel_on_idle_timeout=False,
                enable_rtvi=False,
            )
            runner = WorkerRunner(handle_sigint=False)
            await runner.add_workers(self.worker)
            await runner.run()
            # an engine that went down under the call cancels it: the pipeline ends "normally" (a restarted
            # engine process may be running again by now, so the service's own record of it counts first)
            crashed = self.service.engine_error is not None
            crashed = crashed or getattr(self.service.runner, "error", None) is not None
            self.outcome = "failed" if crashed else "completed"
        finally:
            await self._close()
        return self.record

    async def end(self) -> None:
        """End the call gracefully (queued audio drains first)."""
        if self.worker is not None:
            await self.worker.queue_frame(EndFrame())

    async def cancel(self) -> None:
        """End the call now (the caller hung up or the socket dropped)."""
        if self.worker is not None:
            await self.worker.queue_frame(CancelFrame())

    async def _close(self) -> None:
        # The service frees its slot and closes its artifacts on stop/cancel/cleanup; this covers a pipeline
        # that never started (e.g. a transport that failed before StartFrame).
        await self.service.close()
        if self.service.recorder is not None:
            self.record = self.service.recorder.close()
        if self._on_close is not None:
            result = self._on_close(self)
            if asyncio.iscoroutine(result):
                await result
        self._ended.set()

    async def wait_closed(self) -> None:
        await self._ended.wait()
