"""Calls per engine: tick time against the number of concurrent calls, and the largest count whose P99 fits.

Usage:
    python benchmarks/capacity.py                                  # tiny-random on CPU, 1..8 calls
    python benchmarks/capacity.py --calls 1,2,4,8 --ticks 40 --threads 2
    python benchmarks/capacity.py --device cuda --model duetaspan-7b --random-weights        # H200 target
    python benchmarks/capacity.py --device cuda --model duetaspan-7b --random-weights --no-graphs
    python benchmarks/capacity.py --json capacity.json

One engine with `--max-slots` slots (default: the largest count asked). For each count n, n calls are open
(slots 0..n-1, each with its own seed and the default sampling), and `DuplexEngine.step` runs back to back for
`--ticks` ticks after `--warmup` (a tick = Mimi encode + LM step + Mimi decode of every call: what the 80 ms
clock does). Printed per n: tick P50/P99/max, the batch bucket used, and whether P99 fits the budget
(`--budget-ms`, default 80). Capacity = the largest n whose P99 fits, refined by bisection between the last
count that fits and the first that does not (`--no-refine` skips that). The counts stop once a median is
twice the budget, unless `--every-count`. Also printed: the tick-time ratio of
8 calls to 1 call (how well batching amortises), and the batch-1 tick. H200 targets: capacity >= 16 calls at
P99 <= 80 ms, batch-1 tick <= 25 ms. Every count's figures go to `--json`.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np
import torch

from duetaspan.model.engine import DuplexEngine


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(values), q)), 3)


def measure(engine: DuplexEngine, n: int, ticks: int, warmup: int, seed: int = 0) -> dict[str, Any]:
    """Tick figures with n calls open (slots 0..n-1); closes them afterwards."""
    slots = [engine.open_slot(None, seed=seed + k) for k in range(n)]
    rng = np.random.default_rng(seed)
    audio = (0.1 * rng.standard_normal((warmup + ticks, n, 1920))).astype(np.float32)
    times: list[float] = []
    try:
        for i in range(warmup + ticks):
            frames = {s: audio[i, k] for k, s in enumerate(slots)}
            _sync(engine.device)
            t = time.perf_counter()
            engine.step(frames)
            _sync(engine.device)
            if i >= warmup:
                times.append((time.perf_counter() - t) * 1e3)
        bucket = engine.batch.bucket_for([engine.is_open(s) for s in range(engine.max_slots)])
    finally:
        for s in slots:
            engine.close_slot(s)
    return {
        "calls": n,
        "bucket": bucket,
        "tick_p50_ms": _pct(times, 50),
        "tick_p99_ms": _pct(times, 99),
        "tick_max_ms": round(max(times), 3),
        "per_call_ms": round(float(np.median(times)) / n, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--random-weights", action="store_true", help="the preset's architecture, random weights")
    ap.add_argument("--calls", default=None, help="comma-separated call counts (default: 1,2,4,8[,16,24,32])")
    ap.add_argument("--max-slots", type=int, default=None, help="engine slots (default: the largest count)")
    ap.add_argument("--ticks", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--budget-ms", type=float, default=80.0)
    ap.add_argument("--no-refine", action="store_true", help="skip the bisection between two counts")
    ap.add_argument(
        "--every-count", action="store_true", help="measure every count, even past twice the budget"
    )
    ap.add_argument("--no-graphs", action="store_true", help="eager ticks even on CUDA")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    default = "1,2,4,8,16,24,32" if device.type == "cuda" else "1,2,4,8"
    counts = sorted({int(c) for c in (args.calls or default).split(",")})
    max_slots = args.max_slots or counts[-1]

    t0 = time.perf_counter()
    engine = DuplexEngine.load(
        args.model,
        device=device,
        max_slots=max_slots,
        seed=0,
        random_weights=args.random_weights,
        cuda_graphs=False if args.no_graphs else None,
    )
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    # The engine captured one graph per bucket while it was built (so load_s includes that); this only
    # confirms nothing is missing before timing (CUDA only; 0 elsewhere).
    graphs = engine.batch.capture()
    capture_s = time.perf_counter() - t0

    rows: dict[int, dict[str, Any]] = {}
    for n in counts:
        rows[n] = measure(engine, n, args.ticks, args.warmup)
        r = rows[n]
        fits = r["tick_p99_ms"] <= args.budget_ms
        print(
            f"{n:3d} calls (bucket {r['bucket']:2d}): tick P50 {r['tick_p50_ms']:8.2f} ms  "
            f"P99 {r['tick_p99_ms']:8.2f} ms  max {r['tick_max_ms']:8.2f} ms  "
            f"{r['per_call_ms']:7.2f} ms/call  {'fits' if fits else 'OVER'} {args.budget_ms:.0f} ms"
        )
        if (
            not fits
            and n != counts[-1]
            and rows[n]["tick_p50_ms"] > 2 * args.budget_ms
            and not args.every_count
        ):
            print("  (stopping: the median is already twice the budget)")
            break

    def fits(n: int) -> bool:
        return rows[n]["tick_p99_ms"] <= args.budget_ms

    ok = [n for n in rows if fits(n)]
    capacity = max(ok) if ok else 0
    over = [n for n in rows if not fits(n) and n > capacity]
    if not args.no_refine and over:
        lo, hi = capacity, min(over)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            rows[mid] = measure(engine, mid, args.ticks, args.warmup)
            print(f"  refine {mid:3d} calls: P99 {rows[mid]['tick_p99_ms']:.2f} ms")
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        capacity = lo

    ratio = None
    if 1 in rows and 8 in rows:
        ratio = round(rows[8]["tick_p50_ms"] / rows[1]["tick_p50_ms"], 3)
    result = {
        "benchmark": "capacity",
        "model": args.model,
        "random_weights": bool(args.random_weights or engine.preset is None or engine.preset.lm is None),
        "device": str(device),
        "dtype": str(engine.lm_model.dtype).replace("torch.", ""),
        "cuda_graphs": engine.batch.graphs_enabled,
        "graphs_captured": graphs,
        "capture_s": round(capture_s, 3),
        "threads": torch.get_num_threads(),
        "max_slots": max_slots,
        "buckets": list(engine.batch.buckets),
        "budget_ms": args.budget_ms,
        "load_s": round(load_s, 3),
        "capacity_calls": capacity,
        "batch1_tick_p50_ms": rows[1]["tick_p50_ms"] if 1 in rows else None,
        "ratio_b8_over_b1": ratio,
        "by_calls": [rows[n] for n in sorted(rows)],
    }
    if device.type == "cuda":
        result["peak_cuda_allocated_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 3)
    print(
        f"capacity: {capacity} concurrent calls with tick P99 <= {args.budget_ms:.0f} ms "
        f"({args.model}, {device}, graphs {'on' if engine.batch.graphs_enabled else 'off'}); "
        f"batch-1 tick {result['batch1_tick_p50_ms']} ms; B=8/B=1 tick ratio {ratio}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
