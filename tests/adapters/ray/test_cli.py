"""`duetaspan serve --twilio --ray` as a real subprocess, as docs/SCALING.md runs it: it starts a local Ray
cluster, deploys on Serve's proxy at the `[server]` port of its agent.toml, answers the signed webhook for the
file's `[twilio] public_url`, lists its replica's `/metrics` address for Prometheus' HTTP service discovery
(docs/operations.md) behind the metrics token, and Ctrl-C deletes the application and shuts the cluster down
(exit 130)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import aiohttp
import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'duetaspan[ray]')")

from prometheus_client.parser import text_string_to_metric_families

from tests.adapters.twilio.peer import ACCOUNT_SID, AUTH_TOKEN, PUBLIC_URL, TwilioPeer
from tests.support import REPO_ROOT, free_port

pytestmark = pytest.mark.slow
METRICS_TOKEN = "ray-scrape-token"


def _child_setup() -> None:
    # Own process group (so a failed test can end the cluster it started) and the default Ctrl-C, even when
    # the test runner itself runs with SIGINT ignored (a background job).
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _spawn(cmd: list[str], folder, env: dict[str, str]) -> tuple[subprocess.Popen, object]:
    log = (folder / "serve.log").open("wb")
    proc = subprocess.Popen(
        cmd, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_child_setup
    )
    return proc, log


async def test_serve_ray_cli_deploys_answers_and_stops_on_ctrl_c(tmp_path):
    port = free_port()
    (tmp_path / "agent.toml").write_text(
        f'[persona]\nprompt = "You answer the phone for a test."\n'
        f'[twilio]\npublic_url = "{PUBLIC_URL}"\n[server]\nhost = "127.0.0.1"\nport = {port}\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TWILIO_", "OPENAI_", "RAY_"))}
    env |= {
        "TWILIO_ACCOUNT_SID": ACCOUNT_SID,
        "TWILIO_AUTH_TOKEN": AUTH_TOKEN,
        "TWILIO_API_BASE_URL": "http://127.0.0.1:9",
        "PYTHONPATH": str(REPO_ROOT),
        "NO_TORCH_COMPILE": "1",
        "NO_CUDA_GRAPH": "1",
        "OMP_NUM_THREADS": "1",
        "DUETASPAN_METRICS_TOKEN": METRICS_TOKEN,
    }
    cmd = [
        sys.executable, "-m", "duetaspan", "serve", "--twilio", "--ray", "--config", "agent.toml",
        "--model", "tiny-random", "--device", "cpu", "--no-retrieval", "--max-calls", "1",
        "--min-replicas", "1", "--cpus-per-replica", "0.5",
    ]  # fmt: skip
    proc, log = _spawn(cmd, tmp_path, env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 150
        async with aiohttp.ClientSession() as http:
            while True:
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "serve --ray never became ready"
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(base + "/health") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.5)
        peer = TwilioPeer(base)  # signed over the file's public URL
        status, twiml = await peer.voice("CA-ray-cli")
        assert status == 200 and re.search(r'url="wss://agent\.example\.test/twilio/stream/[^"]+"', twiml)
        assert (await peer.voice("CA-forged", signature="forged"))[0] == 403
        ingress, replica = await _scrape_ray(base)
        # /health answers a moment before the command prints its ready line: wait for it before Ctrl-C
        for _ in range(100):
            if "ready: " in (tmp_path / "serve.log").read_text():
                break
            await asyncio.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        rc = await asyncio.to_thread(proc.wait, 90)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of its cluster is left
        log.close()
    text = (tmp_path / "serve.log").read_text()
    assert rc == 130, text[-3000:]  # Ctrl-C: the CLI's usual status, no traceback
    assert f"ready: {PUBLIC_URL}/twilio/voice" in text
    assert "deleting the application" in text and "Traceback" not in text
    assert ingress[("duetaspan_webhook_refusals_total", (("reason", "signature_invalid"),))] == 1
    assert ("duetaspan_engine_free_slots", ()) not in ingress  # the engines are in the replicas
    assert replica[("duetaspan_engine_free_slots", ())] == 1
    assert ("duetaspan_engine_tick_seconds_count", ()) in replica


async def _scrape_ray(base: str) -> tuple[dict, dict]:
    """The ingress's figures and those of the replica `/ray/metrics/targets` lists, token checked."""
    auth = {"Authorization": f"Bearer {METRICS_TOKEN}"}
    async with aiohttp.ClientSession() as http:
        async with http.get(base + "/ray/metrics/targets") as resp:
            assert resp.status == 401
        deadline = time.monotonic() + 60
        while True:  # the replica announces itself once it is up
            async with http.get(base + "/ray/metrics/targets", headers=auth) as resp:
                assert resp.status == 200
                groups = await resp.json()
            if groups:
                break
            assert time.monotonic() < deadline, "no replica announced its /metrics"
            await asyncio.sleep(0.5)
        [group] = groups
        [target] = group["targets"]
        assert group["labels"]["replica"]
        async with http.get(f"http://{target}/metrics") as resp:
            assert resp.status == 401
        async with http.get(f"http://{target}/metrics", headers=auth) as resp:
            assert resp.status == 200
            replica = await resp.text()
        async with http.get(base + "/metrics", headers=auth) as resp:
            assert resp.status == 200
            ingress = await resp.text()
    return _samples(ingress), _samples(replica)


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
