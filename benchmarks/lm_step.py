"""Measure `LMGenerator.step` and one-pass `prefill` latency for an LM preset (random weights).

Usage:
    python benchmarks/lm_step.py                          # tiny-random on CPU, batch 1
    python benchmarks/lm_step.py --batch 4 --threads 2
    python benchmarks/lm_step.py --preset duetaspan-7b --device cuda --dtype bfloat16   # needs a GPU

Prints median / p90 milliseconds per step (80 ms is the real-time budget per frame) and the cost of
prefilling 16/64/256 frames in one pass against stepping them one at a time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from duetaspan.model.generator import LMGenerator
from duetaspan.model.lm import LMModel
from duetaspan.model.lm_config import LMConfig
from duetaspan.model.sampling import SamplingParams


def _ms(fn, sync) -> float:
    t = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - t) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny-random", choices=LMConfig.preset_names())
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--max-span", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    cfg = LMConfig.preset(args.preset)
    model = LMModel(cfg, device=device, dtype=dtype).eval()
    gen = LMGenerator(model, args.batch, max_span=args.max_span, sampling=SamplingParams())
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    user = torch.randint(0, cfg.card, (args.batch, 8), device=device)
    active = torch.ones(args.batch, dtype=torch.bool)
    for _ in range(10):
        gen.step(user, active)
    times = sorted(_ms(lambda: gen.step(user, active), sync) for _ in range(args.steps))
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(
        f"{args.preset} ({params:.1f} M params) {args.device}/{args.dtype} batch {args.batch} "
        f"threads {args.threads}: step median {statistics.median(times):.2f} ms, "
        f"p90 {times[int(0.9 * len(times)) - 1]:.2f} ms over {args.steps} steps"
    )
    frames = torch.full((17, args.max_span), 3, dtype=torch.long, device=device)
    frames[1:] = 100
    for n in (16, 64, 256):
        if n > args.max_span:
            continue
        gen.prefill(0, frames[:, :n])  # warm this shape
        one = min(gen.prefill(0, frames[:, :n]).total_ms for _ in range(3))
        seq = _ms(lambda n=n: [gen.force_step(0, frames[:, j]) for j in range(n)], sync)
        print(f"  prefill {n:3d} frames: one pass {one:7.1f} ms, {n} forced steps {seq:8.1f} ms")


if __name__ == "__main__":
    main()
