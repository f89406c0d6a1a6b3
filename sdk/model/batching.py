"""One batched 80 ms tick over the engine's call slots: Mimi encode -> LM step -> Mimi decode, bucketed.

The engine keeps B slots; open calls take the lowest free slot, so the active ones sit at the front. A tick
runs only rows [0, b) where b is the smallest *bucket* (1, 2, 4, 8, ... up to B) covering the highest active
slot; rows inside the bucket that are not active are masked (their state stays bit-identical), rows past it
are not touched at all. Each bucket owns static device buffers (caller audio, active mask, sampling noise,
packed outputs), so on a GPU the whole tick is captured once per (bucket, sampling shape) as a CUDA graph and
replayed: one host->device copy in, one device->host copy out, one sync per tick. On a CPU (or with
`NO_CUDA_GRAPH=1`, or when capture fails) the very same function runs eagerly, which is what the CPU tests
exercise; a CPU tick reads the caller audio in place and, when every row of the bucket runs, skips the
masking (identical results). The LM side goes through `LMGenerator`'s device-step API (`draw_noise`,
`sampling_shape`, `device_step`, `commit_steps`).

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
from duetaspan.model.lm import LMGenerator, SamplingShape
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
    graphs: dict[tuple[SamplingShape, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = field(
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
        width = lm.noise_width
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
        live = rows[:b]
        noisy = self.lm.draw_noise(live, bk.noise)
        graph = self._graph(bk, self._key(b, noisy)) if self.graphs_enabled else None
        if graph is not None:
            self._host_pcm[:b, 0].copy_(torch.from_numpy(np.ascontiguousarray(pcm[:b], dtype=np.float32)))
            self._host_active[:b].copy_(torch.tensor(live, dtype=torch.bool))
            bk.pcm.copy_(self._host_pcm[:b], non_blocking=True)
            bk.active.copy_(self._host_active[:b], non_blocking=True)
            graph[0].replay()
            packed = graph[1]
            host = self._host_out[:b]
            host.copy_(packed, non_blocking=True)
            torch.cuda.current_stream(self.device).synchronize()  # the tick's one host sync
        else:
            host = self._eager(bk, pcm, live, noisy)
        self.lm.commit_steps(live)
        out = host.numpy()
        text = [UNGENERATED_TOKEN_ID] * B
        text[:b] = out[:, _TEXT].astype(np.int64).tolist()
        codes = np.full((B, N_AUDIO_CODEBOOKS), UNGENERATED_TOKEN_ID, dtype=np.int64)
        codes[:b] = out[:, _CODES]
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
    def _key(self, b: int, noisy: bool) -> tuple[SamplingShape, bool]:
        # The sampling shape fixes tensor shapes and branches inside the graph; it changes only with the
        # slots' sampling settings.
        return (self.lm.sampling_shape(0, b), noisy)

    def _eager(self, bk: _Bucket, pcm: np.ndarray, live: list[bool], noisy: bool) -> torch.Tensor:
        """The tick without a graph; returns the packed rows [b, width] on the host."""
        b = bk.size
        host_pcm = torch.from_numpy(np.ascontiguousarray(pcm[:b], dtype=np.float32)).view(b, 1, FRAME_SIZE)
        if self.device.type == "cpu":
            # No staging copies; and when every row of the bucket runs, the unmasked path (the same results
            # as an all-True mask, without the masking work).
            return self._compute(bk, noisy, host_pcm, None if all(live) else torch.tensor(live))
        self._host_pcm[:b].copy_(host_pcm)
        self._host_active[:b].copy_(torch.tensor(live, dtype=torch.bool))
        bk.pcm.copy_(self._host_pcm[:b], non_blocking=True)
        bk.active.copy_(self._host_active[:b], non_blocking=True)
        host = self._host_out[:b]
        host.copy_(self._compute(bk, noisy, bk.pcm, bk.active), non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        return host

    def _compute(
        self, bk: _Bucket, noisy: bool, pcm: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """The tick over the bucket's state: device work only (no host sync), state updated in place.

        `pcm` [b, 1, 1920] and `mask` [b] are the bucket's buffers, or host tensors in eager CPU ticks
        (`mask=None`: every row runs).
        """
        model = self.mimi.model
        codes = model.encode(pcm, bk.enc, mask)[:, :N_AUDIO_CODEBOOKS, 0]
        step = self.lm.device_step(bk.size, codes, mask, bk.noise if noisy else None)
        ready = step.text != UNGENERATED_TOKEN_ID
        if mask is not None:
            ready = mask & ready
        elif self.device.type == "cpu" and bool(ready.all()):
            ready = None  # a free check on a CPU: every row decodes, so skip the masking
        pcm_out = model.decode(step.agent_codes.clamp(min=0)[:, :, None], bk.dec, ready).float()
        parts = [step.text[:, None].float(), step.agent_codes.float(), step.ret_prob[:, None].float()]
        return torch.cat([*parts, pcm_out[:, 0]], dim=1)

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
                    self._compute(bk, noisy, bk.pcm, bk.active)
            torch.cuda.current_stream(self.device).wait_stream(side)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                packed = self._compute(bk, noisy, bk.pcm, bk.active)
        except Exception as exc:  # an optimisation only: fall back to eager ticks, never fail the calls
            log.warning("CUDA graph capture for bucket %d failed (%s); ticks run eagerly", bk.size, exc)
            self.graphs_enabled = False
            return None
        finally:
            bk.active.copy_(saved)
        bk.graphs[key] = (graph, packed)
        log.info("captured the tick graph for bucket %d (top-k %d/%d, sampling %s)", bk.size, *key)
        return bk.graphs[key]
