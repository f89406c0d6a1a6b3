"""`DuetaSpanService`: the duplex model as ONE full-duplex Pipecat processor.

Drop it into any Pipecat pipeline in place of STT + LLM + TTS (see docs/pipeline.md for the frame table):

    Pipeline([transport.input(), ctx.user(), service, transport.output(), ctx.assistant()])

Like Pipecat's own speech-to-speech services it streams audio both ways with no client-side turn detection:
the model takes turns, hears barge-in and stops by itself (then it pushes an `InterruptionFrame`, so output
transports drop the audio they hold; `ExternalUserTurnStrategies(enable_interruptions=False)` recommended).
In: caller audio at any rate (resampled, levelled, cut into 80 ms frames for the engine slot and question
capture). Out: agent audio, turns, words, transcripts, metrics, `<ret>`/span frames (docs/pipeline.md).

It takes its engine slot at `StartFrame` (unless `attach()` took it earlier). With no free slot it pushes a
permanent `ErrorFrame` upstream (`on_pipeline_error` fires) and ends the pipeline (`EndWorkerFrame`), so the
transport hangs up. When the engine goes down under the call (its steps kept failing, its process died) it
pushes a fatal, permanent `ErrorFrame` and cancels the pipeline; `engine_error` keeps the reason and the
call's record says `ended_by: "engine_error"` (the Twilio bridge then plays its apology). At `EndFrame`/`CancelFrame` it frees the slot and writes the call's artifacts.
Model compute runs on the runner's engine thread; this processor only moves arrays on the event loop.

Event handlers: `on_ret(service, RetFrame)`, `on_span(service, SpanFrame)`, `on_persona_pin(service,
PersonaPinFrame)` (a re-pin, not a span), `on_no_span(service, NoSpanFrame)`, `on_late_span(service, LateSpanFrame)`,
`on_barge_in(service, AgentBargedInFrame)`, `on_dtmf(service, digit)`, `on_answer(service, Verdict)` (who answered).

Example:
    >>> service = agent.service(CallInfo("CA1", caller="+15550001111"))  # doctest: +SKIP
    >>> ctx = LLMContextAggregatorPair(LLMContext())                      # doctest: +SKIP
    >>> pipeline = Pipeline([transport.input(), ctx.user(), service, transport.output(), ctx.assistant()])  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    EndWorkerFrame,
    Frame,
    InputAudioRawFrame,
    InputDTMFFrame,
    InterruptionFrame,
    LLMServiceMetadataFrame,
    StartFrame,
    TranscriptionFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessorSetup
from pipecat.services.ai_service import AIService
from pipecat.services.settings import ServiceSettings
from pipecat.turns.user_turn_strategies import ExternalUserTurnStrategies

from duetaspan.model.convention import FRAME_MS, FRAME_SIZE, SAMPLE_RATE
from duetaspan.pipeline.admission import Admission, Slot
from duetaspan.pipeline.agent_speech import AgentAudio, AgentTurns, BargeIn, BargeInConfig, InterruptMark
from duetaspan.pipeline.artifacts import CallRecorder
from duetaspan.pipeline.call_end import close_record, close_retrieval, engine_failed, refuse, watch_duration
from duetaspan.pipeline.caller_speech import CallerTurns
from duetaspan.pipeline.frames import AgentBargedInFrame, CallEndedByFrame
from duetaspan.pipeline.leveller import Leveller, LevellerConfig
from duetaspan.pipeline.resample import (
    FrameBlocker,
    Quality,
    StreamResampler,
    int16_bytes_to_float,
)
from duetaspan.pipeline.retrieval_events import (
    Deliver,
    OnEvent,
    Retrieval,
    RetrievalEvents,
    RetrievalFactory,
)
from duetaspan.pipeline.runner import CallSlot, EngineFull, EngineRunner, RunnerStopped, TickOutput
from duetaspan.pipeline.service_metrics import TTFB, DuplexUsage, processing_frame, ttfb_frame, usage_frame

log = logging.getLogger(__name__)

USAGE_EVERY_FRAMES = 12  # ~1 s


class DuetaSpanService(AIService):
    """The duplex model for one call, as a full-duplex Pipecat service.

    Args:
        runner: the engine runner (one per engine, shared by calls).
        call_id: the call's id (artifact names, logs).
        user_id: the caller's id on `TranscriptionFrame`s (default: the call id).
        persona, sampling, seed: passed to `engine.open_slot`.
        leveller: caller-audio levelling settings (`LevellerConfig(enabled=False)` turns it off).
        resample_quality: SOXR quality for caller and agent audio ("QQ": no added latency, see `resample.py`).
        retrieval: factory of the call's `<ret>` backend, given `deliver` and `on_event`.
        recorder: writes the call's wav + event log as it goes.
        barge_in: barge-in detection thresholds.
        end_turn_frames: silent agent frames (80 ms) that end an agent turn.
        model_name: the model name reported in Pipecat metrics.
        admission, transport: the server's call budget (`pipeline.admission`): the call's slot there first.
        max_call_s: end the call this long after it starts (`ended_by: "max_duration"`); None: no limit.
    """

    def __init__(
        self,
        runner: EngineRunner,
        *,
        call_id: str,
        user_id: str | None = None,
        persona: Any = None,
        sampling: Any = None,
        seed: int | None = None,
        leveller: LevellerConfig | None = None,
        resample_quality: Quality = "QQ",
        retrieval: RetrievalFactory | None = None,
        recorder: CallRecorder | None = None,
        barge_in: BargeInConfig | None = None,
        end_turn_frames: int = 6,
        model_name: str = "duetaspan",
        admission: Admission | None = None,
        transport: str = "pipecat",
        max_call_s: float | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("settings", ServiceSettings(model=model_name))
        super().__init__(**kwargs)
        self.runner = runner
        self.call_id = call_id
        self.model_name = model_name
        self._persona, self._sampling, self._seed = persona, sampling, seed
        self.leveller = Leveller(leveller, sample_rate=SAMPLE_RATE)
        self._quality: Quality = resample_quality
        self._resampler: StreamResampler | None = None
        self._blocker = FrameBlocker(FRAME_SIZE)
        self.audio_out = AgentAudio(SAMPLE_RATE, resample_quality)  # the pipeline's rate, set at setup
        self.recorder = recorder
        # taps: the caller's 24 kHz audio before levelling (answer detection), and filters of each engine tick
        # in order (the answer gate silencing the agent, a consent notice played over it)
        self.caller_taps: list[Callable[[Any], None]] = []  # float32 numpy arrays
        self.tick_filters: list[Callable[[TickOutput], TickOutput]] = []
        self.barge_in = BargeIn(barge_in)
        self.agent = AgentTurns(end_silence_frames=end_turn_frames)
        self.caller = CallerTurns(user_id=user_id or call_id)
        self.ttfb = TTFB()
        self.usage = DuplexUsage()
        self.retrieval: Retrieval | None = (
            retrieval(self.deliver, self.on_retrieval_event) if retrieval else None
        )
        self._events = RetrievalEvents(self)
        self.slot: CallSlot | None = None
        self.admission, self.transport = admission, transport
        self.admitted: Slot | None = None  # the call's slot in `admission`
        self.context: Any = None  # the call's `CallContext` when an `Agent` built this service
        self._out: asyncio.Queue[Frame | InterruptMark | None] | None = None
        self._out_task: asyncio.Task | None = None
        self._started = False
        self.started = asyncio.Event()  # set once the pipeline has started this service
        self.refused: BaseException | None = None  # why the call got no slot at StartFrame
        self.engine_error: BaseException | None = None  # why the engine went down under the call
        self.ended_by: str | None = None  # the record's, when the call ended for a reason of its own
        self.max_call_s, self._max_task = max_call_s, None  # the call's length limit and its timer
        self._closed, self._frames_in = False, 0
        self.agent_held = False  # the slot opens with the model's agent held at silence (answer detection)
        self.stats: dict[str, Any] = {"rets": 0, "spans": 0, "barge_ins": 0, "text_frames": 0}
        self._tasks: set[asyncio.Future] = set()
        for name in ("on_ret", "on_span", "on_persona_pin", "on_no_span", "on_late_span", "on_barge_in",
                     "on_dtmf", "on_answer"):  # fmt: skip
            self._register_event_handler(name)

    # pipecat hooks ------------------------------------------------------------------------------
    def can_generate_metrics(self) -> bool:
        return True

    def service_metadata_frame(self) -> LLMServiceMetadataFrame:
        # A realtime (speech-to-speech) service, like OpenAI Realtime and Gemini Live: the aggregators then
        # write the caller's turn when the agent starts answering, which absorbs transcripts that arrive
        # after the caller stopped. Interruptions stay off: the model takes turns itself.
        return LLMServiceMetadataFrame(
            service_name=self.name,
            is_realtime_service=True,
            user_turn_strategies=ExternalUserTurnStrategies(enable_interruptions=False),
        )

    async def setup(self, setup: FrameProcessorSetup) -> None:
        await super().setup(setup)
        # the pipeline's rates (PipelineParams -> StartFrame); input frames still carry their own rate
        self.audio_out = AgentAudio(int(setup.audio_out_sample_rate or SAMPLE_RATE), self._quality)
        in_rate = int(setup.audio_in_sample_rate or SAMPLE_RATE)
        self._resampler = StreamResampler(in_rate, SAMPLE_RATE, self._quality)

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        self._out = asyncio.Queue()
        self._out_task = self.create_task(self._push_outputs(), f"{self}::outputs")
        self._started = True
        if self.slot is None:
            try:
                await self.attach()
            except (EngineFull, RunnerStopped) as exc:
                await refuse(self, exc)
                return
            log.info("call %s: on engine slot %d", self.call_id, self.slot.slot)
        self.started.set()
        self._max_task = watch_duration(self)

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
        elif isinstance(frame, CallEndedByFrame):
            self.ended_by = self.ended_by or frame.ended_by
        await self.push_frame(frame, direction)

    # call lifecycle -----------------------------------------------------------------------------
    async def attach(self) -> CallSlot:
        """Take a slot on the engine now (admission control: raises `EngineFull` when all are busy)."""
        if self.admission is not None and self.admitted is None:  # the server's budget first (drain refuses)
            self.admitted = self.admission.admit(self.transport, self.call_id, self._end_pipeline)
        if self.slot is None:
            self.slot = await self.runner.attach(
                self.call_id, self._on_tick, persona=self._persona, sampling=self._sampling, seed=self._seed,
                on_error=self._on_engine_error, hold_agent=self.agent_held,
            )  # fmt: skip
        return self.slot

    async def _end_pipeline(self) -> None:  # the server ends the call (drain, shutdown)
        await self.push_frame(EndWorkerFrame(reason="server shutting down"), FrameDirection.UPSTREAM)

    async def close(self) -> None:
        """Free the slot, close the retrieval and artifacts (idempotent; the pipeline's end does it too)."""
        await self._shutdown("closed")

    async def _shutdown(self, how: str) -> None:
        if self._closed:
            return
        self._closed = True
        if self._max_task is not None:
            self._max_task.cancel()
        if self.slot is not None:
            await self.slot.close()
        await close_retrieval(self.retrieval)
        self._events.call_ended()  # spans queued that never landed: `span_dropped` in the record
        if self._out is not None:
            for frame in self.agent.close():  # the open agent turn ends with the call
                self._out.put_nowait(frame)
            self._out.put_nowait(None)
        if self._out_task is not None and how != "end":
            await self.cancel_task(self._out_task, timeout=1.0)
        elif self._out_task is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._out_task), 2.0)
        close_record(self, how)  # the record, saying why the call ended (`call_end.py`)
        if self.admitted is not None:
            self.admitted.release()

    def summary(self) -> dict[str, Any]:
        """Call figures: slot input stats, clock timing, leveller state, event counts, usage."""
        out: dict[str, Any] = dict(self.stats)
        if self.slot is not None:
            out["input"] = dataclasses.asdict(self.slot.stats)
        out["clock"] = self.runner.clock.summary()
        out["leveller"] = {"enabled": self.leveller.enabled, "gain_db": round(self.leveller.gain_db, 2)}
        out["usage"] = self.usage.model_dump()
        out["agent_turns"] = self.agent.turns
        out["caller_turns"] = self.caller.utterances
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
        pcm = self._resampler.process(pcm)
        for tap in self.caller_taps:
            tap(pcm)
        pcm = self.leveller.process(pcm)
        for block in self._blocker.push(pcm):
            if self._frames_in == 0:
                self.caller.started_at = time.time()  # call stream time 0, for transcript timestamps
            t = self._frames_in * FRAME_MS / 1000.0
            self._frames_in += 1
            self.slot.push(block)
            if self.retrieval is not None:
                self.spawn(self.retrieval.feed(block, t))

    # engine outputs (called on this loop by the runner) -----------------------------------------
    def _on_tick(self, out: TickOutput) -> None:
        if self._closed:
            return
        for tick_filter in self.tick_filters:
            out = tick_filter(out)
        r = out.result
        frames: list[Frame | InterruptMark] = [self.audio_out.frame(r.pcm, bool(r.silent))]
        self.usage.frames_in, self.usage.frames_out = self._frames_in, self.usage.frames_out + 1
        self.usage.speaking_frames += 0 if r.silent else 1
        barged = self.barge_in.update(out.caller_pcm, bool(r.silent))
        if barged is not None:
            frames += self._barge_in(out, barged)
        text = r.text
        frames += self.agent.step(silent=bool(r.silent), text=text)
        for span in r.spans:
            frames.append(self._events.span_frame(span, out))
        if text:
            self.stats["text_frames"] += 1
            self.usage.text_pieces += 1
            agent_text = getattr(self.retrieval, "on_agent_text", None)
            if agent_text is not None:
                agent_text(text, out.t)  # the router knows what the agent already said
        if r.is_ret:
            frames.append(self._events.ret_frame(out))
        if self.recorder is not None:
            self.recorder.tick(out)
        frames += self._tick_metrics(out)
        if self._started and self._out is not None:
            for f in frames:
                self._out.put_nowait(f)

    def _barge_in(self, out: TickOutput, spoke_frames: int) -> list[Frame | InterruptMark]:
        """The model stopped for the caller: output transports drop what they hold, the agent turn ends."""
        self.stats["barge_ins"] += 1
        barge = AgentBargedInFrame(frame_index=out.call_frame, t=out.t, spoke_frames=spoke_frames)
        if self.recorder is not None:
            self.recorder.event("barge_in", frame_index=out.call_frame, t=round(out.t, 3), spoke_frames=spoke_frames)
        self.spawn(self._call_event_handler("on_barge_in", barge))
        return [InterruptMark(), barge, *self.agent.close()]

    def _tick_metrics(self, out: TickOutput) -> list[Frame]:
        frames: list[Frame] = []
        ttfb = self.ttfb.agent_frame(time.monotonic(), silent=bool(out.result.silent))
        if ttfb is not None:
            frames += self._ttfb_frame(ttfb)
        if self.metrics_enabled:
            frames.append(processing_frame(self.name, self.model_name, float(out.result.step_ms), out.lateness_ms))
        if self.usage_metrics_enabled and out.call_frame % USAGE_EVERY_FRAMES == 0:
            frames.append(usage_frame(self.name, self.model_name, self.usage))
        return frames

    def _ttfb_frame(self, seconds: float) -> list[Frame]:
        if self.recorder is not None:
            self.recorder.event("ttfb", seconds=seconds)
        return [ttfb_frame(self.name, self.model_name, seconds)] if self.metrics_enabled else []

    def _on_engine_error(self, exc: BaseException) -> None:
        engine_failed(self, exc)

    async def _push_outputs(self) -> None:
        assert self._out is not None
        while True:
            frame = await self._out.get()
            if frame is None:
                return
            if isinstance(frame, InterruptMark):
                # Downstream only: the output transport drops the agent audio it holds (Twilio: `clear`) and the
                # assistant aggregator closes the turn. Upstream processors keep their queues (a caller transcript
                # on its way to the user aggregator), and this service's work (the retrieval, its tools) goes on.
                await self.push_frame(InterruptionFrame())
            else:
                await self.push_frame(frame)

    # caller side (from the question capture, through the retrieval's events) --------------------
    def caller_started(self) -> None:
        """The caller started speaking (voice detection)."""
        if self.caller.started() and self._live:
            self.spawn(self.broadcast_frame(UserStartedSpeakingFrame))

    def caller_stopped(self, t: float) -> None:
        """The caller's utterance ended at stream time `t` (voice detection)."""
        # on the event loop's clock: the stop was `heard - t` seconds of fed audio ago (voice detection
        # reports it late), whatever offset the call's stream time has against the engine's ticks
        heard = self._frames_in * FRAME_MS / 1000.0
        ttfb = self.ttfb.caller_stopped(time.monotonic() - max(0.0, heard - t))
        if self.caller.stopped(t) and self._live:
            self.spawn(self.broadcast_frame(UserStoppedSpeakingFrame))
        if ttfb is not None and self._live and self._out is not None:
            for f in self._ttfb_frame(ttfb):
                self._out.put_nowait(f)

    def caller_said(self, text: str, t: float) -> None:
        """A transcript of the caller's utterance that started at stream time `t`."""
        if self._live:
            frame: TranscriptionFrame = self.caller.transcription(text, t)
            self.spawn(self.push_frame(frame, FrameDirection.UPSTREAM))

    @property
    def _live(self) -> bool:
        return self._started and not self._closed

    # retrieval callbacks ------------------------------------------------------------------------
    def deliver(self, reference: str, meta: dict[str, Any] | None = None) -> bool:
        """Queue a reference as a Context Span for this call (the retrieval's delivery callback)."""
        return self._events.deliver(reference, meta)

    def on_retrieval_event(self, event: Any) -> None:
        """Record a retrieval event and turn the ones a pipeline cares about into frames."""
        self._events.handle(event)

    def emit(self, frame: Frame, handler: str | None = None) -> None:
        """Send a retrieval frame downstream in output order (and to its event handler)."""
        if self._live and self._out is not None:
            self._out.put_nowait(frame)
        if handler is not None and not self._closed:
            self.spawn(self._call_event_handler(handler, frame))

    # helpers ------------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """True once the call has ended (slot freed, artifacts written)."""
        return self._closed

    def call_handler(self, name: str, *args: Any) -> Any:
        """Run one of this service's event handlers (a coroutine for `spawn`)."""
        return self._call_event_handler(name, *args)

    def spawn(self, maybe: Any) -> None:
        """Run an awaitable in the background (errors are logged); anything else is ignored."""
        if inspect.isawaitable(maybe):
            task = asyncio.ensure_future(maybe)
            self._tasks.add(task)  # keep a reference until done
            task.add_done_callback(self._tasks.discard)
            task.add_done_callback(_log_task_error)


def _log_task_error(task: asyncio.Future) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("duetaspan pipeline task failed: %r", task.exception())


__all__ = ["BargeInConfig", "Deliver", "DuetaSpanService", "OnEvent", "Retrieval", "RetrievalFactory"]
