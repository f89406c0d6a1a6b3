"""What the engine takes, hands out and keeps per call slot: `SamplingParams`, `SlotId` handles, `FrameResult`s,
slot records, errors.

A slot is reused call after call; its generation number tells a live call's handle from an ended one's, so a
late `inject` or `force_ret` never reaches the next call on the same slot.

Example:
    >>> from duetaspan.model.slots import SlotId
    >>> handle = SlotId(2, generation=5)
    >>> handle == 2, {handle: "call"}[2], handle.generation
    (True, 'call', 5)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from pydantic import AliasChoices, ConfigDict, Field

from duetaspan.errors import DuetaspanError
from duetaspan.model import sampling as _sampling
from duetaspan.model.convention import FRAME_SIZE, RET_ID, SILENCE_CODES
from duetaspan.spans.events import RetGate, SpanLanded
from duetaspan.spans.pinning import PersonaPin


class EngineError(DuetaspanError, ValueError):
    """A call that does not fit the engine's state: unknown or closed slot, wrong frame shape."""


class EngineFullError(EngineError):
    """Every slot is taken; close a slot or load the engine with more `max_slots`."""


class SamplingParams(_sampling.SamplingParams):
    """Per-slot sampling. `temperature`/`top_k` are the audio ones; 0 temperature = greedy.

    >>> SamplingParams(temperature=0.0, text_temperature=0.0).is_greedy
    True
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    audio_temperature: float = Field(
        0.8, ge=0.0, validation_alias=AliasChoices("temperature", "audio_temperature")
    )
    audio_top_k: int = Field(250, ge=0, validation_alias=AliasChoices("top_k", "audio_top_k"))

    @property
    def temperature(self) -> float:
        return self.audio_temperature

    @property
    def top_k(self) -> int:
        return self.audio_top_k


class SlotId(int):
    """A slot index that remembers which call (generation) it was opened for.

    It is a plain `int` everywhere (dict keys, comparisons); `inject`/`force_ret` with a stale `SlotId` from an
    ended call are dropped instead of reaching the next call on the same slot.
    """

    generation: int

    def __new__(cls, slot: int, generation: int) -> SlotId:
        obj = super().__new__(cls, slot)
        obj.generation = generation
        return obj

    def __repr__(self) -> str:
        return f"SlotId({int(self)}, generation={self.generation})"


@dataclass
class FrameResult:
    """One 80 ms agent frame of one slot.

    `text_token` is -2 while the slot warms up (no prompt, first frame) and while it is `waiting` for its
    persona prompt to be written (the model did not hear that caller frame); `spans` lists what landed before this
    step; `step_ms` is the wall time of the whole batched step (landing spans included). `held`: the agent was
    held at silence for this step (`DuplexEngine.hold_agent`): pad text, `SILENCE_CODES`, no `<ret>`.
    """

    slot: int
    frame_index: int
    pcm: np.ndarray
    text_token: int
    text: str
    is_ret: bool
    silent: bool
    spans: list[SpanLanded]
    step_ms: float
    ret_prob: float = 0.0
    agent_codes: tuple[int, ...] = ()
    waiting: bool = False  # the call's persona prompt is still being written: the model did not run for it
    held: bool = False  # the agent was held at silence: what the model sampled was not written nor reported


SILENT_RMS = 10 ** (-50 / 20)  # −50 dBFS


def agent_frame(
    slot: int,
    frame_index: int,
    token: int,
    piece: str,
    codes: tuple[int, ...],
    pcm: np.ndarray,
    ready: bool,
    spans: list[SpanLanded],
    step_ms: float,
    ret_prob: float,
    held: bool = False,
) -> FrameResult:
    """The `FrameResult` of one slot's tick; silent while warming up (`ready` False: no agent codes yet), on
    exactly `SILENCE_CODES`, or below −50 dBFS."""
    frame_pcm = pcm if ready else np.zeros(FRAME_SIZE, np.float32)
    silent = not ready or codes == SILENCE_CODES or float(np.sqrt(np.mean(np.square(frame_pcm)))) < SILENT_RMS
    return FrameResult(
        slot=slot, frame_index=frame_index, pcm=frame_pcm, text_token=token, text=piece,
        is_ret=token == RET_ID, silent=silent, spans=spans, step_ms=step_ms, ret_prob=ret_prob,
        agent_codes=codes, held=held,
    )  # fmt: skip


@dataclass
class SlotRecord:
    """The engine's bookkeeping of one slot: which call holds it, its frame count, persona pin, `<ret>` gate, and
    whether its agent is held at silence (`DuplexEngine.hold_agent`)."""

    generation: int = 0
    open: bool = False
    frame_index: int = 0
    pin: PersonaPin | None = None
    pin_frames: torch.Tensor | None = None
    gate: RetGate | None = None
    prompt_ms: float = 0.0
    prompt_frames: int = 0
    landed: list[SpanLanded] = field(default_factory=list)
    hold: bool = False
