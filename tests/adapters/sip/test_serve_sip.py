"""`duetaspan serve --sip` as a real process (the contract): SIPp's SipStone `uac` scenario places N calls,
all successful, each with a record on disk (`transport: "sip"`) and counted in `/metrics`
(`transport="sip"`); with `--max-calls` below the calls offered, the rest get 486 Busy Here and are counted
as refused; `--sip-allow` without loopback refuses us (403); the digest password stays out of the log; and
a bad flag fails before the model loads."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time

import aiohttp
import pytest

from tests.adapters.sip.peer import free_udp_port, needs_sipp, run_sipp, scenario, sip_e2e, wait_for
from tests.support import REPO_ROOT, free_port, stop_process, wait_until_healthy, worker_sip_toml

pytestmark = [needs_sipp, sip_e2e, pytest.mark.slow]

CLI = [sys.executable, "-m", "duetaspan"]
PASSWORD = "pw-never-logged-42"


def _spawn(cmd: list[str], folder, env: dict[str, str] | None) -> tuple[subprocess.Popen, object]:
    full_env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
    log = (folder / "serve.log").open("wb")
    return subprocess.Popen(cmd, env=full_env, stdout=log, stderr=subprocess.STDOUT, cwd=folder), log


@contextlib.asynccontextmanager
async def serve_sip(tmp_path, *extra: str, env: dict[str, str] | None = None):
    port, sip_port = free_port(), free_udp_port()
    if "--config" not in extra:  # this xdist worker's RTP block (tests.support)
        (tmp_path / "sip.toml").write_text("[sip]\n" + worker_sip_toml())
        extra = (*extra, "--config", str(tmp_path / "sip.toml"))
    cmd = [
        *CLI, "-v", "serve", "--sip", "--sip-port", str(sip_port), "--host", "127.0.0.1", "--port", str(port),
        "--model", "tiny-random", "--no-retrieval", "--record-dir", str(tmp_path / "calls"), *extra,
    ]  # fmt: skip
    proc, log = _spawn(cmd, tmp_path, env)
    base = f"http://127.0.0.1:{port}"
    try:
        await wait_until_healthy(base, proc, tmp_path / "serve.log", what="serve --sip")
        yield base, sip_port, proc
    finally:
        stop_process(proc)
        log.close()


async def _json(client: aiohttp.ClientSession, url: str) -> dict:
    async with client.get(url) as r:
        return await r.json()


async def _text(client: aiohttp.ClientSession, url: str) -> str:
    async with client.get(url) as r:
        return await r.text()


def _metric(text: str, line_start: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.serial  # back-to-back calls on 3 slots: a slot must be free again before SIPp's next INVITE
async def test_serve_sip_answers_sipstone_uac_calls(tmp_path):
    async with serve_sip(tmp_path, "--max-calls", "3") as (base, sip_port, proc):
        got = await run_sipp(
            f"127.0.0.1:{sip_port}", tmp_path, "-sn", "uac", "-m", "4", "-l", "2", "-d", "1500"
        )
        assert got.rc == 0, got.output + got.errors
        assert got.count("Successful call") == 4 and got.count("Failed call") == 0
        calls = tmp_path / "calls"
        await wait_for(lambda: len(list(calls.glob("*.json"))) == 4, timeout_s=60, what="four records")
        async with aiohttp.ClientSession() as client:
            # the record, the counter and the slot's release each come as the session closes: wait for all of
            # them (generously: a busy machine; the slot came after the records once), then assert each
            deadline = time.monotonic() + 60.0
            while True:
                metrics = await _text(client, base + "/metrics")
                health = await _json(client, base + "/health")
                done = _metric(metrics, 'duetaspan_calls_total{outcome="completed",transport="sip"}') >= 4
                if (done and health["transports"]["sip"]["free_slots"] == 3) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
        assert proc.poll() is None
    assert health["transports"]["sip"]["free_slots"] == 3
    for path in calls.glob("*.json"):
        record = json.loads(path.read_text())
        assert record["complete"] is True and record["meta"]["transport"] == "sip"
    assert _metric(metrics, 'duetaspan_calls_total{outcome="completed",transport="sip"}') == 4


async def test_serve_sip_refuses_past_max_calls_with_486(tmp_path):
    async with serve_sip(tmp_path, "--max-calls", "1") as (base, sip_port, _proc):
        holder = run_sipp(
            f"127.0.0.1:{sip_port}", tmp_path, "-sn", "uac", "-m", "1", "-d", "8000", name="holder"
        )
        first = asyncio.create_task(holder)
        async with aiohttp.ClientSession() as client:

            async def busy() -> bool:
                return (await _json(client, base + "/health"))["transports"]["sip"]["free_slots"] == 0

            for _ in range(200):
                if await busy():
                    break
                await asyncio.sleep(0.1)
            got = await run_sipp(f"127.0.0.1:{sip_port}", tmp_path, "-sf",
                                 str(scenario("busy", tmp_path, USER="agent")), "-m", "3")  # fmt: skip
            assert got.rc == 0, got.output + got.errors  # every one answered 486 Busy Here
            assert (await first).rc == 0
            completed = 'duetaspan_calls_total{outcome="completed",transport="sip"}'
            for _ in range(300):  # the holder's session finishes its record just after its BYE
                metrics = await _text(client, base + "/metrics")
                if _metric(metrics, completed) >= 1:
                    break
                await asyncio.sleep(0.1)
    assert _metric(metrics, 'duetaspan_sip_refused_total{reason="busy"}') == 3
    assert _metric(metrics, 'duetaspan_calls_total{outcome="refused",transport="sip"}') == 3
    assert _metric(metrics, completed) == 1


async def test_serve_sip_allow_list_and_secret_stay_out_of_the_log(tmp_path):
    config = tmp_path / "agent.toml"
    config.write_text('[sip]\nauth_user = "trunk"\nrefuse = "403"\n' + worker_sip_toml())
    env = {"DUETASPAN_SIP_AUTH_PASSWORD": PASSWORD}
    async with serve_sip(tmp_path, "--sip-allow", "10.0.0.0/8", "--config", str(config), env=env) as (
        base,
        sip_port,
        _proc,
    ):
        refused = await run_sipp(f"127.0.0.1:{sip_port}", tmp_path, "-sf",
                                 str(scenario("digest_refused", tmp_path, USER="agent")), "-m", "1",
                                 "-au", "trunk", "-ap", "wrong", name="wrong")  # fmt: skip
        ok = await run_sipp(f"127.0.0.1:{sip_port}", tmp_path, "-sf", str(scenario("digest", tmp_path, USER="agent")),
                            "-m", "1", "-au", "trunk", "-ap", PASSWORD, name="right")  # fmt: skip
        async with aiohttp.ClientSession() as client:
            metrics = await _text(client, base + "/metrics")
    assert refused.rc == 0, refused.output + refused.errors
    assert ok.rc == 0, ok.output + ok.errors
    assert _metric(metrics, 'duetaspan_sip_refused_total{reason="forbidden"}') == 1
    log = (tmp_path / "serve.log").read_text()
    assert PASSWORD not in log
    assert "10.0.0.0/8" in log and "trunk" in log  # the ready line says who may call


def test_serve_sip_flag_errors_fail_fast(tmp_path):
    bad = subprocess.run([*CLI, "serve", "--sip", "--sip-allow", "not-a-net", "--model", "tiny-random"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert bad.returncode != 0 and "not-a-net" in bad.stderr and "CIDR" in bad.stderr
    config = tmp_path / "agent.toml"
    config.write_text('[sip]\nauth_user = "trunk"\n')
    env = {k: v for k, v in os.environ.items() if k != "DUETASPAN_SIP_AUTH_PASSWORD"}
    nopw = subprocess.run([*CLI, "serve", "--sip", "--config", str(config), "--model", "tiny-random"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)  # fmt: skip
    assert nopw.returncode != 0 and "DUETASPAN_SIP_AUTH_PASSWORD" in nopw.stderr
    orphan = subprocess.run([*CLI, "serve", "--webrtc", "--sip-port", "5070", "--model", "tiny-random"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert orphan.returncode != 0 and "need --sip" in orphan.stderr
    config.write_text('[sip]\nsrtp = "required"\n')  # SDES keys over UDP signalling: said, not started
    keys = subprocess.run([*CLI, "serve", "--sip", "--config", str(config), "--model", "tiny-random"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert keys.returncode != 0 and "srtp_plain_signalling" in keys.stderr and "tls" in keys.stderr


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status").read().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to count sockets")
@pytest.mark.serial  # twenty INVITEs in a second answered within SIP's retransmit timer: CPU quiet
async def test_twenty_concurrent_calls_past_max_calls_leak_nothing(tmp_path):
    async with serve_sip(tmp_path, "--max-calls", "4") as (base, sip_port, proc):
        warm = await run_sipp(
            f"127.0.0.1:{sip_port}", tmp_path, "-sn", "uac", "-m", "2", "-d", "500", name="warm"
        )
        assert warm.rc == 0, warm.output
        async with aiohttp.ClientSession() as client:
            completed = 'duetaspan_calls_total{outcome="completed",transport="sip"}'

            async def settled(calls: int) -> tuple[str, dict]:
                """/metrics and /health once `calls` have completed and every slot is free again: the counter
                and the slot's release each come as a session closes, in either order (generous: a busy box)."""
                deadline = time.monotonic() + 60.0
                while True:
                    metrics, health = await _text(client, base + "/metrics"), await _json(client, base + "/health")
                    done = _metric(metrics, completed) >= calls and health["transports"]["sip"]["free_slots"] == 4
                    if done or time.monotonic() > deadline:
                        return metrics, health
                    await asyncio.sleep(0.1)

            await settled(2)  # a warm-up call's slot still held would refuse a fifth of the load's calls
            fds, rss = _fds(proc.pid), _rss_mb(proc.pid)
            got = await run_sipp(f"127.0.0.1:{sip_port}", tmp_path, "-sn", "uac", "-m", "20", "-l", "20",
                                 "-r", "20", "-d", "4000", name="load")  # fmt: skip
            metrics, health = await settled(6)
            after_fds, after_rss = _fds(proc.pid), _rss_mb(proc.pid)
    assert got.count("Successful call") == 4 and got.count("Failed call") == 16, got.screen[-2000:]
    assert _metric(metrics, 'duetaspan_sip_refused_total{reason="busy"}') == 16
    assert _metric(metrics, 'duetaspan_calls_total{outcome="refused",transport="sip"}') == 16
    assert _metric(metrics, completed) == 6
    assert health["transports"]["sip"]["free_slots"] == 4  # every slot back
    assert after_fds <= fds + 2, (fds, after_fds)  # no RTP/RTCP socket left open
    assert after_rss - rss < 150, (rss, after_rss)  # MB; a leak of 20 calls' pipelines would show
