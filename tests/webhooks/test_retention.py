"""Retention on both stores: the purge by age (audio only, or records with their index rows, delivered
outbox events and finished campaigns' contacts), one call's delete, one number's delete (do-not-call stays),
and the `duetaspan records` / `duetaspan webhooks` commands run as a user runs them."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import subprocess
import sys
import time

import numpy as np

from duetaspan.pipeline.artifacts import CallRecorder
from duetaspan.store import entry_from_record
from duetaspan.webhooks.retention import cutoffs, delete_call, delete_number, purge

DAY = 86400.0
NOW = time.time()


async def _call(store, folder, call_id, caller, age_days, *, event=True):
    rec = CallRecorder(folder, call_id, meta={"caller": caller, "called": "+15550000000", "transport": "sip"})
    rec.write_frame(np.zeros(1920, np.float32), np.zeros(1920, np.float32))
    record = rec.close()
    then = NOW - age_days * DAY
    for path in folder.glob(f"{call_id}.*"):
        os.utime(path, (then, then))
    record["started_at"] = then
    async with store.transaction() as tx:
        await tx.index_call(entry_from_record(record, folder))
        if event:
            e = await tx.emit("call.ended", call_id=call_id, data={})
            await tx.execute("UPDATE outbox SET created = ? WHERE id = ?", [then, e.id])
            await tx.event_delivered(e.id, "200")
    return record


async def _state(store, folder):
    async with store.transaction() as tx:
        calls = sorted(c.id for c in await tx.calls())
        events = sorted(((e.call_id, e.state) for e in await tx.events()), key=lambda e: (e[0] or "", e[1]))
        contacts = sorted(r["to_number"] for r in await tx.fetchall("SELECT to_number FROM contacts"))
        dnc = sorted(r["number"] for r in await tx.dnc_list())
    return calls, events, contacts, dnc, sorted(p.name for p in folder.iterdir())


async def test_purge_by_age_audio_then_records(store, tmp_path):
    folder = tmp_path / "rec"
    await _call(store, folder, "OLD", "+14155550001", 40)
    await _call(store, folder, "MID", "+14155550002", 10)
    await _call(store, folder, "NEW", "+14155550003", 0.1)
    async with store.transaction() as tx:
        done = await tx.create_campaign("spring", {}, [{"to": "+14155550009"}], now=NOW - 40 * DAY)
        await tx.set_campaign_state(done.id, "done")
        await tx.create_campaign("running", {}, [{"to": "+14155550008"}], now=NOW - 40 * DAY)
        pending = await tx.emit("call.ended", call_id="OLD", data={})  # not delivered yet: kept
        await tx.execute("UPDATE outbox SET created = ? WHERE id = ?", [NOW - 40 * DAY, pending.id])
    audio_before, records_before = cutoffs(7, 30, now=NOW)
    out = await purge(store, folder, audio_before=audio_before)
    assert out.audio_files == 2 and out.record_files == 0
    assert not (folder / "OLD.wav").exists() and not (folder / "MID.wav").exists() and (folder / "NEW.wav").exists()
    out = await purge(store, folder, audio_before=audio_before, records_before=records_before)
    assert out.record_files == 2 and out.index_rows == 1 and out.outbox_rows == 1 and out.contact_rows == 1
    calls, events, contacts, _, files = await _state(store, folder)
    assert calls == ["MID", "NEW"] and files == ["MID.json", "MID.jsonl", "NEW.json", "NEW.jsonl", "NEW.wav"]
    assert events == [("MID", "delivered"), ("NEW", "delivered"), ("OLD", "pending")]
    assert contacts == ["+14155550008"]  # the running campaign's contact stays


async def test_delete_one_call_and_one_number_everywhere_but_dnc(store, tmp_path):
    folder = tmp_path / "rec"
    await _call(store, folder, "A1", "+14155550001", 1)
    await _call(store, folder, "A2", "+1 (415) 555-0001", 2)
    await _call(store, folder, "B1", "+14155550002", 1)
    CallRecorder(folder, "A3", meta={"caller": "+14155550001"}).write_frame(np.zeros(4, np.float32), np.zeros(4, np.float32))  # a crash: journal only
    async with store.transaction() as tx:
        camp = await tx.create_campaign("c", {}, [{"to": "+1 415 555 0001"}, {"to": "+14155550002"}], now=NOW)
        await tx.dnc_add(["+14155550001"], now=NOW, source="opt_out")
        await tx.emit("dnc.added", call_id="A2", data={"number": "+14155550001", "source": "opt_out"})  # its opt-out
        # the scheduler suppresses the number on the list: a campaign.attempt without a call, the number in `to`
        await tx.claim_contacts(camp.id, now=NOW, lease_s=60, max_concurrent=1, per_minute=60, limit=1,
                                later=lambda _contact: None)  # fmt: skip
        await tx.emit("campaign.attempt", data={"campaign_id": camp.id, "to": "+14155550002", "outcome": "busy"})
    assert (await _types(store)).count("campaign.attempt") == 2
    out = await delete_call(store, folder, "B1")
    assert out.index_rows == 1 and out.outbox_rows == 1 and out.record_files == 2 and out.audio_files == 1
    out = await delete_number(store, folder, "+14155550001")
    assert sorted(out.calls) == ["A1", "A2", "A3"] and out.contact_rows == 1 and out.outbox_rows == 3
    calls, events, contacts, dnc, files = await _state(store, folder)
    assert calls == [] and files == []
    assert events == [(None, "pending"), ("A2", "pending")]  # the other number's attempt; the opt-out's event
    assert await _types(store) == ["campaign.attempt", "dnc.added"]
    assert contacts == ["+14155550002"] and dnc == ["+14155550001"]  # do-not-call stays


async def _types(store):
    async with store.transaction() as tx:
        return sorted(e.type for e in await tx.events())


def _cli(*args, cwd):
    """A command as a user runs it: `python -m duetaspan ...` from the venv, in the project's folder."""
    return subprocess.run([sys.executable, "-m", "duetaspan", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "DUETASPAN_STORE_URL": ""})  # fmt: skip


def _main(*args, cwd, capsys, monkeypatch):
    """The same command in this process (`duetaspan.cli.main`): each subprocess costs seconds of imports."""
    from duetaspan.cli import main

    monkeypatch.chdir(cwd)
    monkeypatch.delenv("DUETASPAN_STORE_URL", raising=False)
    rc = main(list(args))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, rc, out.out, out.err)


def test_the_commands(tmp_path, capsys, monkeypatch):
    asyncio.run(_seed(tmp_path))
    listed = _cli("webhooks", "list", "--config", "agent.toml", "--state", "dead", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    [row] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert row["last_answer"] == "410 gone" and row["state"] == "dead" and row["call_id"] == "KEEP"
    run = functools.partial(_main, cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch)
    replayed = run("webhooks", "replay", "--config", "agent.toml", "--dead")
    assert replayed.returncode == 0 and "1 events queued" in replayed.stdout
    assert '"state": "pending"' in run("webhooks", "list", "--config", "agent.toml", "--json").stdout
    before = time.strftime("%Y-%m-%d", time.gmtime(NOW - 30 * DAY))
    purged = run("records", "purge", "--config", "agent.toml", "--before", before)
    assert purged.returncode == 0 and "1 index rows" in purged.stdout, purged.stdout + purged.stderr
    assert sorted(p.name for p in (tmp_path / "rec").iterdir()) == ["KEEP.json", "KEEP.jsonl", "KEEP.wav"]
    bad = run("records", "delete", "--config", "agent.toml")
    assert bad.returncode == 1 and "CALL_ID or --number" in bad.stderr
    gone = _cli("records", "delete", "--config", "agent.toml", "--number", "+14155550002", cwd=tmp_path)
    assert gone.returncode == 0 and "deleted 1 calls" in gone.stdout and not list((tmp_path / "rec").iterdir())


async def _seed(tmp_path):
    from duetaspan.store import open_store

    (tmp_path / "agent.toml").write_text('[recording]\ndir = "rec"\n')
    store = await open_store(tmp_path / "data" / "duetaspan.sqlite3")
    try:
        await _call(store, tmp_path / "rec", "OLD", "+14155550001", 400)
        await _call(store, tmp_path / "rec", "KEEP", "+14155550002", 1, event=False)
        async with store.transaction() as tx:
            dead = await tx.emit("call.ended", call_id="KEEP", data={})
            await tx.event_failed(dead.id, "410 gone", retry_at=None)
    finally:
        await store.close()


async def test_a_server_without_webhook_urls_sweeps_the_events_nobody_sends(store, tmp_path):
    """No `[webhooks] urls`: `campaign.*` / `dnc.*` events (written by commands that do not know the URLs) are
    still written, and the served sweeper deletes those past `retry_for_s`; fresher ones and delivered ones
    stay (a URL configured later still gets what is inside its retry window)."""
    from types import SimpleNamespace

    from duetaspan.config import AgentConfig
    from duetaspan.webhooks.served import open_after_call

    async with store.transaction() as tx:
        old = await tx.emit("campaign.started", data={"campaign_id": 1})
        await tx.execute("UPDATE outbox SET created = ? WHERE id = ?", [NOW - 2 * DAY, old.id])
        dead = await tx.emit("dnc.added", call_id="CA1", data={"number": "+14155550001"})
        await tx.execute("UPDATE outbox SET created = ?, state = 'dead' WHERE id = ?", [NOW - 2 * DAY, dead.id])
        fresh = await tx.emit("dnc.changed", data={"added": 1})
    config = AgentConfig(webhooks={"retry_for_s": DAY})
    agent = SimpleNamespace(config=config, store=store, record_dir=tmp_path / "rec", after_call=None)
    served = await open_after_call(agent, env={})
    assert served is not None and served.sweeper is not None
    try:
        deadline = time.monotonic() + 30
        while True:
            async with store.transaction() as tx:
                left = sorted(e.id for e in await tx.events())
            if left == [fresh.id] or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
    finally:
        await served.aclose()
    assert left == [fresh.id]
    async with store.transaction() as tx:  # the on-demand purge: undelivered ones before its date too
        await tx.execute("UPDATE outbox SET created = ? WHERE id = ?", [NOW - 3 * DAY, fresh.id])
    out = await purge(store, None, records_before=NOW - DAY, undelivered_before=NOW - DAY)
    assert out.outbox_rows == 1
