"""Retention in a real `duetaspan serve` process, on both stores: started on a record folder with calls of
different ages and `[recording] retain_days` / `records_retain_days` in its agent.toml, its sweeper deletes
at once the audio past the first and the records, index rows and delivered events past the second, keeps
the rest, and says what it deleted in its log; a call served afterwards is recorded and indexed as usual."""

from __future__ import annotations

import asyncio
import time

import pytest

from duetaspan.store import open_store
from tests.adapters.twilio.peer import TwilioPeer, renumber
from tests.support import load_twilio_stream, wait_until_healthy
from tests.webhooks.test_retention import _call
from tests.webhooks.test_serve_webhooks import _serve

TOML = """
[persona]
prompt = "You answer the phone for a test."
[recording]
retain_days = 7
records_retain_days = 30
[server]
data_dir = "data"
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_serve_sweeps_by_its_retention_settings_at_start(tmp_path, backend, request):
    # the store the server will open: its default SQLite file in its data folder, or the PostgreSQL URL
    store_url = request.getfixturevalue("pg_url") if backend == "postgresql" else ""
    target = store_url or str(tmp_path / "data" / "duetaspan.sqlite3")
    folder = tmp_path / "calls"
    store = await open_store(target)
    try:  # three calls a server of earlier days recorded, indexed and sent
        await _call(store, folder, "OLD", "+14155550001", 40)
        await _call(store, folder, "MID", "+14155550002", 10)
        await _call(store, folder, "NEW", "+14155550003", 0.1)
    finally:
        await store.close()
    (tmp_path / "agent.toml").write_text(TOML)
    log = tmp_path / "serve.log"
    with _serve(tmp_path, store_url, retrieval=False) as (base, proc):
        await wait_until_healthy(base, proc, log, what="serve")
        deadline = time.monotonic() + 90
        while "retention sweep deleted" not in log.read_text(errors="replace"):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"no sweep in 90 s:\n{log.read_text()[-3000:]}"
            await asyncio.sleep(0.2)
        files = sorted(p.name for p in folder.iterdir())
        # a call served now is recorded and indexed like any other
        peer = TwilioPeer(base)
        url = await peer.stream_url("CA-today")
        async with peer.open_stream(url) as ws:
            await peer.play(ws, renumber(load_twilio_stream("time_tokyo"), "CA-today"), linger_s=0.3)
        deadline = time.monotonic() + 60
        while not (folder / "CA-today.json").exists():
            assert time.monotonic() < deadline, "the served call's record was not written"
            await asyncio.sleep(0.1)
    assert files == ["MID.json", "MID.jsonl", "NEW.json", "NEW.jsonl", "NEW.wav"]  # OLD gone, MID's audio gone
    line = next(li for li in log.read_text().splitlines() if "retention sweep deleted" in li)
    assert "deleted 2 audio files, 2 record files" in line and "1 index rows, 1 outbox events" in line, line
    store = await open_store(target)
    try:
        async with store.transaction() as tx:
            calls = sorted(c.id for c in await tx.calls())
            events = sorted(e.call_id for e in await tx.events(state="delivered"))
    finally:
        await store.close()
    assert calls == ["CA-today", "MID", "NEW"] and events == ["MID", "NEW"]
