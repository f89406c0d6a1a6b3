"""Run a processor in a real Pipecat pipeline fed with paced caller audio, collecting what comes out."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from pipecat.frames.frames import CancelFrame, EndFrame, Frame, InputAudioRawFrame, StartFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner

from duetaspan.testing.line import chunks_at  # noqa: F401 - the suite's older import


class Collector(FrameProcessor):
    """The pipeline's last processor: keeps every downstream frame (and upstream ones that reach it)."""

    def __init__(self) -> None:
        super().__init__()
        self.down: list[Frame] = []
        self.up: list[Frame] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if not isinstance(frame, StartFrame):
            (self.down if direction == FrameDirection.DOWNSTREAM else self.up).append(frame)
        await self.push_frame(frame, direction)


class UpstreamCollector(FrameProcessor):
    """The pipeline's first processor: keeps frames that travel upstream."""

    def __init__(self) -> None:
        super().__init__()
        self.up: list[Frame] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == FrameDirection.UPSTREAM:
            self.up.append(frame)
        await self.push_frame(frame, direction)


@dataclass
class CallResult:
    down: list[Frame] = field(default_factory=list)
    up: list[Frame] = field(default_factory=list)

    def of(self, cls: type) -> list:
        return [f for f in self.down if isinstance(f, cls)]


async def run_call(
    processor: FrameProcessor,
    chunks: list[bytes],
    rate: int,
    *,
    chunk_s: float = 0.02,
    tail_s: float = 0.3,
    end: str = "end",
    during=None,
    enable_metrics: bool = False,
    out_rate: int = 24000,
) -> CallResult:
    """Feed `chunks` at real-time pace through `[first, processor, collector]`, then end or cancel the call.

    `during(worker)` (optional coroutine) runs concurrently with the feed, e.g. to force a `<ret>`.
    """
    first, last = UpstreamCollector(), Collector()
    worker = PipelineWorker(
        Pipeline([first, processor, last]),
        params=PipelineParams(
            audio_in_sample_rate=rate, audio_out_sample_rate=out_rate, enable_metrics=enable_metrics
        ),
        cancel_on_idle_timeout=False,
        enable_rtvi=False,
        idle_timeout_secs=None,
    )
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(_worker, _frame):
        started.set()

    async def feed() -> None:
        await asyncio.wait_for(started.wait(), 10)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for i, chunk in enumerate(chunks):
            await worker.queue_frame(InputAudioRawFrame(audio=chunk, sample_rate=rate, num_channels=1))
            await asyncio.sleep(max(0.0, t0 + (i + 1) * chunk_s - loop.time()))
        await asyncio.sleep(tail_s)
        await worker.queue_frame(EndFrame() if end == "end" else CancelFrame())

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    jobs = [runner.run(), feed()]
    if during is not None:
        jobs.append(during(worker))
    await asyncio.wait_for(asyncio.gather(*jobs), 60)
    return CallResult(down=last.down, up=first.up + last.up)
