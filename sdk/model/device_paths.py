"""Which branch hot-path code takes on a device: the one switch between CPU shortcuts and the CUDA path.

Several hot functions take a cheaper branch on a CPU than on a GPU (the attention span hint of the temporal
transformer, Mimi's streaming convs as matmuls, the all-rows-decode shortcut of the tick, the codes range
check). They all ask `cpu_fast_path(device)`. With `cuda_branches()` on, it answers False on the CPU too, so
the CUDA branch runs there (its ops exist on the CPU): the `cuda_logic` tests and the emulated graph backend
prove the code a GPU runs, not the CPU shortcut.

`capturing(device)` is True while a CUDA graph is captured on that device, or while `EmulatedGraphBackend`
records a tick (`emulated_capture()`): a tensor made then must not be cached for later calls.

Example:
    >>> import torch
    >>> from duetaspan.model.device_paths import cpu_fast_path, cuda_branches
    >>> cpu = torch.device("cpu")
    >>> with cuda_branches():
    ...     inside = cpu_fast_path(cpu)
    >>> cpu_fast_path(cpu), inside
    (True, False)
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

__all__ = ["capturing", "cpu_fast_path", "cuda_branches", "cuda_branches_on", "emulated_capture"]

_state = threading.local()
_global = {"cuda_branches": False}


def cuda_branches_on() -> bool:
    """Whether the CUDA branches are forced on the CPU (process-wide, or in this thread)."""
    return _global["cuda_branches"] or getattr(_state, "cuda_branches", False)


@contextlib.contextmanager
def cuda_branches(on: bool = True) -> Iterator[None]:
    """Run hot-path code's CUDA branch on the CPU (process-wide, so engine threads see it too)."""
    saved = _global["cuda_branches"]
    _global["cuda_branches"] = on
    try:
        yield
    finally:
        _global["cuda_branches"] = saved


def cpu_fast_path(device: torch.device) -> bool:
    """True where the CPU-only branch may run: a CPU device, with `cuda_branches` off."""
    return device.type == "cpu" and not cuda_branches_on()


@contextlib.contextmanager
def emulated_capture(capture: bool = True) -> Iterator[None]:
    """In this thread, run the CUDA branches and (with `capture`) count as recording a graph (`capturing`):
    what `EmulatedGraphBackend` does around its warm-ups and captures."""
    saved = getattr(_state, "capturing", False), getattr(_state, "cuda_branches", False)
    _state.capturing, _state.cuda_branches = capture or saved[0], True
    try:
        yield
    finally:
        _state.capturing, _state.cuda_branches = saved


def capturing(device: torch.device) -> bool:
    """Whether a graph is being recorded now: a CUDA capture on `device`, or an emulated one in this thread."""
    if getattr(_state, "capturing", False):
        return True
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()
