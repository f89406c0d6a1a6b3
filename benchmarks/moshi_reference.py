"""Our LM step beside Kyutai's reference runtime on the same shapes, same device, same dtype: a measured ratio.

Usage:
    python benchmarks/moshi_reference.py --device cuda --model duetaspan-7b          # random bf16 7B, H200
    python benchmarks/moshi_reference.py --device cpu --model tiny-random --steps 5 --warmup 1

Kyutai's `moshi==0.2.13` (installed `--no-deps`, as scripts/test.sh does; never imported by the SDK) builds its
`LMModel` with random weights at the preset's config (8 depformer steps, as ours runs) and `LMGen.step` runs
with its default sampling and, on CUDA, its own CUDA graphs (moshi's `CUDAGraphed`, unless NO_CUDA_GRAPH is
set). Then our `LMGenerator.step` (batch 1, default sampling, CUDA graph per shape) runs on a model of the
same shapes. Printed and written to `--json`: P50/P99 ms per step of each and the ratio ours / reference.
Without moshi installed the script says so and writes `{"skipped": ...}` (exit 0): the comparison is
optional, the rest of the GPU suite is not.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from duetaspan.model.generator import LMGenerator
from duetaspan.model.lm import LMModel
from duetaspan.model.lm_config import LMConfig
from duetaspan.model.presets import get_preset
from duetaspan.model.sampling import SamplingParams


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _figures(times: list[float]) -> dict[str, float]:
    arr = np.asarray(times)
    return {
        "p50_ms": round(float(np.percentile(arr, 50)), 3),
        "p99_ms": round(float(np.percentile(arr, 99)), 3),
    }


def _time(step: Any, device: torch.device, steps: int, warmup: int) -> list[float]:
    times = []
    for i in range(warmup + steps):
        _sync(device)
        t = time.perf_counter()
        step(i)
        _sync(device)
        if i >= warmup:
            times.append((time.perf_counter() - t) * 1e3)
    return times


def reference(
    config: LMConfig, device: torch.device, dtype: torch.dtype, steps: int, warmup: int
) -> list[float]:
    from moshi.models.lm import LMGen
    from moshi.models.lm import LMModel as MoshiLM

    torch.manual_seed(0)
    model = MoshiLM(**config.to_lm_kwargs(), device=device, dtype=dtype).eval()
    gen = LMGen(model)  # moshi's defaults: sampling, temp 0.8 / 0.7, top-k 250 / 25
    codes = torch.zeros(1, 8, 1, dtype=torch.long, device=device)
    with gen.streaming(1):
        times = _time(lambda i: gen.step(codes), device, steps, warmup)
    return times


def ours(config: LMConfig, device: torch.device, dtype: torch.dtype, steps: int, warmup: int) -> list[float]:
    torch.manual_seed(0)
    gen = LMGenerator(LMModel(config, device=device, dtype=dtype).eval(), batch_size=1, max_span=256)
    gen.set_sampling(0, SamplingParams(seed=1))
    codes = torch.zeros(1, 8, dtype=torch.long, device=device)
    times = _time(lambda i: gen.step(codes), device, steps, warmup)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default="duetaspan-7b", help="preset whose LM shapes both sides use")
    ap.add_argument("--random-weights", action="store_true", help="accepted for the suite; always random")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = LMConfig.preset(get_preset(args.model).lm_config).model_copy(update={"dep_q": 8})
    result: dict[str, Any] = {"model": args.model, "device": str(device), "dtype": str(dtype).split(".")[-1],
                              "steps": args.steps, "batch": 1}  # fmt: skip
    try:
        import moshi
    except ImportError:
        result["skipped"] = "moshi is not installed: pip install --no-deps 'moshi==0.2.13' (scripts/test.sh)"
        print(result["skipped"])
    else:
        result["moshi_version"] = moshi.__version__
        ref = _figures(reference(config, device, dtype, args.steps, args.warmup))
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        own = _figures(ours(config, device, dtype, args.steps, args.warmup))
        result.update(reference=ref, ours=own, ratio_p50=round(own["p50_ms"] / ref["p50_ms"], 3))
        print(f"LM step, batch 1, {args.model} on {device} ({result['dtype']}): moshi {ref['p50_ms']:.2f} / "
              f"{ref['p99_ms']:.2f} ms, ours {own['p50_ms']:.2f} / {own['p99_ms']:.2f} ms (P50 / P99); "
              f"ratio ours/moshi {result['ratio_p50']:.2f}")  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
