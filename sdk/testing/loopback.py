"""A minimal in-process Pipecat transport for scripted calls: the test queues caller frames into `input()`,
what reaches `output()` is kept in `received`.

Example:
    >>> # session = agent.create_session(CallInfo("CA1"), LoopbackTransport())   (see `scripted_call`)
"""

from __future__ import annotations

from pipecat.frames.frames import Frame, StartFrame
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.transports.base_transport import BaseTransport


class LoopbackInput(FrameProcessor):
    """The caller's side: what is queued into it goes down the pipeline."""

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)


class LoopbackOutput(FrameProcessor):
    """The far end: every downstream frame but the start is handed to `keep` (a list by default)."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[Frame] = []

    def keep(self, frame: Frame) -> None:
        self.frames.append(frame)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == FrameDirection.DOWNSTREAM and not isinstance(frame, StartFrame):
            self.keep(frame)
        await self.push_frame(frame, direction)


class LoopbackTransport(BaseTransport):
    """`input()` takes the caller's frames, `output()` (a `LoopbackOutput`, or `far_end`) the agent's."""

    def __init__(self, far_end: LoopbackOutput | None = None) -> None:
        super().__init__()
        self._input = LoopbackInput()
        self.far_end = far_end if far_end is not None else LoopbackOutput()

    def input(self) -> FrameProcessor:
        return self._input

    def output(self) -> FrameProcessor:
        return self.far_end

    @property
    def received(self) -> list[Frame]:
        return self.far_end.frames
