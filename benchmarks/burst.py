"""A burst of callers beside live calls: do the live calls' ticks stay on time while the new ones open?

Usage:
    python benchmarks/burst.py                                   # CPU: random dim 512 x 8 layers, 8 + 8 calls
    python benchmarks/burst.py --live 4 --opening 4 --mode new
    python benchmarks/burst.py --device cuda --model duetaspan-7b --random-weights --live 8 --opening 8
    python benchmarks/burst.py --json burst.json

One engine with `--live + --opening` slots runs on the real engine host (`ThreadHost`, the 80 ms clock). First
`--live` calls open and talk (each with a persona: `--voice-frames` of voice codes plus a persona text, about
100 prefill frames in all), then `--opening` calls ring at once, and the clock runs until every new call's
prompt is written and `--after` more ticks passed (at least `--window` ticks from the ring, the same in
both modes). Printed per mode: the ticks skipped and the live calls'
clock lateness (worst and P99) from the moment the burst rang, and how long the new callers waited for
their first model frame. `--mode old` writes each persona prompt in one pass when its call opens (the
behaviour before issue 23.3); `--mode new` queues it and writes it in chunks that fit each tick's spare
time; `--mode both` (default) runs old then new in one run. Goal (issue 23.3): no skipped tick and lateness
under 40 ms for the live calls when 8 callers ring beside 8 live ones. On a CPU the model is a random
`--dim` x `--layers` config (tiny-random's other sizes) whose 100-frame prefill costs about a tick there;
`--model` picks a preset instead (`--random-weights` for no download). Also printed: one 100-frame prefill
and one full tick measured alone, so the figures can be read against the 80 ms budget.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from duetaspan.model.engine import DuplexEngine, Persona
from duetaspan.model.lm import LMModel
from duetaspan.model.lm_config import LMConfig
from duetaspan.model.mimi import random_mimi
from duetaspan.model.tokenizer import TextTokenizer
from duetaspan.pipeline.thread_host import ThreadHost

PERSONA_TEXT = "You are Ada, the booking assistant of a small hotel. Be brief and kind."


class Events:
    """Counts each call's frames and remembers when a call heard its first model frame."""

    def __init__(self) -> None:
        self.frames: dict[int, int] = {}
        self.first_model_frame: dict[int, float] = {}
        self.failed: list[str] = []
        self._lock = threading.Lock()

    def tick(self, key: int, out: Any) -> None:
        with self._lock:
            self.frames[key] = self.frames.get(key, 0) + 1
            if out.result.step_ms > 0 and key not in self.first_model_frame:
                self.first_model_frame[key] = time.perf_counter()

    def call_failed(self, key: int, exc: BaseException) -> None:
        self.failed.append(f"{key}: {exc}")

    def host_down(self, exc: BaseException, *, crashed: bool) -> None:
        self.failed.append(f"host down: {exc}")


def build_engine(args: argparse.Namespace, slots: int, tmp: Path) -> DuplexEngine:
    if args.model:
        return DuplexEngine.load(
            args.model, device=args.device, max_slots=slots, random_weights=args.random_weights, seed=0
        )
    kwargs = {**LMConfig.preset("tiny-random").to_lm_kwargs(), "dim": args.dim, "num_layers": args.layers,
              "num_heads": max(4, args.dim // 64)}  # fmt: skip
    torch.manual_seed(0)
    lm = LMModel(LMConfig.from_lm_kwargs(kwargs), device=args.device).eval()
    mimi = random_mimi("tiny", seed=0).to(args.device)
    return DuplexEngine(lm, mimi, TextTokenizer.tiny(tmp), max_slots=slots, max_span=args.max_span)


def persona(engine: DuplexEngine, args: argparse.Namespace, tmp: Path) -> Persona:
    codes = torch.randint(0, engine.lm.config.card, (8, args.voice_frames), generator=torch.Generator().manual_seed(1))
    path = tmp / "voice.pt"
    torch.save({"codes": codes}, path)
    return Persona(text=PERSONA_TEXT, voice=str(path))


def alone(engine: DuplexEngine, who: Persona, slots: int) -> dict[str, float]:
    """One persona prefill and one tick of every slot, each measured alone (ms)."""
    opened = [engine.open_slot(None, seed=k) for k in range(slots)]
    frames = {s: np.zeros(1920, np.float32) for s in opened}
    for _ in range(3):
        engine.step(frames)
    t = time.perf_counter()
    engine.step(frames)
    tick_ms = (time.perf_counter() - t) * 1e3
    for s in opened:
        engine.close_slot(s)
    s = engine.open_slot(who, seed=1)
    frames_n, prefill_ms = engine.prompt_stats(s)
    engine.close_slot(s)
    return {"prefill_frames": frames_n, "prefill_ms": round(prefill_ms, 1), "tick_ms": round(tick_ms, 1)}


async def run_mode(engine: DuplexEngine, who: Persona, args: argparse.Namespace, mode: str) -> dict[str, Any]:
    events = Events()
    host = ThreadHost(engine, bounded_opening=mode == "new")
    host.bind(events)
    host.start()
    period = host.period
    try:
        await asyncio.gather(*(host.open_slot(k, f"live{k}", persona=who, seed=k) for k in range(args.live)))
        await _until(lambda: not engine.openings and all(events.frames.get(k, 0) >= args.warmup
                                                         for k in range(args.live)), period)  # fmt: skip
        clock = host.clock
        skipped0, ticks0 = clock.skipped_ticks, clock.ticks
        clock.max_lateness_ms = 0.0
        clock.recent_lateness_ms.clear()
        rang = time.perf_counter()
        keys = range(args.live, args.live + args.opening)
        await asyncio.gather(*(host.open_slot(k, f"new{k}", persona=who, seed=k) for k in keys))
        await _until(lambda: all(k in events.first_model_frame for k in keys), period)
        settled = clock.ticks
        await _until(lambda: clock.ticks >= max(settled + args.after, ticks0 + args.window), period)
        lateness = list(clock.recent_lateness_ms)
        waits = [(events.first_model_frame[k] - rang) * 1e3 for k in keys]
        return {
            "mode": mode,
            "ticks": clock.ticks - ticks0,
            "skipped_ticks": clock.skipped_ticks - skipped0,
            "live_lateness_max_ms": round(max(lateness), 1),
            "live_lateness_p99_ms": round(float(np.percentile(lateness, 99)), 1),
            "new_call_first_frame_ms": {"median": round(float(np.median(waits)), 1), "max": round(max(waits), 1)},
            "chunks": len(engine.openings.chunk_sizes) if mode == "new" else 0,
            "failed": events.failed,
        }
    finally:
        for k in range(args.live + args.opening):
            await host.close_slot(k)
        await host.stop()
        engine.openings.chunk_sizes.clear()


async def _until(done, period: float, timeout_s: float = 300.0) -> None:
    deadline = time.perf_counter() + timeout_s
    while not done():
        if time.perf_counter() > deadline:
            raise TimeoutError("burst: the calls did not get going")
        await asyncio.sleep(period / 4)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--live", type=int, default=8)
    p.add_argument("--opening", type=int, default=8)
    p.add_argument("--mode", choices=("old", "new", "both"), default="both")
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", default=None, help="a preset instead of the random --dim x --layers model")
    p.add_argument("--random-weights", action="store_true")
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--voice-frames", type=int, default=80, help="voice prompt frames (plus the text's)")
    p.add_argument("--max-span", type=int, default=256)
    p.add_argument("--warmup", type=int, default=10, help="ticks the live calls run before the burst")
    p.add_argument("--after", type=int, default=10, help="ticks after the last new call got going")
    p.add_argument("--window", type=int, default=40, help="ticks measured from the ring at least (both modes)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    slots = args.live + args.opening
    with tempfile.TemporaryDirectory() as tmp:
        engine = build_engine(args, slots, Path(tmp))
        who = persona(engine, args, Path(tmp))
        base = alone(engine, who, slots)
        cfg = engine.lm.config
        print(f"model dim {cfg.dim} x {cfg.num_layers} layers on {args.device}; {slots} slots; persona prefill "
              f"{base['prefill_frames']} frames in {base['prefill_ms']} ms alone; a {slots}-call tick "
              f"{base['tick_ms']} ms alone (budget 80 ms)")  # fmt: skip
        modes = ["old", "new"] if args.mode == "both" else [args.mode]
        results = [asyncio.run(run_mode(engine, who, args, m)) for m in modes]
    print(f"{args.opening} callers ring beside {args.live} live calls:")
    print(f"  {'mode':5} {'ticks':>6} {'skipped':>8} {'late max':>10} {'late P99':>10} {'new call waits':>16}")
    for r in results:
        w = r["new_call_first_frame_ms"]
        print(f"  {r['mode']:5} {r['ticks']:>6} {r['skipped_ticks']:>8} {r['live_lateness_max_ms']:>8} ms "
              f"{r['live_lateness_p99_ms']:>7} ms {w['median']:>7}/{w['max']} ms")  # fmt: skip
        if r["failed"]:
            print(f"        failures: {r['failed'][:3]}")
    ok = [r for r in results if r["mode"] == "new"]
    if ok:
        r = ok[0]
        verdict = r["skipped_ticks"] == 0 and r["live_lateness_max_ms"] < 40
        print(f"  goal (no skipped tick, live lateness < 40 ms): {'met' if verdict else 'NOT met'} in mode new")
    out = {"config": {**vars(args), "dim": cfg.dim, "layers": cfg.num_layers}, "alone": base, "results": results}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
