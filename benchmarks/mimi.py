"""Mimi codec speed: streaming encode and decode milliseconds per 80 ms frame, per preset and batch size.

Random weights (the speed does not depend on them). Run on an idle machine:

    python benchmarks/mimi.py                       # tiny and full Mimi, CPU, 1 thread and all threads
    python benchmarks/mimi.py --device cuda --dtype bfloat16 --batch 1 8 32
    python benchmarks/mimi.py --moshi               # also time Kyutai's moshi==0.2.13 Mimi for comparison
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from duetaspan.model.mimi import MimiStream, random_mimi

FRAME = 1920


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _median_ms(fn, n: int, device: str) -> tuple[float, float]:
    """Median wall and process-CPU milliseconds per call (CPU time is robust to a busy shared machine)."""
    wall, cpu = [], []
    for _ in range(n):
        _sync(device)
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        _sync(device)
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    return statistics.median(wall), statistics.median(cpu)


Timing = tuple[tuple[float, float], tuple[float, float]]


def _row(impl: str, preset: str, threads: int, batch: int, timing: Timing) -> None:
    (enc, enc_cpu), (dec, dec_cpu) = timing
    print(f"{impl:<8}{preset:<8}{threads:>8}{batch:>7}{enc:>10.2f}{dec:>10.2f}{enc + dec:>10.2f}", end="")
    print(f"{enc_cpu:>10.2f}{dec_cpu:>10.2f}")


def bench_ours(preset: str, batch: int, device: str, dtype: torch.dtype, n: int) -> Timing:
    stream = MimiStream(random_mimi(preset, device=device, dtype=dtype), batch)
    pcm = 0.1 * torch.randn(batch, 1, FRAME, device=device)
    codes = stream.encode(pcm)
    for _ in range(3):
        stream.decode(stream.encode(pcm))
    return _median_ms(lambda: stream.encode(pcm), n, device), _median_ms(
        lambda: stream.decode(codes), n, device
    )


def bench_moshi(batch: int, device: str, n: int) -> Timing:
    os.environ.setdefault("NO_TORCH_COMPILE", "1")
    from moshi.models import loaders

    mimi = loaders.get_mimi(None, device=device)
    pcm = 0.1 * torch.randn(batch, 1, FRAME, device=device)
    with torch.no_grad(), mimi.streaming(batch):
        codes = mimi.encode(pcm)
        for _ in range(3):
            mimi.decode(mimi.encode(pcm))
        return _median_ms(lambda: mimi.encode(pcm), n, device), _median_ms(
            lambda: mimi.decode(codes), n, device
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--presets", nargs="+", default=["tiny", "mimi"])
    parser.add_argument("--batch", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, torch.get_num_threads()])
    parser.add_argument("--frames", type=int, default=30, help="timed frames per measurement")
    parser.add_argument("--moshi", action="store_true", help="also time moshi's Mimi (full size, float32)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    threads = sorted(set(args.threads)) if args.device == "cpu" else [torch.get_num_threads()]
    print(f"torch {torch.__version__}, device {args.device}, dtype {args.dtype}; median ms per 80 ms frame")
    print(
        f"{'impl':<8}{'preset':<8}{'threads':>8}{'batch':>7}{'encode':>10}{'decode':>10}{'enc+dec':>10}",
        end="",
    )
    print(f"{'enc cpu':>10}{'dec cpu':>10}")
    for n_threads in threads:
        torch.set_num_threads(n_threads)
        for preset in args.presets:
            for batch in args.batch:
                _row(
                    "ours",
                    preset,
                    n_threads,
                    batch,
                    bench_ours(preset, batch, args.device, dtype, args.frames),
                )
        if args.moshi:
            for batch in args.batch:
                _row("moshi", "mimi", n_threads, batch, bench_moshi(batch, args.device, args.frames))


if __name__ == "__main__":
    main()
