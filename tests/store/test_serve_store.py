"""Which store a real `duetaspan serve` process uses, and the call lists that read it. `[store] path` in
agent.toml (relative to the file) is the SQLite file the server creates and writes, `[store] url` the
PostgreSQL database it uses, and `$DUETASPAN_STORE_URL` wins over `[store] url` (docs/store.md): each time a
campaign started over the admin API and a call SIPp placed to the server are in that store and in no other
(no `data/duetaspan.sqlite3`, nothing in the database the variable overrode). And `GET /admin/calls` and the
call viewer's list (`GET /webrtc/calls`) read the store's call index, not the record folder: an old record
indexed at start and the served call (with its index fields) are listed, a record dropped into the folder
after the start's one-time index is not; and each listed call's viewer page opens, the SIP call's too (its
Call-ID `1-2345@127.0.0.1` is the index's id, its record file `1-2345_127.0.0.1.json`)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO
from urllib.parse import quote

import aiohttp
import pytest

from tests.adapters.sip.peer import free_udp_port, needs_sipp, run_sipp, sip_e2e
from tests.support import REPO_ROOT, free_port, stop_process, wait_until_healthy, worker_sip_toml

pytestmark = [needs_sipp, sip_e2e, pytest.mark.slow]

ADMIN = "store-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
MONDAY_NOON_UTC = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.UTC).timestamp()  # 01:00 in Auckland: not dialled
AUCKLAND = "to,timezone\nsip:+6493000000@127.0.0.1:9,Pacific/Auckland\n"
OLD = {"call_id": "old-call", "meta": {"transport": "twilio", "caller": "+15550009999"}, "frames": [],
       "started_at": 1000.0, "ended_at": 1010.0, "complete": True, "summary": {}, "spans": []}  # fmt: skip


async def _admin(client: aiohttp.ClientSession, method: str, url: str, body: dict | None = None) -> dict:
    async with client.request(method, url, json=body, headers=AUTH) as r:
        assert r.status in (200, 201), await r.text()
        return await r.json()


async def _stored(target: str) -> tuple[list[str], list[str]]:
    """(campaign names, indexed call ids) of the store at `target`, read as another process would."""
    from duetaspan.store import open_store

    store = await open_store(target)
    try:
        async with store.transaction() as tx:
            return [c.name for c in await tx.campaigns()], sorted(c.id for c in await tx.calls())
    finally:
        await store.close()


def _serve(tmp_path: Path, env: dict[str, str], port: int, sip_port: int) -> tuple[subprocess.Popen, IO]:
    """`serve --sip --webrtc` (the viewer's list comes with the WebRTC routes) on the test's `etc/agent.toml`,
    run from `tmp_path` (so a path relative to agent.toml is not one relative to the working directory)."""
    cmd = [sys.executable, "-m", "duetaspan", "-v", "serve", "--sip", "--webrtc", "--sip-port", str(sip_port),
           "--host", "127.0.0.1", "--port", str(port), "--model", "tiny-random", "--no-retrieval",
           "--record-dir", str(tmp_path / "calls"), "--max-calls", "1",
           "--config", str(tmp_path / "etc" / "agent.toml")]  # fmt: skip
    log = (tmp_path / "serve.log").open("wb")
    env = {**os.environ, **env}
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path), log


def _file_facts(record_path: str, target: str) -> tuple[bool, int | None]:
    """(the served call's record file exists, the SQLite store's file mode or None for PostgreSQL)."""
    mode = None if target.startswith("postgresql") else Path(target).stat().st_mode & 0o777
    return Path(record_path).is_file(), mode


@pytest.mark.parametrize("where", ["path", "url", "env_over_url"])
async def test_serve_uses_the_store_agent_toml_names_and_lists_calls_from_its_index(
    tmp_path, request, monkeypatch, where
):
    monkeypatch.delenv("DUETASPAN_STORE_URL", raising=False)  # not the autouse tmp store (tests/conftest.py)
    env: dict[str, str] = {}
    other = None  # the store the server must NOT use
    if where == "path":  # relative to agent.toml
        line, target = 'path = "state/agent.sqlite3"', str(tmp_path / "etc" / "state" / "agent.sqlite3")
    elif where == "url":
        target = request.getfixturevalue("pg_url")
        line = f'url = "{target}"'
    else:  # both: the variable wins
        other = request.getfixturevalue("pg_url")
        line, target = f'url = "{other}"', str(tmp_path / "env" / "from-env.sqlite3")
        env["DUETASPAN_STORE_URL"] = target
    toml = f'[server]\ndata_dir = "data"\n[store]\n{line}\n[sip]\n{worker_sip_toml()}'
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "agent.toml").write_text(toml)
    (tmp_path / "clock").write_text(str(MONDAY_NOON_UTC - time.time()))
    calls = tmp_path / "calls"
    calls.mkdir()
    (calls / "old-call.json").write_text(json.dumps(OLD))  # before the server: indexed once, at its start
    port, sip_port = free_port(), free_udp_port()
    base = f"http://127.0.0.1:{port}"
    env |= {"PYTHONPATH": str(REPO_ROOT), "DUETASPAN_ADMIN_TOKEN": ADMIN,
            "DUETASPAN_TEST_CLOCK_FILE": str(tmp_path / "clock")}  # fmt: skip
    proc, log = _serve(tmp_path, env, port, sip_port)
    try:
        await wait_until_healthy(base, proc, tmp_path / "serve.log")
        (calls / "late-call.json").write_text(json.dumps({**OLD, "call_id": "late-call"}))  # after the index
        got = await run_sipp(f"127.0.0.1:{sip_port}", tmp_path, "-sn", "uac", "-m", "1", "-d", "300")
        assert got.rc == 0 and got.count("Successful call") == 1, got.output + got.errors
        async with aiohttp.ClientSession() as client:
            await _admin(client, "POST", base + "/admin/campaigns", {"name": "where", "csv": AUCKLAND})
            # the served call's row is written at its start (not complete), then again at its end
            deadline = time.monotonic() + 60
            while True:
                admin = await _admin(client, "GET", base + "/admin/calls")
                if len(admin["calls"]) >= 2 and all(c["complete"] for c in admin["calls"]):
                    break
                assert time.monotonic() < deadline, f"the served call's end was never indexed: {admin}"
                await asyncio.sleep(0.1)
            viewer = await _admin(client, "GET", base + "/webrtc/calls?format=json")
            # each listed call's viewer page opens: a SIP Call-ID (`1-2345@127.0.0.1`) names its record file
            # `1-2345_127.0.0.1.json`
            for listed in viewer["calls"]:
                async with client.get(f"{base}/webrtc/calls/{quote(listed['call_id'])}", headers=AUTH) as r:
                    assert r.status == 200 and listed["call_id"] in await r.text(), (listed, r.status)
    finally:
        stop_process(proc)
        log.close()
    served = admin["calls"][0]  # newest first
    assert [c["id"] for c in admin["calls"]] == [served["id"], "old-call"]  # not late-call
    assert [c["call_id"] for c in viewer["calls"]] == [served["id"], "old-call"]
    assert served["transport"] == "sip" and served["direction"] == "inbound" and served["complete"] is True
    assert served["record_path"].startswith(f"{calls.resolve()}/") and served["record_path"].endswith(".json")
    assert served["duration_s"] > 0
    assert (calls / "late-call.json").is_file()  # on disk all along, never indexed
    # the data went to the store agent.toml (or the variable) names, and nowhere else
    assert await _stored(target) == (["where"], sorted([served["id"], "old-call"]))
    data = tmp_path / "etc" / "data"  # the server's data folder: made at start, its default store unused
    assert data.is_dir() and not (data / "duetaspan.sqlite3").exists()
    assert not (tmp_path / "state").exists()  # `[store] path` is not relative to the working directory
    assert _file_facts(served["record_path"], target) == (True, None if "://" in target else 0o600)
    if other is not None:
        assert await _stored(other) == ([], [])
