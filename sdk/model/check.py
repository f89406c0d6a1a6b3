"""`duetaspan check`: the first-contact self-test a new GPU user runs before taking calls.

It says, on one screen: the device and its free memory against the weights plus the memory of one call (KV
cache and codec state); whether the tick graphs were captured (and which failed); a 20-tick run of one call
with a persona prefill and a Context Span landing; tick P50/P99 against the 80 ms budget; and how many calls
this device should hold (the largest count whose tick P99 fits the budget, capped by memory). The exit status
is 0 when the device serves real time, 1 when it cannot (too little memory, a tick P99 over budget, a graph
capture that failed, or a persona prefill or Context Span that did not land in the run), so a deployment
script can gate on it. `--json` writes every figure (benchmarks/gpu_suite.sh keeps them).

Example:
    $ duetaspan check --device cuda --random-weights
    $ duetaspan check --model tiny-random --device cpu
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np

from duetaspan.errors import ConfigError

GIB = 1024**3
BUDGET_MS = 80.0
_RESERVE_FRACTION = 0.05  # activations, graph pools, the allocator's slack
_SPAN = "(tool result) The table for four is booked for 8 pm tonight under the name Sam."


@dataclass
class CheckReport:
    """Every figure `duetaspan check` measured (also its `--json`)."""

    model: str
    random_weights: bool
    device: str
    device_name: str
    total_gib: float
    free_gib: float
    weights_gib: float
    per_call_gib: float
    memory_calls: int
    budget_ms: float = BUDGET_MS
    graphs: str = "off"
    graphs_captured: int = 0
    graphs_failed: list[str] = field(default_factory=list)
    capture_s: float = 0.0
    load_s: float = 0.0
    peak_gib: float | None = None  # CUDA: the most memory allocated at once during the check
    persona_frames: int = 0
    persona_ms: float = 0.0
    span_frames: int = 0
    span_ms: float = 0.0
    ticks: int = 0
    tick_p50_ms: float = 0.0
    tick_p99_ms: float = 0.0
    capacity: list[dict[str, float]] = field(default_factory=list)
    capacity_calls: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `check` (the model's options; `duetaspan.check_cli` adds the agent's and runs both)."""
    p = subparsers.add_parser(
        "check",
        help="self-test a device before taking calls: memory, graphs, tick time, calls it should hold",
        description="First-contact self-test: loads the model, runs 20 ticks with a persona prefill and a "
        "Context Span, measures tick P50/P99 against the 80 ms budget and how many calls the device holds. "
        "Exit status 0 when the device serves real time, 1 when it cannot.",
    )
    p.add_argument("--device", default=None, help="cuda, cuda:1, cpu ... (default: cuda when available)")
    p.add_argument(
        "--model", default="duetaspan-7b", help="preset (default duetaspan-7b; tiny-random for CPU)"
    )
    p.add_argument(
        "--random-weights", action="store_true", help="the preset's shapes, random weights (no download)"
    )
    p.add_argument("--model-dir", type=Path, default=None, help="local folder with the weights")
    p.add_argument("--ticks", type=int, default=20, help="ticks of the one-call run (default 20)")
    p.add_argument("--max-calls", type=int, default=32, help="the most calls the capacity probe tries (32)")
    p.add_argument("--budget-ms", type=float, default=BUDGET_MS, help="tick budget (default 80 ms)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (CPU runs)")
    p.add_argument("--json", type=Path, default=None, help="write every figure to this JSON file")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    if args.ticks < 3 or args.max_calls < 1 or args.budget_ms <= 0:
        raise ConfigError("--ticks must be >= 3, --max-calls >= 1 and --budget-ms > 0")
    report = run_check(
        args.model, args.device, random_weights=args.random_weights, model_dir=args.model_dir,
        ticks=args.ticks, max_calls=args.max_calls, budget_ms=args.budget_ms, threads=args.threads,
    )  # fmt: skip
    print(render(report))
    if args.json is not None:
        args.json.write_text(json.dumps({**asdict(report), "ok": report.ok}, indent=1))
    return 0 if report.ok else 1


def run_check(
    model: str,
    device: str | None = None,
    *,
    random_weights: bool = False,
    model_dir: Path | None = None,
    ticks: int = 20,
    max_calls: int = 32,
    budget_ms: float = BUDGET_MS,
    threads: int | None = None,
) -> CheckReport:
    """Measure everything `duetaspan check` prints; problems found go to `report.problems`."""
    import torch

    from duetaspan.model.engine import DuplexEngine
    from duetaspan.model.presets import get_preset

    if threads:
        torch.set_num_threads(threads)
    dev = _device(device)
    name, total, free = _device_memory(dev)
    weights, per_call = footprint(model, dev)
    random_weights = random_weights or get_preset(model).lm is None  # tiny-random has no released weights
    reserve = max(GIB, _RESERVE_FRACTION * total)
    room = max(0, math.floor((free - weights - reserve) / per_call))
    report = CheckReport(
        model=model, random_weights=random_weights, device=str(dev), device_name=name,
        total_gib=total / GIB, free_gib=free / GIB, weights_gib=weights / GIB, per_call_gib=per_call / GIB,
        memory_calls=room, budget_ms=budget_ms,
    )  # fmt: skip
    if room < 1:
        report.problems.append(
            f"memory: weights {weights / GIB:.1f} GiB + one call {per_call / GIB:.2f} GiB + reserve "
            f"{reserve / GIB:.1f} GiB do not fit in {free / GIB:.1f} GiB free"
        )
        return report
    slots = min(room, max_calls)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    engine = DuplexEngine.load(
        model, device=dev, max_slots=slots, random_weights=random_weights, model_dir=model_dir
    )
    report.load_s = time.perf_counter() - t0  # graphs are captured during the load
    batch = engine.batch
    report.graphs = "off" if batch.backend is None else batch.backend.name
    report.graphs_captured = batch.graph_count
    report.graphs_failed = batch.failed_graphs
    if report.graphs_failed:
        report.problems.append(
            f"graphs: {len(report.graphs_failed)} capture(s) failed (those ticks run eagerly)"
        )
    _one_call(engine, report, ticks)
    _landed(report, ticks)
    _capacity(engine, report, min(room, slots))
    if dev.type == "cuda":
        report.peak_gib = torch.cuda.max_memory_allocated(dev) / GIB
    if report.tick_p99_ms > budget_ms:
        report.problems.append(
            f"real time: one call's tick P99 is {report.tick_p99_ms:.1f} ms, over the {budget_ms:g} ms budget"
        )
    return report


def footprint(model: str, device: Any) -> tuple[float, float]:
    """(weight bytes, bytes per call) of a preset on `device`, from shapes on the meta device (no memory)."""
    import torch

    from duetaspan.model.engine import DEFAULT_MAX_SPAN
    from duetaspan.model.generator import LMGenerator
    from duetaspan.model.lm import LMModel
    from duetaspan.model.lm_config import LMConfig
    from duetaspan.model.mimi import MimiModel, MimiStream
    from duetaspan.model.mimi.checkpoint import _resolve_config
    from duetaspan.model.presets import get_preset

    preset = get_preset(model)
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    meta = torch.device("meta")
    lm = LMModel(LMConfig.preset(preset.lm_config), device=meta, dtype=dtype)
    with meta:
        mimi = MimiModel(_resolve_config(preset.mimi_config, 8))
    weights = _bytes(list(lm.parameters()) + list(mimi.parameters()) + list(mimi.buffers()))
    gen = LMGenerator(lm, batch_size=1, max_span=DEFAULT_MAX_SPAN)
    stream = MimiStream(mimi, batch_size=1)
    per_call = _bytes([gen.kv.kv, gen.kv.positions, gen._dep_kv, gen.ring, stream._enc, stream._dec])
    return float(weights), float(per_call)


def _bytes(obj: Any) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, list | tuple):
        return sum(_bytes(o) for o in obj)
    if is_dataclass(obj):
        return sum(_bytes(getattr(obj, f.name)) for f in fields(obj))
    return 0


def _device(device: str | None) -> Any:
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"--device {device}: this PyTorch ({torch.__version__}) sees no CUDA device; install a CUDA build "
                "(docs/gpu.md) and check nvidia-smi"
            )
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise ConfigError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) visible")
        dev = torch.device("cuda", index)
    elif dev.type != "cpu":
        raise ConfigError(f"--device {device}: check runs on cuda or cpu")
    return dev


def _device_memory(dev: Any) -> tuple[str, float, float]:
    """(name, total bytes, free bytes) of the device (the host's RAM for the CPU)."""
    import torch

    if dev.type == "cuda":
        free, total = torch.cuda.mem_get_info(dev)
        return torch.cuda.get_device_name(dev), float(total), float(free)
    page = os.sysconf("SC_PAGE_SIZE")
    total = os.sysconf("SC_PHYS_PAGES") * page
    free = _available_ram(Path("/proc/meminfo")) or os.sysconf("SC_AVPHYS_PAGES") * page
    return f"{platform.machine()} CPU, {os.cpu_count()} cores, {torch.get_num_threads()} threads", total, free


def _available_ram(meminfo: Path) -> float | None:
    """Linux's `MemAvailable` (free pages plus the page cache and buffers it can reclaim) in bytes, None where
    there is none. Not `SC_AVPHYS_PAGES` (`MemFree`): after some file I/O the page cache holds most of the
    RAM, and counting it as used said "room for 0 calls" on a machine with 12 GiB to spare."""
    try:
        for line in meminfo.read_text().splitlines():
            name, _, value = line.partition(":")
            if name == "MemAvailable":
                return float(value.split()[0]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _audio(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n * 1920) / 24000
    pcm = 0.2 * np.sin(2 * np.pi * 180 * t) + 0.05 * rng.standard_normal(t.shape)
    return pcm.astype(np.float32).reshape(n, 1920)


def _timed_step(engine: Any, frames: dict[int, np.ndarray]) -> tuple[float, dict[int, Any]]:
    _sync(engine.device)
    t = time.perf_counter()
    out = engine.step(frames)
    _sync(engine.device)
    return (time.perf_counter() - t) * 1e3, out


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _one_call(engine: Any, report: CheckReport, ticks: int) -> None:
    """One call: persona prefill, 3 warm-up ticks, then `ticks` timed ticks with a span landing midway."""
    from duetaspan.model.persona import Persona

    prompt = (engine.preset.default_text_prompt if engine.preset else None) or "You are a helpful assistant."
    slot = engine.open_slot(Persona(text=prompt), seed=1)
    report.persona_frames, report.persona_ms = engine.prompt_stats(slot)
    audio = _audio(ticks + 3, seed=1)
    times: list[float] = []
    try:
        for i in range(ticks + 3):
            if i == 3 + ticks // 2:
                engine.inject(slot, _SPAN)
            ms, out = _timed_step(engine, {slot: audio[i]})
            for span in out[slot].spans:
                report.span_frames, report.span_ms = span.n_frames, span.prefill_ms
            if i >= 3:
                times.append(ms)
    finally:
        engine.close_slot(slot)
    report.ticks = len(times)
    report.tick_p50_ms = float(np.percentile(times, 50))
    report.tick_p99_ms = float(np.percentile(times, 99))


def _landed(report: CheckReport, ticks: int) -> None:
    """A run whose persona prefill or Context Span did not land is a failed check: the first call would
    speak without its persona, or never hear a tool's answer, however fast its ticks are."""
    if report.persona_frames <= 0:
        report.problems.append("persona: the persona prefill did not land (0 frames prefilled at call start)")
    if report.span_frames <= 0:
        report.problems.append(
            f"span: the Context Span injected at tick {3 + ticks // 2} did not land in the {ticks + 3} ticks run"
        )


def _capacity(engine: Any, report: CheckReport, most: int, ticks: int = 8) -> None:
    """Tick P99 with 1, 2, 4 ... calls open (the batch buckets) until it passes the budget."""
    for n in [b for b in engine.batch.buckets if b <= most]:
        slots = [engine.open_slot(seed=10 + k) for k in range(n)]
        audio = _audio(ticks + 2, seed=n)
        times = []
        try:
            for i in range(ticks + 2):
                ms, _ = _timed_step(engine, {s: audio[i] for s in slots})
                if i >= 2:
                    times.append(ms)
        finally:
            for s in slots:
                engine.close_slot(s)
        p99 = float(np.percentile(times, 99))
        report.capacity.append({"calls": n, "p50_ms": float(np.percentile(times, 50)), "p99_ms": p99})
        if p99 > report.budget_ms:
            break
        report.capacity_calls = n
    if report.capacity_calls == 0:
        report.problems.append("capacity: not even one call fits the tick budget")


def render(r: CheckReport) -> str:
    """The one-screen summary."""
    weights = "random weights" if r.random_weights else "weights"
    lines = [
        f"DuetaSpan self-test: {r.model} ({weights}) on {r.device}: {r.device_name}",
        f"  memory    {r.free_gib:.1f} of {r.total_gib:.1f} GiB free; weights {r.weights_gib:.2f} GiB + "
        f"{r.per_call_gib:.3f} GiB per call -> room for {r.memory_calls} calls",
    ]
    if r.ticks:
        failed = (
            f", {len(r.graphs_failed)} failed: {'; '.join(r.graphs_failed[:2])}" if r.graphs_failed else ""
        )
        graphs = (
            "off (eager ticks)" if r.graphs == "off" else f"{r.graphs}: {r.graphs_captured} captured{failed}"
        )
        span = f"{r.span_frames} frames landed in {r.span_ms:.1f} ms" if r.span_frames else "did not land"
        caps = "  ".join(f"{int(c['calls'])}:{c['p99_ms']:.1f}" for c in r.capacity)
        peak = f"; peak {r.peak_gib:.1f} GiB allocated" if r.peak_gib is not None else ""
        lines += [
            f"  load      {r.load_s:.1f} s (graph capture included){peak}",
            f"  graphs    {graphs}",
            f"  persona   {r.persona_frames} frames prefilled in {r.persona_ms:.1f} ms",
            f"  span      {span}",
            f"  ticks     {r.ticks} ticks, 1 call: P50 {r.tick_p50_ms:.1f} ms, P99 {r.tick_p99_ms:.1f} ms "
            f"(budget {r.budget_ms:g} ms)",
            f"  capacity  calls:P99 ms  {caps} -> {r.capacity_calls} calls at P99 <= {r.budget_ms:g} ms",
        ]
    if r.ok:
        probed = r.capacity and r.capacity_calls == r.capacity[-1]["calls"] < r.memory_calls
        more = " (the most the probe tried: raise --max-calls to probe further)" if probed else ""
        lines.append(f"  verdict   OK: serves real time; set --max-calls {r.capacity_calls}{more}")
    else:
        lines.append("  verdict   FAIL: this device cannot serve real time as configured")
        lines += [f"            - {p}" for p in r.problems]
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover - `duetaspan check` is the entry point
    from duetaspan.cli import main

    sys.exit(main(["check", *sys.argv[1:]]))
