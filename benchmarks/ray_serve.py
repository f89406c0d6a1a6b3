"""What Ray Serve adds to a call: webhook placement latency through Serve's proxy, and the latency of the
agent's audio from the replica to Twilio (replica -> relay in the ingress -> Serve proxy -> caller), against
the same agent in one process.

Runs a local Ray cluster (CPU, tiny-random by default) with `--replicas` engine replicas, plays `--calls`
short recorded calls one after another through each deployment, and prints:
  - webhook round trip (POST /twilio/voice -> TwiML; Ray: includes placing the call on a replica), P50/P95;
  - stream upgrade time (signed WebSocket upgrade accepted; Ray: includes opening the replica's relay);
  - first agent media: time from the replica's pacer sending its first media message to the caller
    receiving it (both `time.monotonic()` on this machine), i.e. the transport hops alone, P50/P95.

Run:  python benchmarks/ray_serve.py [--calls 10] [--replicas 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("NO_TORCH_COMPILE", "1")
os.environ.setdefault("NO_CUDA_GRAPH", "1")

from tests.adapters.twilio.peer import (
    ACCOUNT_SID,
    AUTH_TOKEN,
    PUBLIC_URL,
    TwilioPeer,
    renumber,
    serve_agent_on_twilio,
)
from tests.support import free_port, load_twilio_stream

FIXTURE = "greeting"
ENV = {"NO_TORCH_COMPILE": "1", "NO_CUDA_GRAPH": "1", "OMP_NUM_THREADS": "1"}


def _pct(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=np.float64) * 1000.0
    return {"p50_ms": round(float(np.percentile(a, 50)), 2), "p95_ms": round(float(np.percentile(a, 95)), 2)}


async def _calls(
    peer: TwilioPeer, n: int, media: int, first_sent: Callable[[str], asyncio.Future]
) -> dict[str, dict]:
    messages = load_twilio_stream(FIXTURE)
    head = [m for m in messages if m["event"] in ("connected", "start")]
    audio = [m for m in messages if m["event"] == "media"][:media]
    webhook, upgrade, first_media = [], [], []
    for i in range(n):
        sid = f"CA-bench-{i}"
        msgs = renumber([*head, *audio, messages[-1]], sid)
        t0 = time.monotonic()
        url = await peer.stream_url(sid)
        t1 = time.monotonic()
        async with peer.open_stream(url) as ws:
            t2 = time.monotonic()
            got = await peer.play(ws, msgs, linger_s=0.2)
        sent_at = await first_sent(sid)
        webhook.append(t1 - t0)
        upgrade.append(t2 - t1)
        if sent_at is not None and got.media_times():
            first_media.append(got.media_times()[0] - sent_at)
    return {"webhook": _pct(webhook), "upgrade": _pct(upgrade), "first_media_hop": _pct(first_media)}


@contextlib.asynccontextmanager
async def _single_process() -> AsyncIterator[tuple[TwilioPeer, Callable]]:
    from duetaspan.agent import Agent

    agent = Agent(model="tiny-random", device="cpu", router=False, seed=0, max_calls=2)
    async with agent, serve_agent_on_twilio(agent) as (peer, service):

        async def first_sent(sid: str) -> float | None:
            for _ in range(100):
                if sid in service.finished:
                    return service.finished[sid].stats.first_media_out_at
                await asyncio.sleep(0.05)
            return None

        yield peer, first_sent


@contextlib.asynccontextmanager
async def _ray(replicas: int, cpus: int) -> AsyncIterator[tuple[TwilioPeer, Callable]]:
    import aiohttp
    import ray
    from ray import serve

    from duetaspan.adapters.ray.app import build_app
    from duetaspan.adapters.ray.config import AgentSpec, RayServeConfig, ReplicaOptions
    from duetaspan.adapters.twilio.rest import TwilioCredentials

    ray.init(num_cpus=cpus, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False,
             runtime_env={"env_vars": ENV})  # fmt: skip
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        config = RayServeConfig(
            public_url=PUBLIC_URL,
            credentials=TwilioCredentials(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN, api_base_url="http://127.0.0.1:9"),
            agent=AgentSpec(model="tiny-random", device="cpu", retrieval=False, seed=0),
            replica=ReplicaOptions(max_calls=2, num_gpus=0, num_cpus=0.5, min_replicas=replicas,
                                   max_replicas=replicas, env=ENV),
            ingress_num_cpus=0.25,
        calls_route=True,
        )  # fmt: skip
        await asyncio.to_thread(serve.run, build_app(config), name=config.app_name, route_prefix="/")
        base = f"http://127.0.0.1:{port}"

        async def first_sent(sid: str) -> float | None:
            async with aiohttp.ClientSession() as http:
                for _ in range(100):
                    async with http.get(base + "/ray/calls") as resp:
                        ended = (await resp.json())["ended"]
                    if sid in ended:
                        return ended[sid]["first_media_out_at"]
                    await asyncio.sleep(0.05)
            return None

        async with aiohttp.ClientSession() as http:
            for _ in range(300):
                async with http.get(base + "/health") as resp:
                    if resp.status == 200:
                        break
                await asyncio.sleep(0.2)
        yield TwilioPeer(base), first_sent
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--media", type=int, default=50, help="20 ms media messages per call")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--cpus", type=int, default=3, help="logical CPUs of the local Ray cluster")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    out: dict = {
        "machine": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "calls": args.calls,
    }
    async with _single_process() as (peer, first_sent):
        out["single_process"] = await _calls(peer, args.calls, args.media, first_sent)
    async with _ray(args.replicas, args.cpus) as (peer, first_sent):
        out["ray_serve"] = await _calls(peer, args.calls, args.media, first_sent)
    for mode in ("single_process", "ray_serve"):
        r = out[mode]
        print(
            f"{mode:15s} webhook P50 {r['webhook']['p50_ms']:7.1f} ms P95 {r['webhook']['p95_ms']:7.1f} | "
            f"upgrade P50 {r['upgrade']['p50_ms']:6.1f} ms | first media hop P50 {r['first_media_hop']['p50_ms']:6.2f}"
            f" ms P95 {r['first_media_hop']['p95_ms']:6.2f} ms"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
