"""Router benchmark: the SDK's own overhead from `<ret>` to reference, and 100 concurrent retrievals.

Everything runs on loopback against the scripted servers of `tests/fakes` (the repository root must be on
`sys.path`, which running this file from the checkout does).

    python benchmarks/router.py [--n 300] [--concurrent 100]

Figures printed:
  overhead   `<ret>` -> `deliver` minus the LLM request time, the tool time and ASR: prompt building,
             parsing, policy, argument validation, rendering, events, task scheduling (target P99 <= 5 ms);
  capture    the cost of picking a cached final at `<ret>`, and of feeding one 80 ms frame (Silero VAD);
  concurrent N calls, each with its own RetrievalManager, all hitting `<ret>` at once.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from duetaspan.adapters.llm import ChatClient
from duetaspan.config import RetrievalConfig
from duetaspan.registry import CallContext, ToolRegistry, tool
from duetaspan.router import ContextDB, QuestionCapture, RetrievalManager, Router
from tests.support import REPO_ROOT, free_port, load_wav


@tool
def get_weather(city: str) -> dict:
    """Current weather in a city.

    Args:
        city: city name
    """
    return {"city": city, "temperature_c": 21.5, "sky": "clear"}


SCRIPT = {"default": {"tool_call": {"name": "get_weather", "arguments": {"city": "Sydney"}}}}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100.0 * (len(ordered) - 1)))]


def summary(name: str, values: list[float]) -> str:
    return (
        f"{name:<34} n={len(values):<5} p50={pct(values, 50):7.2f} ms  p90={pct(values, 90):7.2f} ms  "
        f"p99={pct(values, 99):7.2f} ms  max={max(values):7.2f} ms"
    )


class Call:
    """One simulated call: its own Context DB, manager and event log."""

    def __init__(self, router: Router, index: int):
        self.events: list = []
        self.delivered: list[str] = []
        self.db = ContextDB(ctx=CallContext(call_id=f"call{index}"))
        self.db.add_utterance("Hi, my name is Ada and I'm in Sydney.")
        self.manager = RetrievalManager(
            router=router,
            deliver=lambda reference, meta: self.delivered.append(reference),
            on_event=self.events.append,
            db=self.db,
            config=RetrievalConfig(deadline_s=10.0),
        )

    def overhead_ms(self) -> float | None:
        by_kind = {e.kind: e for e in self.events if e.kind in ("router", "tool", "delivered")}
        if "delivered" not in by_kind:
            return None
        llm = by_kind["router"].llm_ms
        tool_ms = by_kind["tool"].tool_ms if "tool" in by_kind else 0.0
        return by_kind["delivered"].total_ms - llm - tool_ms


async def sequential(url: str, n: int) -> None:
    router = Router(ToolRegistry([get_weather]), ChatClient(url, "fake", api_key="k"))
    overheads, totals = [], []
    for i in range(n + 20):
        call = Call(router, i)
        call.manager.on_ret(i, question="what's the weather like right now")
        await call.manager.wait()
        if i >= 20:  # warm-up: first connections, imports, caches
            overheads.append(call.overhead_ms())
            totals.append(call.events[-1].total_ms)
    await router.aclose()
    print(summary("sequential <ret>->deliver total", totals))
    print(summary("sequential SDK overhead", overheads))
    print(f"  overhead target P99 <= 5 ms: {'PASS' if pct(overheads, 99) <= 5.0 else 'FAIL'}")


async def concurrent(url: str, n: int) -> None:
    router = Router(ToolRegistry([get_weather]), ChatClient(url, "fake", api_key="k"))
    warm = Call(router, -1)
    warm.manager.on_ret(0, question="weather")
    await warm.manager.wait()
    calls = [Call(router, i) for i in range(n)]
    start = time.perf_counter()
    for i, call in enumerate(calls):
        call.manager.on_ret(i, question="what's the weather like right now")
    await asyncio.gather(*(c.manager.wait() for c in calls))
    wall = (time.perf_counter() - start) * 1000.0
    await router.aclose()
    delivered = sum(len(c.delivered) for c in calls)
    totals = [c.events[-1].total_ms for c in calls if c.delivered]
    overheads = [o for c in calls if (o := c.overhead_ms()) is not None]
    leaks = sum(
        1
        for c in calls
        for r in c.delivered
        if r != "(tool result) city: Sydney, temperature c: 21.5, sky: clear."
    )
    print(f"concurrent: {n} calls, delivered {delivered}/{n}, wrong references {leaks}, wall {wall:.1f} ms")
    print(summary(f"concurrent({n}) <ret>->deliver total", totals))
    print(summary(f"concurrent({n}) SDK overhead", overheads))


class InstantASR:
    async def transcribe(self, pcm: np.ndarray, sample_rate: int) -> str:
        return "what's the weather like in sydney right now"


async def capture_costs() -> None:
    pcm, rate = load_wav("weather_sydney")
    silence = np.zeros(rate, dtype=np.float32)
    audio = np.concatenate([silence, pcm, silence])
    capture = QuestionCapture(InstantASR())
    frame_ms = []
    for i in range(0, len(audio) - 1919, 1920):
        start = time.perf_counter()
        await capture.feed(audio[i : i + 1920], rate, i / rate)
        frame_ms.append((time.perf_counter() - start) * 1000.0)
    await asyncio.sleep(0.01)
    pick_ms = []
    for _ in range(200):
        start = time.perf_counter()
        question = await capture.question()
        pick_ms.append((time.perf_counter() - start) * 1000.0)
    assert question.how == "final"
    await capture.aclose()
    print(summary("capture: feed one 80 ms frame", frame_ms[5:]))
    print(summary("capture: cached final at <ret>", pick_ms))


async def run(url: str, args: argparse.Namespace) -> None:
    await wait_until_up(url)
    await sequential(url, args.n)
    await concurrent(url, args.concurrent)
    await capture_costs()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="sequential retrievals")
    parser.add_argument("--concurrent", type=int, default=100)
    args = parser.parse_args()
    gc.freeze()  # long-lived objects (modules, registry) out of the collector's way, as a server would
    # The scripted server runs in its own process so that its CPU time is not charged to the SDK's loop.
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "script.json"
        script.write_text(json.dumps(SCRIPT))
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "tests.fakes.llm_server", "--port", str(port), "--script", str(script)],
            cwd=REPO_ROOT,
        )
        try:
            asyncio.run(run(f"http://127.0.0.1:{port}", args))
        finally:
            server.terminate()
            server.wait(timeout=10)


async def wait_until_up(url: str) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        for _ in range(100):
            try:
                async with session.get(url + "/v1/models") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                await asyncio.sleep(0.1)
    raise RuntimeError(f"scripted LLM server at {url} did not start")


if __name__ == "__main__":
    import logging

    logging.disable(logging.INFO)
    main()
