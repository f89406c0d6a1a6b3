"""The service with the REAL tiny-random engine: fixture audio in, agent audio and text out, a forced `<ret>`
answered through the retrieval callback lands as a span in the frames and in the call's artifacts."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from pipecat.frames.frames import SpeechOutputAudioRawFrame

from duetaspan.pipeline.artifacts import CallRecorder, load_call_record
from duetaspan.pipeline.frames import RetFrame, SpanFrame
from duetaspan.pipeline.runner import EngineRunner
from duetaspan.pipeline.service import DuetaSpanService
from tests.pipeline.harness import chunks_at, run_call
from tests.support import load_wav

REFERENCE = "(tool result) It is 3:04 PM in Tokyo."


@pytest.fixture(scope="module")
def engine():
    from duetaspan.model.engine import DuplexEngine

    return DuplexEngine.load("tiny-random", device="cpu", max_slots=2, seed=0)


class AnswerEveryRet:
    def __init__(self, deliver, on_event) -> None:
        self.deliver, self.on_event = deliver, on_event

    def feed(self, pcm, t) -> None:
        pass

    async def on_ret(self, frame_index: int, t: float, caller_t: float | None = None) -> None:
        await asyncio.sleep(0.01)
        self.deliver(REFERENCE, {"question": "what time is it in Tokyo", "tool": "get_time"})

    def close(self) -> None:
        pass


async def test_tiny_engine_span_through_the_pipeline(engine, tmp_path):
    from duetaspan.model.engine import Persona

    pcm, _ = load_wav("time_tokyo")
    pcm = pcm[: 24000 * 2]

    async def force(worker):
        await asyncio.wait_for(service.started.wait(), 30)
        await asyncio.sleep(0.5)
        service.slot.force_ret()

    async with EngineRunner(engine) as runner:
        rec = CallRecorder(tmp_path, "CA-tiny")
        service = DuetaSpanService(
            runner,
            call_id="CA-tiny",
            persona=Persona(text="You are Ada."),
            retrieval=AnswerEveryRet,
            recorder=rec,
        )
        result = await run_call(service, chunks_at(pcm, 8000), 8000, tail_s=1.5, during=force)
    audio = result.of(SpeechOutputAudioRawFrame)
    record = load_call_record(tmp_path, "CA-tiny")
    assert record["complete"] and len(audio) == record["summary"]["frames"] > 0
    assert all(len(f.audio) == 3840 for f in audio)
    rets, spans = result.of(RetFrame), result.of(SpanFrame)
    assert len(rets) >= 1 and spans, (rets, spans)
    span = spans[0]
    assert span.reference == REFERENCE and span.n_frames > 0 and span.tool == "get_time"
    assert span.frame_index > rets[0].frame_index
    assert record["spans"][0]["reference"] == REFERENCE
    assert record["spans"][0]["frame_index"] == span.frame_index
    assert any(r["frame_index"] == rets[0].frame_index for r in record["rets"])
    # the model heard the caller: non-silent frames reached the engine through the clock
    assert record["summary"]["input"]["frames_used"] > 0
    assert np.isfinite([f["step_ms"] for f in record["frames"]]).all()
