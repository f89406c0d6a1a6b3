"""One batched 80 ms tick over the engine's call slots: Mimi encode -> LM step -> Mimi decode, bucketed.

The engine keeps B slots; open calls take the lowest free slot, so the active ones sit at the front. A tick
runs only rows [0, b) where b is the smallest *bucket* (1, 2, 4, 8, ... up to B) covering the highest active
slot; rows inside the bucket that are not active are masked (their state stays bit-identical), rows past it
are not touched at all. Each bucket owns static device buffers (caller audio, active mask, sampling noise,
packed outputs), so on a GPU the whole tick is captured once per (bucket, sampling shape) as a CUDA graph and
replayed: one host->device copy in, one device->host copy out, one sync per tick. Capture goes through a
`duetaspan.model.graphs` backend: CUDA graphs on GPUs, or an emulation that runs the same graph path on the
CPU (tests). Graphs are captured at start only (`capture`: the default sampling and every mix with the
engine's allowed `samplings`), never inside a tick or a call's opening; a tick whose graph is missing runs
eagerly (logged once per key), and a capture that fails turns graphs off for that (bucket, sampling shape)
only. On a CPU (or with `NO_CUDA_GRAPH=1`) the very same function runs eagerly;
a CPU tick reads the caller audio in place and, when every row of the bucket runs, skips the masking
(identical results). On the `meta` device (shape checks at full size) the tick runs without host copies. The
LM side goes through `LMGenerator`'s device-step API (`draw_noise`, `sampling_shape`, `device_step`,
`commit_steps`).

Example:
    >>> import numpy as np
    >>> from duetaspan.model.engine import DuplexEngine
    >>> engine = DuplexEngine.load("tiny-random", max_slots=4)
    >>> out = engine.batch.run(np.zeros((4, 1920), np.float32), [True, False, False, False])
    >>> out.bucket, out.pcm.shape, out.graphed
    (1, (4, 1920), False)
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any

import numpy as np
import torch

from duetaspan.model.convention import FRAME_SIZE, N_AUDIO_CODEBOOKS, UNGENERATED_TOKEN_ID
from duetaspan.model.device_paths import cpu_fast_path
from duetaspan.model.generator import LMGenerator
from duetaspan.model.graphs import CapturedGraph, GraphBackend, graph_backend_for, graphs_disabled_by_env
from duetaspan.model.mimi import MimiStream
from duetaspan.model.mimi.transformer import TransformerState
from duetaspan.model.sampling import SamplingParams
from duetaspan.model.slot_sampling import SamplingShape

log = logging.getLogger(__name__)

# Packed output row: text, 8 agent codes, P(<ret>), 1920 audio samples (ids < 2**24 are exact in float32).
_TEXT, _CODES, _RET, _PCM = 0, slice(1, 1 + N_AUDIO_CODEBOOKS), 1 + N_AUDIO_CODEBOOKS, 2 + N_AUDIO_CODEBOOKS
_WIDTH = _PCM + FRAME_SIZE

__all__ = ["BatchedTick", "GraphKey", "TickArrays", "cuda_graphs_wanted", "default_buckets"]

# What a captured tick depends on besides its bucket: the slots' sampling shape, and whether any row samples.
GraphKey = tuple[SamplingShape, bool]


def default_buckets(max_slots: int) -> tuple[int, ...]:
    """Powers of two below `max_slots`, then `max_slots` itself: `default_buckets(12) == (1, 2, 4, 8, 12)`."""
    sizes, b = [], 1
    while b < max_slots:
        sizes.append(b)
        b *= 2
    return (*sizes, max_slots)


def cuda_graphs_wanted(device: torch.device, requested: bool | None = None) -> bool:
    """Graphs run on CUDA devices only, unless `NO_CUDA_GRAPH` is set (to 1/true/yes) or `requested` is False."""
    return requested is not False and device.type == "cuda" and not graphs_disabled_by_env()


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
    # A key maps to its graph, or to None when its capture failed (that key runs eagerly).
    graphs: dict[GraphKey, CapturedGraph | None] = field(default_factory=dict)


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
    """Runs the engine's tick over a bucket of slots, eagerly or through one recorded graph per bucket and key.

    Args:
        lm, mimi: the engine's generator and streaming codec (B slots each).
        buckets: batch sizes to round the active prefix up to (default: powers of two, then B).
        cuda_graphs: None = on for CUDA unless `NO_CUDA_GRAPH`; False = always eager.
        graph_backend: an explicit `duetaspan.model.graphs` backend (e.g. `EmulatedGraphBackend` to run the
            graph path on a CPU); it is used whatever `NO_CUDA_GRAPH` says, unless `cuda_graphs` is False.
    """

    def __init__(
        self,
        lm: LMGenerator,
        mimi: MimiStream,
        *,
        buckets: tuple[int, ...] | None = None,
        cuda_graphs: bool | None = None,
        graph_backend: GraphBackend | None = None,
    ) -> None:
        B = lm.batch_size
        if mimi.batch_size != B:
            raise ValueError(f"LM has {B} slots but Mimi {mimi.batch_size}")
        sizes = tuple(sorted(set(buckets or default_buckets(B))))
        if not sizes or sizes[0] < 1 or sizes[-1] != B:
            raise ValueError(f"buckets must be positive and end at max_slots={B}, got {sizes}")
        self.lm, self.mimi, self.max_slots = lm, mimi, B
        self.device = lm.device
        if cuda_graphs is False:
            graph_backend = None
        elif graph_backend is None:
            graph_backend = graph_backend_for(self.device, cuda_graphs)
        self.backend: GraphBackend | None = graph_backend
        self.eager_keys: set[tuple[int, GraphKey]] = set()  # ticks that found no graph (logged once each)
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
    @property
    def graphs_enabled(self) -> bool:
        return self.backend is not None

    def bucket_for(self, rows: list[bool]) -> int:
        """The smallest bucket holding every active row."""
        top = max((i for i, r in enumerate(rows) if r), default=0) + 1
        return next(b for b in self.buckets if b >= top)

    @torch.inference_mode()
    def run(self, pcm: np.ndarray, rows: list[bool]) -> TickArrays:
        """One tick: caller audio `pcm` float32 [B, 1920] for the slots where `rows` is True.

        Never captures: a tick whose graph is missing (or failed) runs eagerly.
        """
        B = self.max_slots
        bk = self._buckets[self.bucket_for(rows)]
        b = bk.size
        live = rows[:b]
        noisy = self.lm.draw_noise(live, bk.noise)
        graph = None
        if self.backend is not None:
            key = self._key(b, noisy)
            graph = bk.graphs.get(key)
            if graph is None and key not in bk.graphs and (b, key) not in self.eager_keys:
                self.eager_keys.add((b, key))
                log.warning("bucket %d, %s: no graph captured for these sampling settings; these ticks run "
                            "eagerly (list them in the engine's `samplings` to capture them at start)", b,
                            _describe(key))  # fmt: skip
        if graph is not None:
            assert self.backend is not None
            self._stage(bk, pcm, live)
            packed = self.backend.replay(graph)
            host = self._fetch(packed, b)
            self.backend.synchronize()  # the tick's one host sync
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

    def capture(
        self, buckets: tuple[int, ...] | None = None, samplings: tuple[SamplingParams, ...] = ()
    ) -> int:
        """Capture the graphs of `buckets` (default: all) for the slots' current sampling settings, greedy and
        (when a slot samples) sampling ticks, so no call pays a capture on the clock. With `samplings`, also
        every mix of them with slot 0's settings a bucket can hold (slots' settings are set for each mix and
        restored after: call it at start, before any call). Keys already held (or failed) are skipped. Call
        it between ticks, on the engine thread. Returns the graphs held."""
        if self.backend is None:
            return 0
        lm = self.lm
        saved = [lm.sampling(s) for s in range(self.max_slots)]
        options = [saved[0], *samplings]
        try:
            with torch.inference_mode():
                for b in buckets or self.buckets:
                    for mix in _mixes(lm, options, b) if samplings else [None]:
                        for slot in range(b) if mix is not None else ():
                            lm.set_sampling(slot, mix[slot % len(mix)])
                        self._capture_keys(self._buckets[b])
        finally:
            for slot, params in enumerate(saved):
                if lm.sampling(slot) is not params:
                    lm.set_sampling(slot, params)
        return self.graph_count

    def _capture_keys(self, bk: _Bucket) -> None:
        for noisy in (False, True):
            key = self._key(bk.size, noisy)
            if noisy and key[0].text_mode == 0 and key[0].audio_mode == 0:
                continue  # every slot of the bucket is greedy: no tick draws noise
            if key not in bk.graphs:
                self._capture(bk, key)

    @property
    def graph_count(self) -> int:
        return sum(g is not None for bk in self._buckets.values() for g in bk.graphs.values())

    @property
    def failed_graphs(self) -> list[str]:
        """The (bucket, key)s whose capture failed (they run eagerly), described for logs and `check`."""
        return [
            f"bucket {bk.size}, {_describe(key)}"
            for bk in self._buckets.values()
            for key, g in bk.graphs.items()
            if g is None
        ]

    # -- internals ------------------------------------------------------------------------------------------
    def _key(self, b: int, noisy: bool) -> GraphKey:
        # The sampling shape fixes tensor shapes and branches inside the graph; it changes only with the
        # slots' sampling settings.
        return (self.lm.sampling_shape(0, b), noisy)

    def _stage(self, bk: _Bucket, pcm: np.ndarray, live: list[bool]) -> None:
        """Caller audio and the active mask into the bucket's static device buffers (via pinned host ones)."""
        b = bk.size
        self._host_pcm[:b, 0].copy_(torch.from_numpy(np.ascontiguousarray(pcm[:b], dtype=np.float32)))
        self._host_active[:b].copy_(torch.tensor(live, dtype=torch.bool))
        bk.pcm.copy_(self._host_pcm[:b], non_blocking=True)
        bk.active.copy_(self._host_active[:b], non_blocking=True)

    def _fetch(self, packed: torch.Tensor, b: int) -> torch.Tensor:
        """The packed rows back into the host buffer; the `meta` device holds no values, so none come back."""
        host = self._host_out[:b]
        if self.device.type != "meta":
            host.copy_(packed, non_blocking=True)
        return host

    def _eager(self, bk: _Bucket, pcm: np.ndarray, live: list[bool], noisy: bool) -> torch.Tensor:
        """The tick without a graph; returns the packed rows [b, width] on the host."""
        b = bk.size
        host_pcm = torch.from_numpy(np.ascontiguousarray(pcm[:b], dtype=np.float32)).view(b, 1, FRAME_SIZE)
        if cpu_fast_path(self.device):
            # No staging copies; and when every row of the bucket runs, the unmasked path (the same results
            # as an all-True mask, without the masking work).
            return self._compute(bk, noisy, host_pcm, None if all(live) else torch.tensor(live))
        self._stage(bk, pcm, live)
        host = self._fetch(self._compute(bk, noisy, bk.pcm, bk.active), b)
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
        elif cpu_fast_path(self.device) and bool(ready.all()):
            ready = None  # a free check on a CPU: every row decodes, so skip the masking
        pcm_out = model.decode(step.agent_codes.clamp(min=0)[:, :, None], bk.dec, ready).float()
        parts = [step.text[:, None].float(), step.agent_codes.float(), step.ret_prob[:, None].float()]
        return torch.cat([*parts, pcm_out[:, 0]], dim=1)

    def _capture(self, bk: _Bucket, key: GraphKey) -> None:
        """Record the tick of one (bucket, key); on failure that key alone runs eagerly from now on."""
        backend = self.backend
        assert backend is not None
        noisy = key[1]

        def tick() -> torch.Tensor:
            return self._compute(bk, noisy, bk.pcm, bk.active)

        saved = bk.active.clone()
        graph: CapturedGraph | None = None
        try:
            # Warm-up and capture with every row inactive: kernels, cuBLAS handles and Mimi's centroid cache
            # get initialised while every slot's state stays bit-identical.
            bk.active.zero_()
            backend.warm_up(tick, 2)
            graph = backend.capture(tick)
        except Exception as exc:  # an optimisation only: this key runs eagerly, the others keep their graphs
            log.warning("graph capture for bucket %d, %s failed (%s: %s); those ticks run eagerly",
                        bk.size, _describe(key), type(exc).__name__, exc)  # fmt: skip
        finally:
            bk.active.copy_(saved)
        bk.graphs[key] = graph
        if graph is not None:
            log.info("captured the tick graph for bucket %d, %s (%s)", bk.size, _describe(key), backend.name)


def _mixes(lm: LMGenerator, options: list[SamplingParams], b: int) -> list[tuple[SamplingParams, ...]]:
    """One mix of `options` (at most `b` of them) per distinct sampling shape a bucket of `b` slots can have."""
    seen: dict[SamplingShape, tuple[SamplingParams, ...]] = {}
    for n in range(1, min(b, len(options)) + 1):
        for mix in itertools.combinations(options, n):
            seen.setdefault(lm.shape_of(mix), mix)
    return list(seen.values())


def _describe(key: GraphKey) -> str:
    """A graph key for a log line: `top-k 25/250, text greedy, audio sampling, greedy tick`."""
    shape, noisy = key
    modes = ("greedy", "sampling", "mixed")
    masked = " (per-slot top-k)" if shape.text_masked or shape.audio_masked else ""
    return (f"top-k {shape.text_k}/{shape.audio_k}{masked}, text {modes[shape.text_mode]}, "
            f"audio {modes[shape.audio_mode]}, {'sampling' if noisy else 'greedy'} tick")  # fmt: skip
