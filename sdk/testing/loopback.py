"""A minimal in-process Pipecat transport for scripted calls: the test queues caller frames into `input()`,
what reaches `output()` is kept in `received`.

Example:
    >>> # session = agent.create_session(CallInfo("CA1"), LoopbackTransport())   (see `scripted_call`)
"""

from __future__ import annotations

from pipecat.frames.frames import Frame, StartFrame
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.transports.base_transport import BaseTransport


class _Input(FrameProcessor):
    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)


class _Output(FrameProcessor):
    def __init__(self) -> None:
        super().__init__()
        self.frames: list[Frame] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == FrameDirection.DOWNSTREAM and not isinstance(frame, StartFrame):
            self.frames.append(frame)
        await self.push_frame(frame, direction)


class LoopbackTransport(BaseTransport):
    def __init__(self) -> None:
        super().__init__()
        self._input = _Input()
        self._output = _Output()

    def input(self) -> FrameProcessor:
        return self._input

    def output(self) -> FrameProcessor:
        return self._output

    @property
    def received(self) -> list[Frame]:
        return self._output.frames
