"""What both ends of an engine process share: the spec the child loads (`EngineProcessSpec`), the error that
ends calls when the child dies (`EngineCrashed`), and the socket framing.

Frames are length-prefixed pickles: both ends are this package on one machine, and 80 ms of audio is 7.5 KB.
Messages are tuples whose first item names them:

- parent -> child: `("spec", dict)` first, then `("push", key, bytes)`, `("inject", key, reference)`,
  `("force_ret", key)`, `("hold", key, on)`, `("req", rid, ("attach", key, call_id, persona, sampling, seed,
  hold_agent) | ("detach", key))`, `("stop",)`;
- child -> parent: `("ready", info)` or `("fatal", text)`, then `("tick", key, TickOutput, SlotStats)`,
  `("call_error", key, exc)`, `("reply", rid, ok, value_or_exc)`, `("clock", figures, timing)` every 0.5 s.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from duetaspan.errors import DuetaspanError
from duetaspan.model.convention import FRAME_MS
from duetaspan.pipeline.ticks import EngineFailed

HEADER = struct.Struct("!I")
CLOCK_EVERY_S = 0.5


class EngineCrashed(EngineFailed):
    """The engine process died (or never came up, or was stopped: `crashed=False`); its calls are over.
    `ends_call` tells services to hang up."""


class EngineProcessSpec(BaseModel):
    """What the engine process loads and how its clock runs (sent to the child as its first message).

    `checkpoint` (+ `mimi`, `tokenizer`, optional `lm_config`) loads explicit files; otherwise `model` is a
    preset. `capture_graphs` captures every batch bucket's CUDA graph before the first call arrives.
    """

    model_config = ConfigDict(extra="forbid")

    model: str = "tiny-random"
    device: str = "cpu"
    dtype: str | None = None
    max_slots: int = Field(4, ge=1)
    seed: int = 0
    random_weights: bool = False
    model_dir: str | None = None
    checkpoint: str | None = None
    lm_config: str | None = None
    mimi: str | None = None
    tokenizer: str | None = None
    threads: int | None = Field(None, ge=1, description="torch CPU threads in the engine process")
    capture_graphs: bool = True
    frame_ms: float = Field(FRAME_MS, gt=0)
    max_backlog_frames: int = Field(4, ge=1)
    max_catchup_ticks: int = Field(3, ge=0)
    max_failed_steps: int = Field(
        3, ge=1, description="failed engine steps in a row before the engine is down"
    )
    engine_options: dict[str, Any] = Field(default_factory=dict)

    def build(self) -> Any:
        """Load the engine (in the engine process)."""
        import torch

        from duetaspan.model.engine import DuplexEngine

        if self.threads:
            torch.set_num_threads(self.threads)
        kw: dict[str, Any] = {"device": self.device, "max_slots": self.max_slots, "seed": self.seed}
        if self.dtype:
            kw["dtype"] = getattr(torch, self.dtype)
        kw.update(self.engine_options)
        if self.checkpoint:
            return DuplexEngine.from_files(self.checkpoint, self.lm_config, self.mimi, self.tokenizer, **kw)
        return DuplexEngine.load(
            self.model, model_dir=self.model_dir, random_weights=self.random_weights, **kw
        )


def frame(message: tuple) -> bytes:
    """One message as it goes on the socket."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(body)) + body


async def recv(reader: asyncio.StreamReader) -> tuple:
    """The next message from the socket."""
    (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    return pickle.loads(await reader.readexactly(size))


def portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling, else a `DuetaspanError` that says what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return DuetaspanError(f"{type(exc).__name__}: {exc}")
