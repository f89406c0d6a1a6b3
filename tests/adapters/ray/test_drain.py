"""Drain on a real local Ray cluster (CPU, tiny-random replicas) with the same rules as one process:

- `/metrics` (ingress and replicas) and `/ray/metrics/targets` need the metrics token, `POST /admin/drain` the
  admin token (401 without);
- a replica told to drain (its relay endpoint's `/admin/drain`, which the ingress's `POST /admin/drain` posts
  to every replica) gets no new calls: they go to the other replica; its `/health` says draining; its live
  call keeps getting the agent's audio and is ended at `drain_timeout_s` with a complete record,
  `ended_by: "shutdown"`;
- after `POST /admin/drain` on the ingress, `/health` is 503 and a caller ringing in gets the drain TwiML;
- when Ray Serve stops a replica (`serve delete`), the replica drains the same way before Serve's
  `graceful_shutdown_timeout_s` would kill it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from pydantic import SecretStr

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'duetaspan[ray]')")

from ray import serve

from duetaspan.adapters.ray.app import build_app
from duetaspan.adapters.ray.control import control_token
from tests.adapters.ray.test_cluster import _call, _config, _wait_ended, _wait_held, local_serve
from tests.adapters.twilio.peer import TwilioPeer

pytestmark = [pytest.mark.slow, pytest.mark.alone]  # a cluster of 3 CPUs with 2 replicas: see test_cluster.py

KEY = b"drain-test-key-0123456789abcdef!"
METRICS = "metrics-token-for-the-drain-test"
ADMIN = "admin-token-for-the-drain-test"
DRAIN_S = 8.0


def _drain_config(record_dir: Path, replicas: int) -> object:
    config = _config(min_replicas=replicas, max_replicas=replicas, drain_timeout_s=DRAIN_S)
    agent = config.agent.model_copy(update={"record_dir": str(record_dir)})
    secrets = {"metrics_token": SecretStr(METRICS), "admin_token": SecretStr(ADMIN)}
    return config.model_copy(update={"agent": agent, **secrets})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """A local Ray cluster with the agent on Serve (2 engine replicas x 2 slots, records in a folder)."""
    records = tmp_path_factory.mktemp("records")
    with local_serve(build_app(_drain_config(records, 2), key=KEY)) as url:
        yield url, records


async def _request(method: str, url: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http, http.request(method, url, headers=headers) as resp:
        return resp.status, await resp.text()


async def _until(check, what: str, timeout_s: float = 90.0):
    deadline = time.monotonic() + timeout_s
    while not (got := await check()):
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.2)
    return got


def _record(records: Path, sid: str) -> dict:
    found = sorted(records.rglob(f"{sid}.json"))
    assert found, f"no record of {sid} under {records}: {sorted(p.name for p in records.rglob('*'))}"
    return json.loads(found[0].read_text())


async def _complete(records: Path, sid: str) -> dict | None:
    """The call's record once it is complete (the session writes it as the call ends)."""
    with contextlib.suppress(AssertionError, ValueError):
        record = _record(records, sid)
        return record if record.get("complete") else None
    return None


async def _targets(base: str, count: int) -> dict[str, str]:
    """Replica name -> relay address, once `count` replicas announce themselves."""

    async def listed():
        status, body = await _request("GET", base + "/ray/metrics/targets", METRICS)
        groups = json.loads(body) if status == 200 else []
        return len(groups) == count and {g["labels"]["replica"]: g["targets"][0] for g in groups}

    return await _until(listed, f"{count} replicas never announced their relay endpoints")


async def test_metrics_and_drain_need_their_tokens_and_a_draining_replica_ends_its_calls(cluster):
    base, records = cluster
    peer = TwilioPeer(base)
    targets = await _targets(base, 2)
    for url in (
        base + "/metrics",
        base + "/ray/metrics/targets",
        f"http://{next(iter(targets.values()))}/metrics",
    ):
        assert (await _request("GET", url))[0] == 401, url
        assert (await _request("GET", url, "wrong"))[0] == 401, url
        status, body = await _request("GET", url, METRICS)
        assert status == 200, (url, body)

    # a long call on one replica, then only that replica is told to drain
    live = asyncio.create_task(_call(peer, "CA-live", media=200, until=asyncio.Event()))  # never set
    state = await _wait_held(base, ["CA-live"])
    victim = state["held"]["CA-live"]["replica"]
    other = next(name for name in targets if name != victim)
    drain_url = f"http://{targets[victim]}/admin/drain"
    assert (await _request("POST", drain_url))[0] == 401
    assert (await _request("POST", drain_url, ADMIN))[0] == 401  # only the deployment's own token
    await asyncio.sleep(2.0)  # the agent talks before the drain
    status, body = await _request("POST", drain_url, control_token(KEY))
    assert status == 202 and json.loads(body)["live_calls"] == 1, body
    drained_at = time.monotonic()
    status, body = await _request("GET", f"http://{targets[victim]}/health")
    assert status == 503 and json.loads(body)["status"] == "draining", body
    assert (
        "duetaspan_draining 1.0" in (await _request("GET", f"http://{targets[victim]}/metrics", METRICS))[1]
    )
    assert (await _request("GET", f"http://{targets[other]}/health"))[0] == 200

    # the live call goes on until the drain timeout, then the replica ends it as a hang-up does
    got = await asyncio.wait_for(live, 120)
    ended_at = got.times[-1] if got.times else time.monotonic()
    after = [t for t in got.media_times() if t > drained_at + 1.0]
    assert len(after) > 4 * 10, (len(after), len(got.media_times()))  # the agent kept talking after the drain
    assert ended_at - drained_at >= DRAIN_S - 1.0, ended_at - drained_at
    assert got.close_code == 1000, got.close_code
    record = await _until(lambda: _complete(records, "CA-live"), "no complete record of the drained call", 30)
    assert record["summary"]["ended_by"] == "shutdown", record["summary"]

    # new calls are not routed to the draining replica, idle as it is (Serve's own choice would be the
    # shorter queue: it), while the other replica holds a call
    release = asyncio.Event()
    keep = asyncio.create_task(_call(peer, "CA-keep", media=50, until=release))
    state = await _wait_held(base, ["CA-keep"])
    assert state["held"]["CA-keep"]["replica"] == other, state
    for i in range(3):
        sid = f"CA-new-{i}"
        assert (await _call(peer, sid, media=25)).close_code == 1000
        state = await _wait_ended(base, [sid])
        assert state["ended"][sid]["replica"] == other, state
    release.set()
    assert (await keep).close_code == 1000
    stats = json.loads((await _request("GET", f"http://{targets[victim]}/stats"))[1])
    assert stats["draining"] and stats["refused_draining"] == 0, stats  # never even asked

    # the whole deployment: the admin token, then no new calls at the ingress
    assert (await _request("POST", base + "/admin/drain"))[0] == 401
    assert (await _request("POST", base + "/admin/drain", METRICS))[0] == 401
    status, body = await _request("POST", base + "/admin/drain", ADMIN)
    assert status == 202 and json.loads(body)["draining"], body
    status, body = await _request("GET", base + "/health")
    assert status == 503 and json.loads(body)["status"] == "draining", body
    assert "duetaspan_draining 1.0" in (await _request("GET", base + "/metrics", METRICS))[1]
    status, body = await peer.voice("CA-after-drain")
    assert status == 200 and "<Reject" in body and "<Stream" not in body, body

    async def other_draining():
        status, body = await _request("GET", f"http://{targets[other]}/health")
        return status == 503 and json.loads(body)["status"] == "draining"

    await _until(other_draining, "the ingress's drain never reached the other replica", timeout_s=30)


async def test_a_replica_ray_serve_stops_drains_and_ends_its_calls_at_the_timeout(cluster):
    """`serve delete` stops the replicas: the live call keeps its audio, is ended at the drain timeout with a
    `shutdown` record, and the application goes away well before Serve's kill deadline."""
    base, records = cluster
    await asyncio.to_thread(serve.delete, "duetaspan")  # the drained deployment of the test above
    # no metrics token this time: /metrics is refused (403), not open, on a deployment that is no local demo
    config = _drain_config(records, 1).model_copy(update={"metrics_token": None})
    await asyncio.to_thread(serve.run, build_app(config, key=KEY), name="duetaspan", route_prefix="/")
    peer = TwilioPeer(base)
    live = asyncio.create_task(_call(peer, "CA-stopped", media=200, until=asyncio.Event()))
    await _wait_held(base, ["CA-stopped"])
    for token in (None, METRICS):
        status, body = await _request("GET", base + "/metrics", token)
        assert status == 403 and "DUETASPAN_METRICS_TOKEN" in body, (status, body)
    await asyncio.sleep(2.0)
    await asyncio.to_thread(serve.delete, "duetaspan", _blocking=False)
    deleted_at = time.monotonic()
    got = await asyncio.wait_for(live, 120)
    after = [t for t in got.media_times() if t > deleted_at + 2.0]
    assert len(after) > 4 * 10, (len(after), len(got.media_times()))
    assert got.times[-1] - deleted_at >= DRAIN_S - 1.0
    assert got.close_code == 1000, got.close_code

    record = await _until(
        lambda: _complete(records, "CA-stopped"), "no record of the call Serve's stop ended", 30
    )
    assert record["summary"]["ended_by"] == "shutdown", record["summary"]

    async def gone():
        return "duetaspan" not in (await asyncio.to_thread(serve.status)).applications

    await _until(gone, "the drained application never went away", timeout_s=60)
    # well before Serve's graceful_shutdown_timeout_s (drain + margin) would have killed the replica
    assert time.monotonic() - deleted_at < DRAIN_S + 25, time.monotonic() - deleted_at
