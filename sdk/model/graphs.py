"""The graph backend seam of the batched tick: stream, capture, replay and memory pool behind one small object.

`BatchedTick` records its whole tick once per (bucket, sampling shape) and replays it every 80 ms. What does
the recording is a `GraphBackend`:

- `CudaGraphBackend` wraps `torch.cuda.CUDAGraph` on one device (`cuda:N`): warm-ups on a side stream,
  capture into a shared memory pool, replay, and the tick's one host sync, all under `torch.cuda.device(N)`
  so a second GPU captures on its own stream.
- `EmulatedGraphBackend` runs anywhere (the CPU in CI): capture records the tick's aten op sequence and
  refuses what CUDA capture refuses (host syncs, data-dependent shapes, tensors kept past the capture);
  replay runs the recorded ops again over the static buffers (never the Python code) and copies the result
  into the static output buffer. So bucket choice, masked warm-up, static buffers, noise pre-fill, replay,
  graph cache keys, the per-shape fallback to eager, and the bugs of frozen Python values all show on a CPU
  (`duetaspan.model.graph_emulation`).

`StepGraphs` is the LM generator's own, simpler cache for direct `LMGenerator.step` use on a GPU: one
`torch.cuda.CUDAGraph` per step shape, captured at start (`LMGenerator.capture_step_graphs`), never in a step.

`NO_CUDA_GRAPH` is read by `graphs_disabled_by_env` only (generator.py and batching.py share it).

Example:
    >>> import torch
    >>> from duetaspan.model.graphs import EmulatedGraphBackend
    >>> backend = EmulatedGraphBackend(torch.device("cpu"))
    >>> x = torch.zeros(2)
    >>> graph = backend.capture(lambda: x + 1)
    >>> _ = x.fill_(5.0)  # a new input, written in place as a tick does
    >>> backend.replay(graph).tolist()
    [6.0, 6.0]
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from duetaspan.model.device_paths import emulated_capture
from duetaspan.model.graph_emulation import GraphCaptureError, StaleGraphError, record

log = logging.getLogger(__name__)

__all__ = [
    "CapturedGraph",
    "CudaGraphBackend",
    "EmulatedGraphBackend",
    "GraphBackend",
    "GraphCaptureError",
    "StaleGraphError",
    "StepGraphs",
    "graph_backend_for",
    "graphs_disabled_by_env",
]

_OFF = ("1", "true", "yes", "on")
_ON = ("", "0", "false", "no", "off")


def graphs_disabled_by_env(environ: dict[str, str] | None = None) -> bool:
    """Whether `NO_CUDA_GRAPH` turns graphs off: 1/true/yes/on do; unset, empty, 0/false/no/off do not.

    Any other value also turns them off (the safe side), with a warning naming the value.

    >>> graphs_disabled_by_env({"NO_CUDA_GRAPH": "false"}), graphs_disabled_by_env({"NO_CUDA_GRAPH": "1"})
    (False, True)
    """
    value = (os.environ if environ is None else environ).get("NO_CUDA_GRAPH", "").strip().lower()
    if value in _ON:
        return False
    if value not in _OFF:
        log.warning("NO_CUDA_GRAPH=%r is not one of 1/true/yes/on or 0/false/no/off; graphs stay off", value)
    return True


@dataclass
class CapturedGraph:
    """One recorded tick: the backend's handle and the static output tensor replays write into."""

    handle: Any
    output: torch.Tensor


class GraphBackend(Protocol):
    """What `BatchedTick` needs to record and replay its tick."""

    name: str
    device: torch.device

    def warm_up(self, fn: Callable[[], Any], times: int) -> None:
        """Run `fn` eagerly `times` times the way capture will need it (a side stream on CUDA)."""

    def capture(self, fn: Callable[[], torch.Tensor]) -> CapturedGraph:
        """Record `fn` (device work only, no host sync); raises when it cannot be recorded."""

    def replay(self, graph: CapturedGraph) -> torch.Tensor:
        """Run a recorded tick again over the current contents of its static inputs; returns its output."""

    def synchronize(self) -> None:
        """Wait for the device work queued so far (the tick's one host sync)."""


class CudaGraphBackend:
    """`torch.cuda.CUDAGraph` on one CUDA device; every call runs under `torch.cuda.device(device)`."""

    name = "cuda"

    def __init__(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise ValueError(f"CudaGraphBackend needs a CUDA device, got {device}")
        self.device = device
        self._pool: Any = None

    @contextlib.contextmanager
    def _on_device(self) -> Iterator[None]:
        with torch.cuda.device(self.device):
            yield

    def warm_up(self, fn: Callable[[], Any], times: int) -> None:
        with self._on_device():
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(times):
                    fn()
            torch.cuda.current_stream(self.device).wait_stream(side)

    def capture(self, fn: Callable[[], torch.Tensor]) -> CapturedGraph:
        with self._on_device():
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                out = fn()
        return CapturedGraph(graph, out)

    def replay(self, graph: CapturedGraph) -> torch.Tensor:
        with self._on_device():
            graph.handle.replay()
        return graph.output

    def synchronize(self) -> None:
        torch.cuda.current_stream(self.device).synchronize()


class EmulatedGraphBackend:
    """Capture and replay emulated on any device: the CUDA code path, runnable in CI, failing where CUDA fails.

    Capture records the tick's op sequence (`duetaspan.model.graph_emulation.record`) and refuses what a CUDA
    capture refuses (host syncs, data-dependent shapes, host-built tensors, tensors kept past the capture:
    `GraphCaptureError`); replay re-runs that op sequence, never the Python code, over the current contents of
    the static buffers, so Python values frozen at capture stay frozen as on a GPU, and raises
    `StaleGraphError` when a captured buffer was swapped for a new tensor. Warm-ups and captures run the CUDA
    branches of hot-path code (`duetaspan.model.device_paths`). `captures` and `replays` count what happened.
    """

    name = "emulated"

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.captures = 0
        self.replays = 0

    def warm_up(self, fn: Callable[[], Any], times: int) -> None:
        with emulated_capture(capture=False):
            for _ in range(times):
                fn()

    def capture(self, fn: Callable[[], torch.Tensor]) -> CapturedGraph:
        # CUDA records without running; the caller captures with every row masked, so running fn once here
        # (to record it and get the static output buffer) leaves every slot's state as capture on a GPU would.
        recording, out = record(fn)
        self.captures += 1
        return CapturedGraph(recording, out)

    def replay(self, graph: CapturedGraph) -> torch.Tensor:
        out = graph.handle.replay()
        graph.output.copy_(out)
        self.replays += 1
        return graph.output

    def synchronize(self) -> None:
        return None


def graph_backend_for(device: torch.device, requested: bool | None = None) -> GraphBackend | None:
    """The backend a tick on `device` gets by default: CUDA graphs on CUDA devices unless `requested` is False
    or `NO_CUDA_GRAPH` turns them off; None (eager ticks) elsewhere."""
    if requested is False or device.type != "cuda" or graphs_disabled_by_env():
        return None
    return CudaGraphBackend(device)


Step = tuple[torch.Tensor, ...]


class StepGraphs:
    """CUDA graphs of one step function, one per shape key, captured at start only (`capture`): a step never
    captures (a capture synchronises the device and runs `gc.collect()` and `empty_cache()`). A key with no
    graph runs eagerly, with one warning.

    The step must be graph-safe device work (no host syncs, state updated in place); its inputs are copied into
    the captured static buffers before each replay and its outputs are cloned after. A failed capture leaves
    that key eager for good: capture is an optimisation, it never fails the call.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._entries: dict[Hashable, Any] = {}

    def capture(self, key: Hashable, step: Callable[..., Step], *inputs: torch.Tensor | None) -> bool:
        """Record `step` over static clones of `inputs` (the caller warmed it up); False when it failed."""
        if key in self._entries:
            return self._entries[key] not in ("eager", "warned")
        static = [None if t is None else t.clone() for t in inputs]
        try:
            with torch.cuda.device(self.device):  # cuda:N captures on its own device's stream
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    outs = step(*static)
        except Exception as exc:
            log.warning("CUDA graph capture of the LM step failed for %s (%s); that shape runs eagerly", key, exc)
            self._entries[key] = "eager"
            return False
        self._entries[key] = (graph, static, outs)
        return True

    def run(self, key: Hashable, step: Callable[..., Step], *inputs: torch.Tensor | None) -> Step:
        entry = self._entries.get(key)
        if entry is None:
            log.warning("no CUDA graph was captured for the LM step shape %s; it runs eagerly (capture it at "
                        "start: LMGenerator.capture_step_graphs)", key)  # fmt: skip
            entry = self._entries[key] = "warned"
        if entry in ("eager", "warned"):
            return step(*inputs)
        graph, static, outs = entry
        for buf, value in zip(static, inputs, strict=True):
            if buf is not None and value is not None:
                buf.copy_(value)
        with torch.cuda.device(self.device):
            graph.replay()
        return tuple(out.clone() for out in outs)
