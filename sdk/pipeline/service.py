"""`DuetaSpanService`: the duplex model as ONE full-duplex Pipecat processor.

Like Pipecat's own full-duplex services (OpenAI Live), it streams caller audio in and the model's audio out
with no client-side turn detection: the model decides when to talk, hears barge-in and stops by itself. So it
recommends `ExternalUserTurnStrategies(enable_interruptions=False)` and never broadcasts an
`InterruptionFrame` (that would flush audio and cancel work on every caller sound).

In:  `InputAudioRawFrame` at any rate -> zero-latency resample to 24 kHz -> leveller (-24 LUFS) -> exact
     1920-sample frames -> this call's slot on the `EngineRunner` (and the retrieval's question capture).
     Every frame is forwarded, so recorders downstream still see the caller's audio.
Out (downstream, at the engine clock's pace): `SpeechOutputAudioRawFrame` per 80 ms (frames the model marks
     silent are digital zero, so Pipecat's bot-speaking detection works), `TTSTextFrame` per word piece, and
     our frames: `RetFrame`, `SpanFrame`, `NoSpanFrame`, `LateSpanFrame`, `RetrievalEventFrame`,
     `AgentBargedInFrame` (system frame: overtakes queued audio).

Model compute runs on the runner's engine thread; this processor only moves arrays on the event loop.

Event handlers available: `on_ret(service, RetFrame)`, `on_span(service, SpanFrame)`,
`on_no_span(service, NoSpanFrame)`, `on_late_span(service, LateSpanFrame)`,
`on_barge_in(service, AgentBargedInFrame)`, `on_dtmf(service, digit)`.

Example:
    >>> async def bot(transport, runner):                    # doctest: +SKIP
    ...     service = DuetaSpanService(runner, call_id="CA1")
    ...     await service.attach()                           # raises EngineFull when no slot is free
    ...     worker = PipelineWorker(Pipeline([transport.input(), service, transport.output()]))
    ...     await WorkerRunner(handle_sigint=False).run(worker)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from pipecat.frames.frames import (
    CancelFrame,
    CancelWorkerFrame,
    EndFrame,
    Frame,
    InputAudioRawFrame,
    InputDTMFFrame,
    LLMServiceMetadataFrame,
    MetricsFrame,
    SpeechOutputAudioRawFrame,
    StartFrame,
    TranscriptionFrame,
    TTSTextFrame,
)
from pipecat.metrics.metrics import ProcessingMetricsData
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.ai_service import AIService
from pipecat.services.settings import ServiceSettings
from pipecat.turns.user_turn_strategies import ExternalUserTurnStrategies
from pipecat.utils.text.base_text_aggregator import TextType
from pydantic import BaseModel, Field

from duetaspan.model.convention import FRAME_MS, FRAME_SIZE, SAMPLE_RATE
from duetaspan.pipeline.artifacts import CallRecorder
from duetaspan.pipeline.frames import (
    AgentBargedInFrame,
    LateSpanFrame,
    NoSpanFrame,
    RetFrame,
    RetrievalEventFrame,
    SpanFrame,
)
from duetaspan.pipeline.leveller import Leveller, LevellerConfig
from duetaspan.pipeline.resample import (
    FrameBlocker,
    Quality,
    StreamResampler,
    float_to_int16_bytes,
    int16_bytes_to_float,
)
from duetaspan.pipeline.runner import CallSlot, EngineRunner, TickOutput

log = logging.getLogger(__name__)

METRICS_EVERY_FRAMES = 12  # ~1 s


class Retrieval(Protocol):
    """A call's `<ret>` backend (the router's retrieval manager, or anything with these methods).

    It receives the levelled caller audio, is told about each `<ret>`, and answers through the `deliver`
    and `on_event` callbacks it was built with (see `RetrievalFactory`).
    """

    def feed(self, pcm: np.ndarray, t: float) -> Any: ...
    def on_ret(self, frame_index: int, t: float) -> Any: ...
    def close(self) -> Any: ...


# deliver(reference, meta) queues a span; on_event(event) records/forwards a retrieval event.
Deliver = Callable[[str, dict[str, Any] | None], Any]
OnEvent = Callable[[Any], Any]
RetrievalFactory = Callable[[Deliver, OnEvent], Retrieval]


class BargeInConfig(BaseModel):
    """When an agent going silent counts as the caller barging in."""

    caller_dbfs: float = Field(-42.0, description="caller frame RMS above this counts as speech")
    min_agent_frames: int = Field(3, ge=1, description="agent speech before the stop (frames of 80 ms)")
    min_overlap_frames: int = Field(2, ge=1, description="caller speech overlapping the agent's last frames")


@dataclasses.dataclass
class _SpanMeta:
    meta: dict[str, Any]
    delivered_at: float


def _event_dict(event: Any) -> dict[str, Any]:
    if isinstance(event, dict):
        return dict(event)
    if hasattr(event, "model_dump"):
        return event.model_dump(mode="json")
    if dataclasses.is_dataclass(event) and not isinstance(event, type):
        return dataclasses.asdict(event)
    return {"kind": type(event).__name__, "repr": repr(event)}


def _kind(ev: dict[str, Any]) -> str:
    return str(ev.get("kind") or ev.get("type") or ev.get("event") or "").lower()


class DuetaSpanService(AIService):
    """The duplex model for one call, as a full-duplex Pipecat service.

    Args:
        runner: the engine runner (one per engine, shared by calls).
        call_id: the call's id (artifact names, logs).
        persona, sampling, seed: passed to `engine.open_slot`.
        leveller: caller-audio levelling settings (`LevellerConfig(enabled=False)` turns it off).
        resample_quality: SOXR quality for caller audio ("QQ": no added latency, see `resample.py`).
        retrieval: factory of the call's `<ret>` backend, given `deliver` and `on_event`.
        recorder: writes the call's wav + event log as it goes.
        barge_in: barge-in detection thresholds.
        model_name: the model name reported in Pipecat metrics.
    """

    def __init__(
        self,
        runner: EngineRunner,
        *,
        call_id: str,
        persona: Any = None,
        sampling: Any = None,
        seed: int | None = None,
        leveller: LevellerConfig | None = None,
        resample_quality: Quality = "QQ",
        retrieval: RetrievalFactory | None = None,
        recorder: CallRecorder | None = None,
        barge_in: BargeInConfig | None = None,
        model_name: str = "duetaspan",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("settings", ServiceSettings(model=model_name))
        super().__init__(**kwargs)
        self.runner = runner
        self.call_id = call_id
        self._persona, self._sampling, self._seed = persona, sampling, seed
        self.leveller = Leveller(leveller, sample_rate=SAMPLE_RATE)
        self._quality: Quality = resample_quality
        self._resampler: StreamResampler | None = None
        self._blocker = FrameBlocker(FRAME_SIZE)
        self.recorder = recorder
        self.barge_in = barge_in or BargeInConfig()
        self.retrieval: Retrieval | None = (
            retrieval(self.deliver, self.on_retrieval_event) if retrieval else None
        )
        self.slot: CallSlot | None = None
        self._out: asyncio.Queue[Frame | None] | None = None
        self._out_task: asyncio.Task | None = None
        self._started = False
        self.started = asyncio.Event()  # set once the pipeline has started this service
        self._closed = False
        self._frames_in = 0
        self._ret_times: list[float] = []
        self._span_meta: dict[str, _SpanMeta] = {}
        self._agent_run = 0  # consecutive non-silent agent frames
        self._caller_run = 0  # consecutive caller frames above the speech threshold
        self._caller_thr = 10 ** (self.barge_in.caller_dbfs / 20.0)
        self.stats: dict[str, Any] = {"rets": 0, "spans": 0, "barge_ins": 0, "text_frames": 0}
        self._tasks: set[asyncio.Future] = set()
        for name in ("on_ret", "on_span", "on_no_span", "on_late_span", "on_barge_in", "on_dtmf"):
            self._register_event_handler(name)

    # pipecat hooks ------------------------------------------------------------------------------
    def can_generate_metrics(self) -> bool:
        return True

    def service_metadata_frame(self) -> LLMServiceMetadataFrame:
        # Not a "realtime" (turn-based) service: the model takes turns itself, nothing should interrupt it.
        return LLMServiceMetadataFrame(
            service_name=self.name,
            user_turn_strategies=ExternalUserTurnStrategies(enable_interruptions=False),
        )

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        self._out = asyncio.Queue()
        self._out_task = self.create_task(self._push_outputs(), f"{self}::outputs")
        self._started = True
        if self.slot is None:
            await self.attach()
        self.started.set()

    async def stop(self, frame: EndFrame) -> None:
        await super().stop(frame)
        await self._shutdown("end")

    async def cancel(self, frame: CancelFrame) -> None:
        await super().cancel(frame)
        await self._shutdown("cancel")

    async def cleanup(self) -> None:
        await super().cleanup()
        await self._shutdown("cleanup")

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, InputAudioRawFrame) and direction == FrameDirection.DOWNSTREAM:
            self._feed_caller(frame)
        elif isinstance(frame, InputDTMFFrame):
            await self._call_event_handler("on_dtmf", frame.button.value)
        await self.push_frame(frame, direction)

    # call lifecycle -----------------------------------------------------------------------------
    async def attach(self) -> CallSlot:
        """Take a slot on the engine now (admission control: raises `EngineFull` when all are busy)."""
        if self.slot is None:
            self.slot = await self.runner.attach(
                self.call_id,
                self._on_tick,
                persona=self._persona,
                sampling=self._sampling,
                seed=self._seed,
                on_error=self._on_engine_error,
            )
        return self.slot

    async def close(self) -> None:
        """Free the slot, close the retrieval and the artifacts (idempotent; the pipeline's end does this too)."""
        await self._shutdown("closed")

    async def _shutdown(self, how: str) -> None:
        if self._closed:
            return
        self._closed = True
        if self.slot is not None:
            await self.slot.close()
        if self.retrieval is not None:
            with contextlib.suppress(Exception):
                await _maybe_await(self.retrieval.close())
        if self._out is not None:
            self._out.put_nowait(None)
        if self._out_task is not None and how != "end":
            await self.cancel_task(self._out_task, timeout=1.0)
        elif self._out_task is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._out_task), 2.0)
        if self.recorder is not None:
            self.recorder.close(ended_by=how, **self.summary())

    def summary(self) -> dict[str, Any]:
        """Call figures: slot input stats, clock timing, leveller state, event counts."""
        out: dict[str, Any] = dict(self.stats)
        if self.slot is not None:
            out["input"] = dataclasses.asdict(self.slot.stats)
        out["clock"] = self.runner.clock.summary()
        out["leveller"] = {"enabled": self.leveller.enabled, "gain_db": round(self.leveller.gain_db, 2)}
        return out

    # caller audio -------------------------------------------------------------------------------
    def _feed_caller(self, frame: InputAudioRawFrame) -> None:
        if self.slot is None or self._closed:
            return
        pcm = int16_bytes_to_float(frame.audio)
        if frame.num_channels > 1:
            pcm = pcm.reshape(-1, frame.num_channels).mean(axis=1)
        if self._resampler is None or self._resampler.in_rate != frame.sample_rate:
            self._resampler = StreamResampler(frame.sample_rate, SAMPLE_RATE, self._quality)
        pcm = self.leveller.process(self._resampler.process(pcm))
        for block in self._blocker.push(pcm):
            t = self._frames_in * FRAME_MS / 1000.0
            self._frames_in += 1
            self.slot.push(block)
            if self.retrieval is not None:
                self._spawn(self.retrieval.feed(block, t))

    # engine outputs (called on this loop by the runner) -----------------------------------------
    def _on_tick(self, out: TickOutput) -> None:
        if self._closed:
            return
        r = out.result
        frames: list[Frame] = []
        audio = bytes(FRAME_SIZE * 2) if r.silent else float_to_int16_bytes(r.pcm)
        frames.append(SpeechOutputAudioRawFrame(audio=audio, sample_rate=SAMPLE_RATE, num_channels=1))
        for span in r.spans:
            frames.append(self._span_frame(span, out))
        if r.text:
            self.stats["text_frames"] += 1
            agent_text = getattr(self.retrieval, "on_agent_text", None)
            if agent_text is not None:
                agent_text(r.text, out.t)  # the router knows what the agent already said
            text = TTSTextFrame(text=r.text, text_type=TextType.WORD)
            text.includes_inter_frame_spaces = True
            frames.append(text)
        if r.is_ret:
            frames.append(self._ret_frame(out))
        barge = self._detect_barge_in(out)
        if self.recorder is not None:
            self.recorder.write_frame(out.caller_pcm, np.zeros(FRAME_SIZE, np.float32) if r.silent else r.pcm)
            self.recorder.event(
                "frame",
                i=out.call_frame,
                t=round(out.t, 3),
                engine_frame=r.frame_index,
                text=r.text,
                ret=bool(r.is_ret),
                silent=bool(r.silent),
                concealed=out.concealed,
                step_ms=round(float(r.step_ms), 3),
                lateness_ms=round(out.lateness_ms, 3),
            )
        if self.metrics_enabled and out.call_frame % METRICS_EVERY_FRAMES == 0:
            frames.append(self._metrics_frame(out))
        if self._started and self._out is not None:
            for f in frames:
                self._out.put_nowait(f)
        if barge is not None:
            self._spawn(self.push_frame(barge))  # a system frame: overtakes the queued audio
            self._spawn(self._call_event_handler("on_barge_in", barge))

    def _metrics_frame(self, out: TickOutput) -> MetricsFrame:
        # Pipecat metrics (with PipelineParams(enable_metrics=True)): the model step and the clock's lateness
        # against its absolute grid, in seconds, once a second.
        return MetricsFrame(
            data=[
                ProcessingMetricsData(
                    processor=f"{self.name}.engine_step", value=float(out.result.step_ms) / 1e3
                ),
                ProcessingMetricsData(processor=f"{self.name}.clock_lateness", value=out.lateness_ms / 1e3),
            ]
        )

    def _ret_frame(self, out: TickOutput) -> RetFrame:
        self.stats["rets"] += 1
        frame = RetFrame(frame_index=out.call_frame, t=out.t)
        self._ret_times.append(time.monotonic())
        if self.recorder is not None:
            self.recorder.event("ret", frame_index=out.call_frame, t=round(out.t, 3))
        if self.retrieval is not None:
            self._spawn(self.retrieval.on_ret(out.call_frame, out.t))
        self._spawn(self._call_event_handler("on_ret", frame))
        return frame

    def _span_frame(self, span: Any, out: TickOutput) -> SpanFrame:
        self.stats["spans"] += 1
        reference = str(getattr(span, "reference", ""))
        info = self._span_meta.pop(reference, None)
        meta = info.meta if info else {}
        latency = None
        if self._ret_times:
            latency = (time.monotonic() - self._ret_times[-1]) * 1000.0
        frame = SpanFrame(
            reference=reference,
            frame_index=out.call_frame,
            t=out.t,
            n_frames=int(getattr(span, "n_frames", 0)),
            prefill_ms=float(getattr(span, "prefill_ms", 0.0)),
            question=meta.get("question"),
            tool=meta.get("tool"),
            arguments=meta.get("arguments"),
            latency_ms=None if latency is None else round(latency, 1),
        )
        if self.recorder is not None:
            self.recorder.event(
                "span",
                reference=frame.reference,
                frame_index=frame.frame_index,
                t=round(frame.t, 3),
                n_frames=frame.n_frames,
                prefill_ms=round(frame.prefill_ms, 2),
                question=frame.question,
                tool=frame.tool,
                arguments=frame.arguments,
                latency_ms=frame.latency_ms,
            )
        self._spawn(self._call_event_handler("on_span", frame))
        return frame

    def _detect_barge_in(self, out: TickOutput) -> AgentBargedInFrame | None:
        caller_rms = float(np.sqrt(np.mean(np.square(out.caller_pcm))))
        self._caller_run = self._caller_run + 1 if caller_rms > self._caller_thr else 0
        barge = None
        if not out.result.silent:
            self._agent_run += 1
        else:
            cfg = self.barge_in
            if self._agent_run >= cfg.min_agent_frames and self._caller_run >= cfg.min_overlap_frames:
                self.stats["barge_ins"] += 1
                barge = AgentBargedInFrame(frame_index=out.call_frame, t=out.t, spoke_frames=self._agent_run)
                if self.recorder is not None:
                    self.recorder.event(
                        "barge_in",
                        frame_index=out.call_frame,
                        t=round(out.t, 3),
                        spoke_frames=self._agent_run,
                    )
            self._agent_run = 0
        return barge

    def _on_engine_error(self, exc: BaseException) -> None:
        if self.recorder is not None:
            self.recorder.event("error", stage="engine", message=str(exc))
        self._spawn(self.push_error(f"duplex engine step failed: {exc}", exception=exc))
        if getattr(exc, "ends_call", False):  # the engine itself is gone (e.g. its process died): hang up
            self._spawn(self.push_frame(CancelWorkerFrame(reason=str(exc)), FrameDirection.UPSTREAM))

    async def _push_outputs(self) -> None:
        assert self._out is not None
        while True:
            frame = await self._out.get()
            if frame is None:
                return
            await self.push_frame(frame)

    # retrieval callbacks ------------------------------------------------------------------------
    def deliver(self, reference: str, meta: dict[str, Any] | None = None) -> bool:
        """Queue a reference as a Context Span for this call (the retrieval's delivery callback)."""
        if self.slot is None or self._closed:
            log.warning("call %s: reference dropped, no active slot", self.call_id)
            return False
        self._span_meta[reference] = _SpanMeta(meta or {}, time.monotonic())
        return self.slot.inject(reference)

    def on_retrieval_event(self, event: Any) -> None:
        """Record a retrieval event and turn the ones a pipeline cares about into frames."""
        ev = _event_dict(event)
        kind = _kind(ev)
        frame: Frame | None = None
        handler = None
        record_as = "retrieval"
        if "late" in kind:
            frame = LateSpanFrame(
                question=ev.get("question"),
                reference=ev.get("reference"),
                seconds=float(ev.get("seconds") or ev.get("deadline_s") or 0.0),
                t=float(ev.get("t") or 0.0),
            )
            handler, record_as = "on_late_span", "late_span"
        elif "no_span" in kind or "nospan" in kind:
            frame = NoSpanFrame(
                question=ev.get("question"), reason=str(ev.get("reason") or ""), t=float(ev.get("t") or 0.0)
            )
            handler, record_as = "on_no_span", "no_span"
        elif "utterance" in kind and ev.get("text"):
            record_as = "caller_utterance"
            frame = TranscriptionFrame(
                text=str(ev["text"]), user_id=self.call_id, timestamp=str(ev.get("t", "")), finalized=True
            )
        else:
            frame = RetrievalEventFrame(event=ev)
        if self.recorder is not None:
            self.recorder.event(record_as, **{k: v for k, v in ev.items() if k != "type"})
        if self._closed:  # hung up: still recorded (the retrieval's cancellation), but no frames or handlers
            return
        if frame is not None and self._started:
            direction = (
                FrameDirection.UPSTREAM
                if isinstance(frame, TranscriptionFrame)
                else FrameDirection.DOWNSTREAM
            )
            if direction == FrameDirection.DOWNSTREAM and self._out is not None:
                self._out.put_nowait(frame)
            else:
                self._spawn(self.push_frame(frame, direction))
        if handler is not None:
            self._spawn(self._call_event_handler(handler, frame))

    # helpers ------------------------------------------------------------------------------------
    def _spawn(self, maybe: Any) -> None:
        if inspect.isawaitable(maybe):
            task = asyncio.ensure_future(maybe)
            self._tasks.add(task)  # keep a reference until done
            task.add_done_callback(self._tasks.discard)
            task.add_done_callback(_log_task_error)


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


def _log_task_error(task: asyncio.Future) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("duetaspan pipeline task failed: %r", task.exception())


__all__ = ["BargeInConfig", "Deliver", "DuetaSpanService", "OnEvent", "Retrieval", "RetrievalFactory"]
