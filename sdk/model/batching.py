"""One batched 80 ms tick over the engine's call slots: Mimi encode -> LM step -> Mimi decode, bucketed.

The engine keeps B slots; open calls take the lowest free slot, so the active ones sit at the front. A tick
runs only rows [0, b) where b is the smallest *bucket* (1, 2, 4, 8, ... up to B) covering the highest active
slot; rows inside the bucket that are not active are masked (their state stays bit-identical), rows past it
are not touched at all. Each bucket owns static device buffers (caller audio, active mask, sampling noise,
packed outputs), so on a GPU the whole tick is captured once per (bucket, sampling shape) as a CUDA graph and
replayed: one host->device copy in, one device->host copy out, one sync per tick. On a CPU (or with
`NO_CUDA_GRAPH=1`, or when capture fails) the very same function runs eagerly on the same buffers, which is
what the CPU tests exercise.

Example:
    >>> import numpy as np
    >>> from duetaspan.model.engine import DuplexEngine
    >>> engine = DuplexEngine.load("tiny-random", max_slots=4)
    >>> out = engine.batch.run(np.zeros((4, 1920), np.float32), [True, False, False, False])
    >>> out.bucket, out.pcm.shape, out.graphed
    (1, (4, 1920), False)
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any

import numpy as np
import torch

from duetaspan.model.convention import FRAME_SIZE, N_AUDIO_CODEBOOKS, UNGENERATED_TOKEN_ID
from duetaspan.model.lm import LMGenerator
from duetaspan.model.mimi import MimiStream
from duetaspan.model.mimi.transformer import TransformerState

log = logging.getLogger(__name__)

# Packed output row: text, 8 agent codes, P(<ret>), 1920 audio samples (ids < 2**24 are exact in float32).
_TEXT, _CODES, _RET, _PCM = 0, slice(1, 1 + N_AUDIO_CODEBOOKS), 1 + N_AUDIO_CODEBOOKS, 2 + N_AUDIO_CODEBOOKS
_WIDTH = _PCM + FRAME_SIZE

__all__ = ["BatchedTick", "TickArrays", "cuda_graphs_wanted", "default_buckets"]


def default_buckets(max_slots: int) -> tuple[int, ...]:
    """Powers of two below `max_slots`, then `max_slots` itself: `default_buckets(12) == (1, 2, 4, 8, 12)`."""
    sizes, b = [], 1
    while b < max_slots:
        sizes.append(b)
        b *= 2
    return (*sizes, max_slots)


def cuda_graphs_wanted(device: torch.device, requested: bool | None = None) -> bool:
    """Graphs run on CUDA devices only, unless `NO_CUDA_GRAPH` is set (to 1/true/yes) or `requested` is False."""
    if requested is False or device.type != "cuda":
        return False
    return os.environ.get("NO_CUDA_GRAPH", "").strip().lower() in ("", "0", "false", "no")


@dataclass
class TickArrays:
    """Host results of one tick, indexed by slot (length B; rows outside the bucket are -2 / zeros)."""

    text: list[int]
    agent_codes: np.ndarray  # int64 [B, 8]
    ret_prob: list[float]
    pcm: np.ndarray  # float32 [B, 1920]
    bucket: int
    graphed: bool


@dataclass
class _Bucket:
    size: int
    pcm: torch.Tensor  # [b, 1, 1920] model-device caller audio
    active: torch.Tensor  # [b] bool
    noise: torch.Tensor  # [b, noise width] float32 Exp(1) draws
    enc: Any  # row views of the Mimi streaming states
    dec: Any
    graphs: dict[tuple[int, int, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = field(
        default_factory=dict
    )


def _rows(state: Any, b: int) -> Any:
    """A view of slots [0, b) of a (nested) Mimi streaming state: in-place writes land in the full state."""
    if state is None:
        return None
    if isinstance(state, list | tuple):
        return type(state)(_rows(s, b) for s in state)
    if isinstance(state, TransformerState):
        return TransformerState(state.offset[:b], state.cache[:, :, :b])
    if is_dataclass(state):
        return replace(state, **{f.name: _rows(getattr(state, f.name), b) for f in fields(state)})
    if isinstance(state, torch.Tensor):
        return state[:b]
    raise TypeError(f"unknown Mimi state part {type(state).__name__}")


class BatchedTick:
    """Runs the engine's tick over a bucket of slots, eagerly or through one CUDA graph per bucket.

    Args:
        lm, mimi: the engine's generator and streaming codec (B slots each).
        buckets: batch sizes to round the active prefix up to (default: powers of two, then B).
        cuda_graphs: None = on for CUDA unless `NO_CUDA_GRAPH`; False = always eager.
    """

    def __init__(
        self,
        lm: LMGenerator,
        mimi: MimiStream,
        *,
        buckets: tuple[int, ...] | None = None,
        cuda_graphs: bool | None = None,
    ) -> None:
        B = lm.batch_size
        if mimi.batch_size != B:
            raise ValueError(f"LM has {B} slots but Mimi {mimi.batch_size}")
        sizes = tuple(sorted(set(buckets or default_buckets(B))))
        if not sizes or sizes[0] < 1 or sizes[-1] != B:
            raise ValueError(f"buckets must be positive and end at max_slots={B}, got {sizes}")
        self.lm, self.mimi, self.max_slots = lm, mimi, B
        self.device = lm.device
        self.graphs_enabled = cuda_graphs_wanted(self.device, cuda_graphs)
        self._pool: Any = None
        config = lm.config
        width = config.text_vocab_out + config.gen_q * config.card
        pin = self.device.type == "cuda"
        self._host_pcm = torch.zeros(B, 1, FRAME_SIZE, dtype=torch.float32, pin_memory=pin)
        self._host_active = torch.zeros(B, dtype=torch.bool, pin_memory=pin)
        self._host_out = torch.zeros(B, _WIDTH, dtype=torch.float32, pin_memory=pin)
        self._buckets: dict[int, _Bucket] = {}
        with torch.inference_mode():
            pcm = torch.zeros(B, 1, FRAME_SIZE, dtype=torch.float32, device=self.device)
            active = torch.zeros(B, dtype=torch.bool, device=self.device)
            noise = torch.ones(B, width, dtype=torch.float32, device=self.device)
        for b in sizes:
            # Buckets share the buffers' memory: only one tick runs at a time.
            self._buckets[b] = _Bucket(
                b, pcm[:b], active[:b], noise[:b], _rows(mimi._enc, b), _rows(mimi._dec, b)
            )
        self.buckets = sizes

    # -- public ---------------------------------------------------------------------------------------------
    def bucket_for(self, rows: list[bool]) -> int:
        """The smallest bucket holding every active row."""
        top = max((i for i, r in enumerate(rows) if r), default=0) + 1
        return next(b for b in self.buckets if b >= top)

    @torch.inference_mode()
    def run(self, pcm: np.ndarray, rows: list[bool]) -> TickArrays:
        """One tick: caller audio `pcm` float32 [B, 1920] for the slots where `rows` is True."""
        B = self.max_slots
        bk = self._buckets[self.bucket_for(rows)]
        b = bk.size
        self._host_pcm[:b, 0].copy_(torch.from_numpy(np.ascontiguousarray(pcm[:b], dtype=np.float32)))
        self._host_active[:b].copy_(torch.tensor(rows[:b], dtype=torch.bool))
        bk.pcm.copy_(self._host_pcm[:b], non_blocking=True)
        bk.active.copy_(self._host_active[:b], non_blocking=True)
        noisy = self._draw_noise(bk, rows)
        key = self._key(b, noisy)
        graph = self._graph(bk, key) if self.graphs_enabled else None
        if graph is not None:
            graph[0].replay()
            packed = graph[1]
        else:
            packed = self._compute(bk, noisy)
        host = self._host_out[:b]
        host.copy_(packed, non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # the tick's one host sync
        _count(self.lm, rows[:b])
        out = host.numpy()
        text = [UNGENERATED_TOKEN_ID] * B
        text[:b] = out[:, _TEXT].astype(np.int64).tolist()
        codes = np.full((B, N_AUDIO_CODEBOOKS), UNGENERATED_TOKEN_ID, dtype=np.int64)
        codes[:b] = out[:, _CODES].astype(np.int64)
        ret = [0.0] * B
        ret[:b] = out[:, _RET].tolist()
        audio = np.zeros((B, FRAME_SIZE), dtype=np.float32)
        audio[:b] = out[:, _PCM:]
        return TickArrays(text, codes, ret, audio, b, graph is not None)

    def capture(self, buckets: tuple[int, ...] | None = None) -> int:
        """Capture the graphs of `buckets` (default: all) for the slots' current sampling settings, for
        greedy and sampling ticks, so no call pays a capture on the clock. Returns the graphs held."""
        if not self.graphs_enabled:
            return 0
        with torch.inference_mode():
            for b in buckets or self.buckets:
                for noisy in (False, True):
                    self._graph(self._buckets[b], self._key(b, noisy))
        return self.graph_count

    @property
    def graph_count(self) -> int:
        return sum(len(bk.graphs) for bk in self._buckets.values())

    # -- internals ------------------------------------------------------------------------------------------
    def _key(self, b: int, noisy: bool) -> tuple[int, int, bool]:
        # Top-k widths fix tensor shapes inside the graph; they change only with the slots' sampling settings.
        return (self.lm._k_max(0, b, True), self.lm._k_max(0, b, False), noisy)

    def _draw_noise(self, bk: _Bucket, rows: list[bool]) -> bool:
        """Fill the bucket's noise from each executing, sampling slot's own generator (as the LM does)."""
        draw = [rows[i] and not self.lm.sampling(i).is_greedy for i in range(bk.size)]
        if not any(draw):
            return False
        bk.noise.fill_(1.0)
        for i, d in enumerate(draw):
            if d:
                bk.noise[i].exponential_(generator=self.lm._rngs[i])
        return True

    def _compute(self, bk: _Bucket, noisy: bool) -> torch.Tensor:
        """The tick on the bucket's buffers: device work only (no host sync), state updated in place."""
        model = self.mimi.model
        codes = model.encode(bk.pcm, bk.enc, bk.active)[:, :N_AUDIO_CODEBOOKS, 0]
        text, agent, ret_prob = _advance(self.lm, bk.size, codes, bk.active, bk.noise if noisy else None)
        ready = bk.active & (text != UNGENERATED_TOKEN_ID)
        pcm = model.decode(agent.clamp(min=0)[:, :, None], bk.dec, ready).float()
        return torch.cat([text[:, None].float(), agent.float(), ret_prob[:, None].float(), pcm[:, 0]], dim=1)

    def _graph(
        self, bk: _Bucket, key: tuple[int, int, bool]
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor] | None:
        found = bk.graphs.get(key)
        if found is not None or not self.graphs_enabled:
            return found
        noisy = key[2]
        saved = bk.active.clone()
        try:
            # Warm-up and capture with every row inactive: kernels, cuBLAS handles and Mimi's centroid cache
            # get initialised while every slot's state stays bit-identical.
            bk.active.zero_()
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._compute(bk, noisy)
            torch.cuda.current_stream(self.device).wait_stream(side)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                packed = self._compute(bk, noisy)
        except Exception as exc:  # an optimisation only: fall back to eager ticks, never fail the calls
            log.warning("CUDA graph capture for bucket %d failed (%s); ticks run eagerly", bk.size, exc)
            self.graphs_enabled = False
            return None
        finally:
            bk.active.copy_(saved)
        bk.graphs[key] = (graph, packed)
        log.info("captured the tick graph for bucket %d (top-k %d/%d, sampling %s)", bk.size, *key)
        return bk.graphs[key]


def _advance(
    lm: LMGenerator, b: int, codes: torch.Tensor, active: torch.Tensor, noise: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The LM's device-only step over slots [0, b) (text [b], agent codes [b, 8], shown P(<ret>) [b])."""
    return lm._advance_tensors(0, b, codes, False, active, noise)


def _count(lm: LMGenerator, rows: list[bool]) -> None:
    # Host mirror of the offsets the device step advanced (kept on the host so nothing syncs to read them).
    for i, run in enumerate(rows):
        lm._offsets_host[i] += int(run)
