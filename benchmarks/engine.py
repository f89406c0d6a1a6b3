"""The whole duplex engine per 80 ms frame: Mimi encode + LM step + Mimi decode for B slots, and persona prefill.

Usage:
    python benchmarks/engine.py                                   # tiny-random on CPU, 1 slot
    python benchmarks/engine.py --slots 4 --frames 50
    python benchmarks/engine.py --device cuda --model duetaspan-7b --random-weights --slots 8   # full size, GPU
    python benchmarks/engine.py --json out.json

Prints per-frame `DuplexEngine.step` P50/P99 (the budget is 80 ms per frame; on a CPU also the process CPU
time, which stays put on a shared, loaded box where wall time does not), the peak memory (CUDA: allocated;
CPU: process max RSS), and the persona prompt written in ONE prefill pass against the same frames stepped one at
a time (`force_step`), which is what upstream PersonaPlex does.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np
import torch

from duetaspan.model.engine import DuplexEngine, Persona
from duetaspan.model.generator import LMGenerator
from duetaspan.model.persona import persona_prompt_text, prompt_frames
from duetaspan.model.slots import SamplingParams

PERSONA = (
    "You are Ada, a kind and steady phone assistant for a small restaurant. You take table bookings, answer "
    "questions about opening hours and the menu, and keep your answers short."
)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(values), q)), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--random-weights", action="store_true", help="the preset's architecture, random weights")
    ap.add_argument("--slots", type=int, default=1)
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--voice-frames", type=int, default=100, help="voice prompt length (random codes)")
    ap.add_argument("--max-stepped", type=int, default=40,
                    help="on a CPU, time at most this many frame-by-frame persona steps (then extrapolated)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    t0 = time.perf_counter()
    engine = DuplexEngine.load(
        args.model, device=device, max_slots=args.slots, seed=0, random_weights=args.random_weights
    )
    load_s = time.perf_counter() - t0
    voice = torch.randint(0, 2048, (8, args.voice_frames), generator=torch.Generator().manual_seed(0))
    tokens = engine.tokenizer.encode(persona_prompt_text(Persona(text=PERSONA)))
    frames = prompt_frames(voice, tokens)

    # persona: one pass (first call warms up the multi-frame path) vs frame by frame
    slots = [engine.open_slot(None, sampling=SamplingParams(), seed=s) for s in range(args.slots)]
    one_pass = []
    for _ in range(3):
        engine.lm.reset(slots[0])
        _sync(device)
        t = time.perf_counter()
        engine._prefill(slots[0], frames)
        _sync(device)
        one_pass.append((time.perf_counter() - t) * 1e3)
    ref = LMGenerator(engine.lm_model, batch_size=1, max_span=engine.max_span)
    n_stepped = min(frames.shape[1], max(1, args.max_stepped) if device.type == "cpu" else frames.shape[1])
    _sync(device)
    t = time.perf_counter()
    for j in range(n_stepped):
        ref.force_step(0, frames[:, j])
    _sync(device)
    stepped_ms = (time.perf_counter() - t) * 1e3 * frames.shape[1] / n_stepped
    del ref

    # steady-state stepping of all slots, each with its persona prefilled
    for s in slots:
        engine.close_slot(s)
    slots = [engine.open_slot(None, seed=s) for s in range(args.slots)]
    for s in slots:
        engine._prefill(s, frames)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    rng = np.random.default_rng(0)
    audio = (0.1 * rng.standard_normal((args.warmup + args.frames, 1920))).astype(np.float32)
    step_ms, cpu_ms = [], []
    for i in range(args.warmup + args.frames):
        _sync(device)
        t, c = time.perf_counter(), time.process_time()
        engine.step({s: audio[i] for s in slots})
        _sync(device)
        if i >= args.warmup:
            step_ms.append((time.perf_counter() - t) * 1e3)
            cpu_ms.append((time.process_time() - c) * 1e3)
    if device.type == "cuda":
        peak = {"peak_cuda_allocated_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 3)}
    else:
        peak = {"peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)}

    result = {
        "model": args.model,
        "random_weights": args.random_weights or engine.preset.lm is None,
        "device": str(device),
        "dtype": str(engine.lm_model.dtype).replace("torch.", ""),
        "slots": args.slots,
        "frames": args.frames,
        "load_s": round(load_s, 2),
        "step_ms_p50": _pct(step_ms, 50),
        "step_ms_p99": _pct(step_ms, 99),
        **(
            {"step_cpu_ms_p50": _pct(cpu_ms, 50), "step_cpu_ms_p99": _pct(cpu_ms, 99)}
            if device.type == "cpu"
            else {}
        ),
        "step_ms_per_slot_p50": round(_pct(step_ms, 50) / args.slots, 3),
        "realtime_factor_p50": round(_pct(step_ms, 50) / 80.0, 3),
        **peak,
        "persona_frames": int(frames.shape[1]),
        "persona_one_pass_ms": round(min(one_pass), 3),
        "persona_stepped_ms": round(stepped_ms, 1),
        "persona_stepped_extrapolated_from": n_stepped,
        "persona_speedup": round(stepped_ms / min(one_pass), 1),
    }
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
