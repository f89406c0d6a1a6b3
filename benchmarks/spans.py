"""Context Span cost: one prefill pass of n frames plus the next step, against n single forced steps.

Usage:
    python benchmarks/spans.py                                     # tiny-random on CPU
    python benchmarks/spans.py --device cuda --model duetaspan-7b --random-weights
    python benchmarks/spans.py --json out.json

For n in {0, 16, 64, 256, 600} (span frames: open + n-2 tokens + close; 0 = no span) it prints the one-pass
prefill time, the engine step right after it (the frame that carries the span: it must fit in 80 ms), and the
ratio one-pass / n single `force_step`s (the frame-by-frame way). Target on CPU tiny-random: ratio <= 0.1 at
n = 64. Single steps are timed for up to `--max-single` frames and extrapolated beyond (marked `est`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from duetaspan.model.engine import DuplexEngine, Persona
from duetaspan.model.generator import LMGenerator
from duetaspan.spans.block import span_frames

SIZES = (0, 16, 64, 256, 600)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--random-weights", action="store_true")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-single", type=int, default=64, help="time at most this many single steps per size")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sizes = [int(s) for s in args.sizes.split(",")]
    engine = DuplexEngine.load(
        args.model, device=device, max_slots=1, seed=0, random_weights=args.random_weights,
        max_span=max(max(sizes), 3),
    )  # fmt: skip
    slot = engine.open_slot(Persona(text="You are Ada, a helpful phone assistant."), seed=0)
    rng = np.random.default_rng(0)
    frame = (0.1 * rng.standard_normal(1920)).astype(np.float32)
    for _ in range(3):  # warm up both paths (the first multi-frame pass is slow on GPU)
        engine.step({slot: frame})
        engine._prefill(slot, span_frames([100] * 14))
    ref = LMGenerator(engine.lm_model, batch_size=1, max_span=engine.max_span)
    ref.step(torch.zeros(1, 8, dtype=torch.long))

    rows = []
    for n in sizes:
        block = span_frames([int(t) for t in rng.integers(20, 1000, size=max(n - 2, 0))]) if n else None
        prefill, step = [], []
        for _ in range(args.repeats):
            _sync(device)
            t = time.perf_counter()
            if block is not None:
                engine._prefill(slot, block)
            _sync(device)
            t1 = time.perf_counter()
            engine.step({slot: frame})
            _sync(device)
            prefill.append((t1 - t) * 1e3)
            step.append((time.perf_counter() - t1) * 1e3)
        row = {
            "n": n,
            "prefill_ms": round(statistics.median(prefill), 3),
            "next_step_ms": round(statistics.median(step), 3),
            "total_ms": round(statistics.median(p + s for p, s in zip(prefill, step, strict=True)), 3),
        }
        if n:
            k = min(n, args.max_single)
            _sync(device)
            t = time.perf_counter()
            for j in range(k):
                ref.force_step(0, block[:, j])
            _sync(device)
            single = (time.perf_counter() - t) * 1e3 * n / k
            row["single_steps_ms"] = round(single, 1)
            row["single_steps_estimated"] = k < n
            row["ratio"] = round(row["prefill_ms"] / single, 4)
        row["fits_80ms"] = row["total_ms"] <= 80.0
        rows.append(row)
        est = " est" if row.get("single_steps_estimated") else ""
        print(
            f"n={n:4d}  prefill {row['prefill_ms']:9.2f} ms  next step {row['next_step_ms']:8.2f} ms  "
            f"total {row['total_ms']:9.2f} ms  "
            + (
                f"{n} single steps {row['single_steps_ms']:9.1f} ms{est}  ratio {row['ratio']:.4f}"
                if n
                else ""
            )
        )
    result = {"model": args.model, "device": str(device), "dtype": str(engine.lm_model.dtype), "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
