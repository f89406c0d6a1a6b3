"""Campaigns on a real `duetaspan serve --sip` process (the contract), SIPp as the callees, the CLI as users run
it: `duetaspan campaign start contacts.csv --server URL --name N`, `status`, `export -o FILE.csv`, and the
progress bar; `GET /admin/calls` reading the call index (an old record folder indexed once at start);
per-campaign counters in `/metrics`; and crash safety: the server is killed with SIGKILL while two campaign
calls are up, restarted on the same store, and the campaign resumes: the two open attempts are finished as
`interrupted` and retried, no number is dialled beyond its policy or twice at once, and every INVITE SIPp got
has its attempt row (none lost). On both stores (a SQLite file, a database on a real PostgreSQL server). The
server's clock is moved through `$DUETASPAN_TEST_CLOCK_FILE`. The callee holds only the two calls the kill cuts
(callee_holds_first.xml); every other call is short, so the test waits on events, not on long calls."""

from __future__ import annotations

import asyncio
import csv
import datetime as dt
import itertools
import json
import os
import signal
import subprocess
import sys
import time

import aiohttp
import pytest

from tests.adapters.sip.peer import (
    free_udp_port,
    needs_sipp,
    run_sipp,
    scenario,
    sip_e2e,
    udp_bound,
    wait_for,
)
from tests.support import REPO_ROOT, free_port, stop_process, wait_until_healthy

pytestmark = [needs_sipp, sip_e2e, pytest.mark.slow, pytest.mark.timeout(600)]

CLI = [sys.executable, "-m", "duetaspan"]
ADMIN = "campaign-admin-token-0123456789"
MONDAY_NOON_UTC = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.UTC).timestamp()
AGENT_TOML = """
[store]
server_id = "node-1"
[campaign]
max_concurrent = 2
calls_per_minute = 600
reserve_inbound = 0
max_attempts = 2
poll_s = 0.2
lease_s = 30
ring_timeout_s = 5
[campaign.retry]
failed = {delay_s = 0.5}
"""


def _env(tmp_path) -> dict[str, str]:
    """The environment of `serve` and the CLI (`$DUETASPAN_STORE_URL`: the test's own store, SQLite or PostgreSQL)."""
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "DUETASPAN_ADMIN_TOKEN": ADMIN,
            "DUETASPAN_TEST_CLOCK_FILE": str(tmp_path / "clock")}


def _serve(tmp_path, port: int, sip_port: int, name: str, *, config: str = "agent.toml",
           record_dir: str = "calls") -> tuple[subprocess.Popen, object]:
    cmd = [*CLI, "-v", "serve", "--sip", "--sip-port", str(sip_port), "--host", "127.0.0.1", "--port", str(port),
           "--model", "tiny-random", "--no-retrieval", "--record-dir", str(tmp_path / record_dir),
           "--max-calls", "3", "--config", str(tmp_path / config)]
    log = (tmp_path / f"{name}.log").open("wb")
    return subprocess.Popen(cmd, env=_env(tmp_path), stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path), log


async def _cli(tmp_path, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(*CLI, "campaign", *args, env=_env(tmp_path), cwd=tmp_path,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 180)
    return proc.returncode or 0, out.decode(), err.decode()


async def _get(base: str, path: str):
    async with aiohttp.ClientSession() as client:
        async with client.get(base + path, headers={"Authorization": f"Bearer {ADMIN}"}) as r:
            assert r.status == 200, await r.text()
            return await r.json() if r.content_type == "application/json" else await r.text()


async def _poll(base: str, name: str, pred, timeout_s: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        status = await _get(base, f"/admin/campaigns/{name}")
        if pred(status):
            return status
        assert time.monotonic() < deadline, f"timed out: {status}"
        await asyncio.sleep(0.2)


async def _attempts(name: str) -> list[dict]:
    """The campaign's attempts, read from the store itself."""
    from duetaspan.store import open_store

    store = await open_store(os.environ["DUETASPAN_STORE_URL"])
    try:
        async with store.transaction() as tx:
            camp = await tx.campaign(name)
            return await tx.attempts(camp.id)
    finally:
        await store.close()


async def test_campaign_survives_kill_9_and_the_cli_contract(tmp_path, store_target, monkeypatch):
    monkeypatch.setenv("DUETASPAN_STORE_URL", store_target)  # both `serve` processes, the CLI and `_attempts`
    (tmp_path / "agent.toml").write_text(AGENT_TOML)
    (tmp_path / "clock").write_text(str(MONDAY_NOON_UTC - time.time()))  # Monday 12:00 UTC: London is open
    calls = tmp_path / "calls"
    calls.mkdir()
    old = {"call_id": "old-call-1", "meta": {"transport": "twilio", "caller": "+15550009999"}, "frames": [],
           "started_at": 1000.0, "ended_at": 1010.0, "complete": True, "summary": {}, "spans": []}
    (calls / "old-call-1.json").write_text(json.dumps(old))  # written before the store existed
    uas_port = free_udp_port()
    numbers = [f"sip:+4420794607{i:02d}@127.0.0.1:{uas_port}" for i in range(6)]
    (tmp_path / "contacts.csv").write_text("to,name\n" + "".join(f"{n},Person {i}\n" for i, n in enumerate(numbers)))
    # 6 numbers + the 2 retried after the kill: 8 INVITEs; the 2 calls cut by the kill fail on SIPp's side
    # the first two calls (cut by the kill) are held 6 s, long enough to be seen up at once; the rest talk 0.3 s
    holds = scenario("callee_holds_first", tmp_path, HOLD_CALLS=2, HOLD_MS=6000, TALK_MS=300)
    sipp = asyncio.create_task(run_sipp("", tmp_path, "-sf", str(holds), "-m", "8", "-rtp_echo",
                                        "-max_retrans", "2", port=uas_port, timeout_s=240, name="uas"))
    await udp_bound(uas_port)
    port, sip_port = free_port(), free_udp_port()
    base = f"http://127.0.0.1:{port}"
    proc, log = _serve(tmp_path, port, sip_port, "serve1")
    try:
        await wait_until_healthy(base, proc, tmp_path / "serve1.log")
        listed = await _get(base, "/admin/calls")
        assert [c["id"] for c in listed["calls"]] == ["old-call-1"]  # the old folder, indexed at start
        rc, out, err = await _cli(tmp_path, "start", "contacts.csv", "--server", base, "--name", "crash", "--detach")
        assert rc == 0, err
        assert "campaign crash started: 6 numbers" in out
        # both calls up at once (records opened, not closed; max_concurrent 2: nothing else claimed): kill -9
        live = lambda: {p.stem for p in calls.glob("*.jsonl")} - {p.stem for p in calls.glob("*.json")}  # noqa: E731
        await wait_for(lambda: len(live()) >= 2, timeout_s=120, what="two answered calls up at once")
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        log.close()
        proc, log = _serve(tmp_path, port, sip_port, "serve2")
        await wait_until_healthy(base, proc, tmp_path / "serve2.log")
        status = await _poll(base, "crash", lambda s: s["state"] == "done", timeout_s=180)
        got = await asyncio.wait_for(sipp, 120)
        tries = await _attempts("crash")
        assert got.count("Successful call") + got.count("Failed call") == 8, (tries, got.screen[-2000:])
        assert status["attempts"] == 8 and status["counts"] == {"answered": 6}, tries
        # what users do next, four independent sequences of commands at once (each waits on its own answers)

        async def report() -> None:  # the finished campaign: status, export, the call index, the counters
            (rc, out, err), (rc2, _, err2) = await asyncio.gather(
                _cli(tmp_path, "status", "crash", "--server", base),
                _cli(tmp_path, "export", "crash", "--server", base, "-o", "crash.csv"))  # fmt: skip
            assert rc == 0 and "crash: done, 6/6 done (answered 6)" in out, out + err
            assert rc2 == 0, err2
            rows = list(csv.DictReader((tmp_path / "crash.csv").open()))
            assert [list(r) for r in rows[:1]] == [["to", "attempts", "outcome", "last_attempt_at"]]
            assert sorted(r["to"] for r in rows) == sorted(numbers) and {r["outcome"] for r in rows} == {"answered"}
            assert sorted(int(r["attempts"]) for r in rows) == [1, 1, 1, 1, 2, 2]  # the 2 cut calls: once more
            assert all(r["last_attempt_at"].startswith("2026-03-02T12:") for r in rows)  # the server's moved clock
            indexed = await _get(base, "/admin/calls?campaign=crash&outcome=answered")
            assert len(indexed["calls"]) >= 6 and all(c["transport"] == "sip" for c in indexed["calls"])
            metrics = await _get(base, "/metrics")
            assert 'duetaspan_campaign_attempts_total{campaign="crash",outcome="answered"} 6.0' in metrics

        async def progress_bar() -> None:  # a second, small campaign with the live bar (no --detach)
            (tmp_path / "two.csv").write_text("to\n" + "".join(f"{n}\n" for n in numbers[:2]))
            answers = scenario("callee_holds_first", tmp_path, HOLD_CALLS=0, HOLD_MS=0, TALK_MS=300)
            uas2 = asyncio.create_task(run_sipp("", tmp_path, "-sf", str(answers), "-m", "2",
                                                "-rtp_echo", port=uas_port, timeout_s=120, name="uas2"))
            await udp_bound(uas_port)
            rc, out, err = await _cli(tmp_path, "start", "two.csv", "--server", base, "--name", "bar", "--poll", "0.3")
            assert rc == 0, err
            assert "2/2" in err and "answered=2" in err  # tqdm's bar with the outcome counts
            assert "bar: done, 2/2 done (answered 2)" in out
            assert (await asyncio.wait_for(uas2, 60)).count("Successful call") == 2

        async def controls() -> None:  # pause, resume, cancel a campaign waiting for its window (01:00 in Auckland)
            (tmp_path / "nz.csv").write_text(f"to,timezone\n{numbers[0]},Pacific/Auckland\n")
            assert (await _cli(tmp_path, "start", "nz.csv", "--server", base, "--name", "nz", "--detach"))[0] == 0
            for action, state in (("pause", "paused"), ("resume", "running"), ("cancel", "cancelled")):
                rc, out, err = await _cli(tmp_path, action, "nz", "--server", base)
                assert rc == 0 and out.startswith(f"nz: {state}, 0/1 done"), out + err  # nothing was dialled

        async def do_not_call() -> None:  # the do-not-call list from the command line; an unknown campaign
            (tmp_path / "dnc.csv").write_text("to\n+15550000001\nsip:+15550000002@pbx.example\n")
            rc, out, err = await _cli(tmp_path, "dnc", "import", "dnc.csv", "--server", base)
            assert rc == 0 and "2 added" in out, out + err
            assert (await _cli(tmp_path, "dnc", "add", "+1 555 000 0003", "--server", base))[1].startswith(
                "do-not-call: 1 added")
            assert "1 removed" in (await _cli(tmp_path, "dnc", "remove", "+15550000001", "--server", base))[1]
            listed = await _get(base, "/admin/dnc")
            assert [n["number"] for n in listed["numbers"]] == ["+15550000002", "+15550000003"]
            rc, out, err = await _cli(tmp_path, "status", "nope", "--server", base)
            assert rc == 1 and "HTTP 404" in err and "no campaign 'nope'" in err

        await asyncio.gather(report(), progress_bar(), controls(), do_not_call())
    finally:
        if not sipp.done():
            sipp.cancel()
        stop_process(proc)
        log.close()
    # the attempts, read from the store itself: the two cut ones are `interrupted`, each retried once, and no
    # two attempts of a number overlap in time
    attempts = await _attempts("crash")
    assert sorted(a["outcome"] for a in attempts) == ["answered"] * 6 + ["interrupted"] * 2
    by_number: dict[str, list] = {}
    for a in attempts:
        by_number.setdefault(a["to_number"], []).append(a)
    for tries in by_number.values():
        tries.sort(key=lambda a: a["started_at"])
        for first, second in itertools.pairwise(tries):
            assert first["ended_at"] <= second["started_at"]
        assert [a["outcome"] for a in tries] in (["answered"], ["interrupted", "answered"])
