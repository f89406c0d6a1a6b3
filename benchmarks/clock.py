"""The engine clock: tick lateness (jitter) and drift over N seconds, and caller-audio resampler latency.

    python benchmarks/clock.py --seconds 10 --slots 4 --step-ms 20
    python benchmarks/clock.py --seconds 10 --model tiny-random      # the real tiny engine instead

Prints: ticks run vs ticks expected from wall time (a drifting clock falls behind), lateness of each tick
against its absolute deadline (p50/p99/max), skipped ticks, and for each SOXR quality the delay a 20 ms
8 kHz chunk stream sees before it comes out at 24 kHz.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

from duetaspan.pipeline.resample import StreamResampler
from duetaspan.pipeline.runner import EngineRunner


class BusyEngine:
    """Spends `step_ms` of CPU per step (no model); enough to exercise the clock."""

    def __init__(self, max_slots: int, step_ms: float) -> None:
        self.max_slots = max_slots
        self.step_s = step_ms / 1000.0
        self._n = 0

    def open_slot(self, persona=None, sampling=None, seed=None) -> int:
        self._n += 1
        return self._n - 1

    def close_slot(self, slot: int) -> None:
        pass

    def inject(self, slot: int, reference: str) -> bool:
        return True

    def force_ret(self, slot: int) -> None:
        pass

    def step(self, pcm):
        end = time.perf_counter() + self.step_s
        while time.perf_counter() < end:
            pass
        return {
            s: type(
                "R", (), {"silent": True, "pcm": p, "text": "", "is_ret": False, "spans": [], "step_ms": 0}
            )()
            for s, p in pcm.items()
        }


async def clock(engine, slots: int, seconds: float) -> None:
    async with EngineRunner(engine) as runner:
        calls = [await runner.attach(f"call-{i}", lambda out: None) for i in range(slots)]
        for call in calls:  # keep every slot fed at real time from the loop, like a transport would
            call.push(np.zeros(1920, np.float32))
        started = time.perf_counter()
        ticks0 = runner.clock.ticks

        async def feed():
            k = 0
            while time.perf_counter() - started < seconds:
                k += 1
                await asyncio.sleep(max(0.0, started + k * 0.08 - time.perf_counter()))
                for call in calls:
                    call.push(np.zeros(1920, np.float32))

        await feed()
        elapsed = time.perf_counter() - started
        ticks = runner.clock.ticks - ticks0
        s = runner.clock.summary()
        concealed = sum(c.stats.concealed for c in calls)
        for call in calls:
            await call.close()
    expected = elapsed / 0.08
    print(f"clock: {slots} slot(s), {elapsed:.2f} s, step {runner.clock.last_step_ms:.1f} ms")
    print(
        f"  ticks {ticks} + skipped {s['skipped_ticks']} vs {expected:.1f} grid deadlines in wall time "
        f"(drift {ticks + s['skipped_ticks'] - expected:+.1f} ticks); ticks run {ticks}"
    )
    print(
        f"  lateness p50 {s['lateness_p50_ms']:.3f} ms  p99 {s['lateness_p99_ms']:.3f} ms  "
        f"max {s['lateness_max_ms']:.3f} ms  skipped {s['skipped_ticks']}  late {s['late_ticks']}  "
        f"concealed frames {concealed}"
    )


def resampler_delay() -> None:
    rng = np.random.default_rng(0)
    chunk = 160  # 20 ms at 8 kHz
    for quality in ("QQ", "LQ", "MQ", "HQ", "VHQ"):
        rs = StreamResampler(8000, 24000, quality)  # type: ignore[arg-type]
        got = 0
        first_out_ms = None
        cost = 0.0
        for i in range(200):
            t = time.perf_counter()
            out = rs.process(rng.standard_normal(chunk).astype(np.float32) * 0.1)
            cost += time.perf_counter() - t
            got += out.size
            if out.size and first_out_ms is None:
                first_out_ms = (i + 1) * 20.0
        fed_ms = 200 * 20.0
        held_ms = fed_ms - got / 24.0
        print(
            f"resample 8k->24k {quality:>3}: holds back {held_ms:5.1f} ms, first output after {first_out_ms} ms, "
            f"{cost / 200 * 1e6:.1f} us per 20 ms chunk"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--slots", type=int, default=1)
    ap.add_argument("--step-ms", type=float, default=20.0, help="CPU per step of the stand-in engine")
    ap.add_argument("--model", help="use a real engine preset (e.g. tiny-random) instead of the stand-in")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    if args.model:
        from duetaspan.model.engine import DuplexEngine

        engine = DuplexEngine.load(args.model, device=args.device, max_slots=args.slots, seed=0)
    else:
        engine = BusyEngine(args.slots, args.step_ms)
    asyncio.run(clock(engine, args.slots, args.seconds))
    resampler_delay()


if __name__ == "__main__":
    main()
