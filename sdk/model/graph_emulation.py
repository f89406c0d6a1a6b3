"""A CPU stand-in for CUDA graph capture and replay that fails where CUDA graphs fail.

`record(fn)` runs `fn` once under a `TorchDispatchMode` that writes down every aten op it dispatches, with its
arguments: tensors made by an earlier op of the recording (intermediates, re-made on every replay, like a
graph's private pool), tensors that existed before (the static buffers and weights the graph reads by
address), and plain Python values (frozen, as a kernel's launch arguments are). `Recording.replay()` runs that
op sequence again and never the Python code, so a Python value computed at capture time (a position read as
an int, a shape-dependent branch, an attribute) stays what it was then: the same wrong answer a GPU gives.

While recording, every tensor counts as device memory, and what a CUDA capture refuses raises
`GraphCaptureError`:

- host reads: `.item()`, `.tolist()`, `.numpy()`, `.cpu()`, `.to("cpu")`, `bool()/int()/float()` of a tensor,
  `torch.equal` (a `TorchFunctionMode`), `aten._local_scalar_dense` and friends (the dispatch mode), and
  `torch.cuda.synchronize` / stream and event syncs (patched for the duration);
- allocations a graph cannot keep static: data-dependent shapes (`nonzero`, boolean indexing,
  `masked_select`, `unique`, ...), a tensor built from host data (`torch.tensor(...)`), and a tensor made
  during the capture that is still referenced afterwards (a cache filled inside the capture: on a GPU it
  would hold values only during replays).

Replay raises `StaleGraphError` when a buffer the recording reads was freed since (only the recording still
holds it): the code swapped a captured buffer for a new tensor, and a GPU would replay over stale memory.

Example:
    >>> import torch
    >>> from duetaspan.model.graph_emulation import record
    >>> x, step = torch.zeros(2), 3
    >>> rec, _ = record(lambda: x + step)
    >>> step = 5; _ = x.fill_(1.0)   # the buffer is read at replay, the Python int was frozen at capture
    >>> rec.replay().tolist()
    [4.0, 4.0]
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten

from duetaspan.model.device_paths import emulated_capture

__all__ = ["GraphCaptureError", "Recording", "StaleGraphError", "record"]


class GraphCaptureError(RuntimeError):
    """Something inside a graph capture that a CUDA graph cannot record: a host sync, a data-dependent shape,
    a tensor from host data, or a tensor made during capture and kept after it."""


class StaleGraphError(RuntimeError):
    """A replay read memory its capture did not: a buffer was reallocated after the capture, so on CUDA the
    graph would have read the old, stale memory. Update captured buffers in place instead."""


_aten = torch.ops.aten
# Ops that copy a device value to the host (a sync), or whose output shape depends on tensor values.
_HOST_READS = {_aten._local_scalar_dense.default, _aten.is_nonzero.default, _aten.equal.default}
_DATA_SHAPES = {
    _aten.nonzero.default, _aten.masked_select.default, _aten._unique2.default, _aten.unique_dim.default,
    _aten.unique_consecutive.default, _aten.argwhere.default, _aten.repeat_interleave.Tensor,
}  # fmt: skip
_CONSTANTS = {_aten.lift_fresh.default, _aten.lift_fresh_copy.default}
_HOST_METHODS = {
    "item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__", "__complex__",
    "__array__", "pin_memory", "equal",
}  # fmt: skip


def _named(func: Any) -> str:
    return getattr(func, "__name__", str(func))


class _HostReads(TorchFunctionMode):
    """Python-level host reads (`tolist`/`numpy` never reach the dispatcher; the others name the call)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = _named(func)
        to_host = name == "to" and any(
            (isinstance(a, str | torch.device) and torch.device(a).type == "cpu")
            for a in [*args[1:], kwargs.get("device")]
            if a is not None and not isinstance(a, torch.dtype)
        )
        if name in _HOST_METHODS or to_host:
            raise GraphCaptureError(
                f"tensor.{name}() inside a graph capture reads a device value on the host (a sync, which "
                "CUDA graph capture refuses); keep the value on the device or read it outside the tick"
            )
        return func(*args, **kwargs)


@dataclass
class _Ref:
    slot: int  # an intermediate, by its slot in the replay's value table


@dataclass
class _Ext:
    index: int  # a tensor from before the capture (a static buffer or a weight)


@dataclass
class _Op:
    func: Any
    flat: list[Any]  # the arguments flattened, tensors as _Ref / _Ext
    spec: Any
    outs: list[int | None]  # slots of the tensor outputs (flattened)
    frees: list[int]  # slots no later op reads


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[_Op] = []
        self.slots: dict[int, int] = {}  # id(tensor) -> slot
        self.keep: list[torch.Tensor] = []  # holds intermediates while recording (ids stay unique)
        self.ext_ids: dict[int, int] = {}
        self.ext: list[torch.Tensor] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        _refuse(func, args, kwargs)
        flat, spec = tree_flatten((args, kwargs))
        coded: list[Any] = []
        for a in flat:
            if isinstance(a, torch.Tensor):
                slot = self.slots.get(id(a))
                if slot is not None:
                    coded.append(_Ref(slot))
                else:
                    index = self.ext_ids.get(id(a))
                    if index is None:
                        index = self.ext_ids[id(a)] = len(self.ext)
                        self.ext.append(a)
                    coded.append(_Ext(index))
            else:
                coded.append(a)
        out = func(*args, **kwargs)
        outs: list[int | None] = []
        for o in tree_leaves(out):
            if isinstance(o, torch.Tensor):
                slot = len(self.keep)
                self.keep.append(o)
                self.slots[id(o)] = slot
                outs.append(slot)
            else:
                outs.append(None)
        self.ops.append(_Op(func, coded, spec, outs, []))
        return out


def _refuse(func: Any, args: Any, kwargs: Any) -> None:
    if func in _HOST_READS:
        raise GraphCaptureError(
            f"{func} inside a graph capture copies a device value to the host (.item(), bool(), int() of a "
            "tensor): CUDA graph capture refuses the sync; keep the value on the device"
        )
    bool_index = func in (_aten.index.Tensor, _aten.index_put_.default, _aten.index_put.default) and any(
        isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8) for t in tree_leaves(args[1])
    )
    if func in _DATA_SHAPES or bool_index:
        raise GraphCaptureError(
            f"{func} inside a graph capture has an output shape that depends on tensor values (it needs a "
            "host sync, and a graph cannot keep its allocation static); use torch.where or a fixed-size mask"
        )
    if func in _CONSTANTS:
        raise GraphCaptureError(
            "torch.tensor(...) inside a graph capture builds a tensor from host data (a host->device copy "
            "from pageable memory, refused during CUDA capture); build it once before the capture"
        )


@contextlib.contextmanager
def _no_cuda_syncs() -> Iterator[None]:
    """`torch.cuda.synchronize` and stream/event syncs raise for the duration (patched, then restored)."""

    def refuse(*_args: Any, **_kwargs: Any) -> None:
        raise GraphCaptureError(
            "torch.cuda synchronize inside a graph capture: CUDA graph capture refuses host syncs"
        )

    targets = [(torch.cuda, "synchronize")]
    targets += [(cls, "synchronize") for cls in (torch.cuda.Stream, torch.cuda.Event) if hasattr(cls, "synchronize")]
    saved = [(obj, name, obj.__dict__[name]) for obj, name in targets if name in obj.__dict__]
    for obj, name, _ in saved:
        setattr(obj, name, refuse)
    try:
        yield
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)


def _storage_key(t: torch.Tensor) -> tuple[str, int] | None:
    if t.device.type == "meta":
        return None  # no memory: nothing to compare
    return (str(t.device), t.untyped_storage().data_ptr())


def _refs(tensors: list[torch.Tensor], i: int) -> int:
    return sys.getrefcount(tensors[i])


# How many live recordings hold each external tensor (by id): their references are not the program's.
_HELD: Counter[int] = Counter()


def _release(ids: list[int]) -> None:
    _HELD.subtract(ids)


class Recording:
    """The recorded op sequence of one capture; `replay()` runs it over the current buffers."""

    def __init__(self, rec: _Recorder, out: torch.Tensor) -> None:
        self.ops = rec.ops
        self.ext = rec.ext
        out_slot = rec.slots.get(id(out))
        if out_slot is None:
            raise GraphCaptureError("the captured function must return a tensor it computed")
        self.out_slot = out_slot
        last: dict[int, int] = {}
        for i, op in enumerate(self.ops):
            for a in op.flat:
                if isinstance(a, _Ref):
                    last[a.slot] = i
        for slot, i in last.items():
            if slot != out_slot:
                self.ops[i].frees.append(slot)
        self.n_slots = len(rec.keep)
        # Our external tensors grouped by storage (see `stale`), and the references a tensor has when only
        # our list holds it.
        self._groups: dict[tuple[str, int], list[int]] = {}
        for i, t in enumerate(self.ext):
            key = _storage_key(t)
            if key is not None:
                self._groups.setdefault(key, []).append(i)
        self._alone = _refs([torch.empty(0)], 0)
        self._ids = [id(t) for t in self.ext]
        _HELD.update(self._ids)
        weakref.finalize(self, _release, self._ids)

    def stale(self) -> int:
        """Buffers the recording reads that nothing but the recording holds any more (freed by the code)."""
        count = 0
        for members in self._groups.values():
            # No other tensor shares the storage (the temporary storage object adds one use) ...
            storage = self.ext[members[0]].untyped_storage()
            others = torch._C._storage_Use_Count(storage._cdata) - 1 > len(members)
            del storage
            # ... and no one else holds our tensors.
            held = self._alone - 1
            if not others and all(_refs(self.ext, i) <= held + _HELD[self._ids[i]] for i in members):
                count += 1
        return count

    def replay(self) -> torch.Tensor:
        stale = self.stale()
        if stale:
            raise StaleGraphError(
                f"the replay reads {stale} buffer(s) nothing else holds: a captured buffer was reallocated "
                "after capture (on CUDA the graph would read stale memory); update it in place"
            )
        values: list[Any] = [None] * self.n_slots
        ext = self.ext
        with torch.inference_mode():
            for op in self.ops:
                flat = [
                    values[a.slot] if type(a) is _Ref else ext[a.index] if type(a) is _Ext else a
                    for a in op.flat
                ]
                args, kwargs = tree_unflatten(flat, op.spec)
                out = op.func(*args, **kwargs)
                if op.outs:
                    for slot, o in zip(op.outs, tree_leaves(out), strict=True):
                        if slot is not None:
                            values[slot] = o
                for slot in op.frees:
                    values[slot] = None
        return values[self.out_slot]


def record(fn: Callable[[], torch.Tensor]) -> tuple[Recording, torch.Tensor]:
    """Run `fn` once, recording its ops (see the module docstring); raises `GraphCaptureError` for what a
    CUDA capture refuses. Returns the recording and `fn`'s output (the static output buffer). `fn`'s effects
    happen once, as a CUDA capture's warm-up would have made them."""
    rec = _Recorder()
    with emulated_capture(), _no_cuda_syncs(), _HostReads(), rec:
        out = fn()
    recording = Recording(rec, out)
    # A tensor made during the capture and still referenced afterwards (besides the output) was kept by the
    # code: on a GPU it lives in the graph's pool and holds values only while a replay runs.
    out_key = _storage_key(out)
    ext_keys = {_storage_key(t) for t in rec.ext}
    made = [
        weakref.ref(t)
        for t in rec.keep
        if (key := _storage_key(t)) is not None and key != out_key and key not in ext_keys
    ]
    rec.keep.clear()
    rec.slots.clear()
    del rec
    kept = [t for ref in made if (t := ref()) is not None]
    if kept:
        shapes = ", ".join(str(tuple(t.shape)) for t in kept[:4])
        raise GraphCaptureError(
            f"{len(kept)} tensor(s) made inside the graph capture are still referenced after it ({shapes}): "
            "a cache filled during capture holds values only during replays on a GPU; do not keep "
            "tensors made while `capturing()` is True"
        )
    return recording, out
