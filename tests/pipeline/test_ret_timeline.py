"""A `<ret>`'s question is taken on the caller's stream, where the capture keeps its utterances: the engine's
tick knows the caller frame the model heard with it, and under load (caller frames dropped past the backlog
bound, ticks concealed) that frame's time moves a second and more away from the call's time. Judged at the
call's time, a `<ret>` right after the caller's latest words skipped them as "after the `<ret>`" and took the
utterance before for the question (the reminder and bank examples' flakes on a loaded machine)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np

from duetaspan.pipeline.retrieval_events import RetrievalEvents
from duetaspan.pipeline.ticks import TickOutput
from duetaspan.router.capture import Question
from duetaspan.router.retrieval import RetrievalManager


class Heard:
    """The retrieval's side of the service: what each `<ret>` was given."""

    def __init__(self) -> None:
        self.rets: list[tuple[Any, ...]] = []

    def on_ret(self, frame_index: int, t: float, caller_t: float | None = None) -> None:
        self.rets.append((frame_index, t, caller_t))


def test_a_ret_carries_the_caller_stream_time_of_the_frame_the_model_heard():
    retrieval = Heard()
    service = SimpleNamespace(stats={"rets": 0}, usage=SimpleNamespace(rets=0), recorder=None, retrieval=retrieval,
                              spawn=lambda x: x, call_handler=lambda *a: None)  # fmt: skip
    events = RetrievalEvents(service)
    result = SimpleNamespace(is_ret=True)
    pcm = np.zeros(1920, np.float32)
    # 12 caller frames were dropped under load: the model hears caller frame 62 at call frame 50
    events.ret_frame(TickOutput(result, pcm, call_frame=50, concealed=False, lateness_ms=0.0, caller_frame=62))
    events.ret_frame(TickOutput(result, pcm, call_frame=51, concealed=True, lateness_ms=0.0, caller_frame=None))
    assert retrieval.rets == [(50, 4.0, 4.96), (51, 4.08, None)]


class Capture:
    def __init__(self) -> None:
        self.asked: list[float | None] = []

    async def question(self, t: float | None = None) -> Question:
        self.asked.append(t)
        return Question("", "window", 0.0, 0.0, 0.0)  # no words: no span, the router is not asked


async def test_the_capture_is_asked_at_the_time_the_model_heard():
    capture = Capture()
    manager = RetrievalManager(router=None, deliver=lambda *a: None, capture=capture)  # type: ignore[arg-type]
    assert manager.on_ret(50, 4.0, heard_t=4.96)
    await manager.wait()
    assert manager.on_ret(60, 4.8)  # no caller time given: the call's
    await manager.wait()
    await manager.close()
    await asyncio.sleep(0)
    assert capture.asked == [4.96, 4.8]
