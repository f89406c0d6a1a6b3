"""The durable store on SQLite and on a real PostgreSQL server (the same tests, parametrised): migrations
from an empty database and from the previous version, the call index and its filters, the outbox written in
the state change's transaction (and not at all when it rolls back), claims and leases, do-not-call, a
finished campaign's one `campaign.done`."""

from __future__ import annotations

import asyncio
import json

import pytest

from duetaspan.store import CallEntry, entry_from_record, index_folder, migrate, migration_names, open_store
from duetaspan.store.campaigns import normalize_number


async def test_migrations_from_empty_and_from_previous_version(store_target):
    names = migration_names()
    assert names[:3] == ["0001_initial", "0002_dnc_source_meta", "0003_after_call_owed"]
    assert await asyncio.to_thread(migrate, store_target, up_to="0001_initial") == ["0001_initial"]
    # a row written under version 1, as a server of the previous version would have, survives the upgrade
    # and has version 2's column after it
    if store_target.startswith("postgresql"):
        import psycopg

        with psycopg.connect(store_target, autocommit=True) as conn:
            conn.execute("INSERT INTO dnc (number, added_at) VALUES ('+15550001', 1.0)")
    else:
        import sqlite3

        with sqlite3.connect(store_target) as conn:
            conn.execute("INSERT INTO dnc (number, added_at) VALUES ('+15550001', 1.0)")
    assert await asyncio.to_thread(migrate, store_target, up_to="0002_dnc_source_meta") == ["0002_dnc_source_meta"]
    # a call indexed under version 2 (the previous one) owes nothing after the upgrade to version 3
    insert = "INSERT INTO calls (id, started_at, complete, spans, indexed_at) VALUES ('CA-v2', 1.0, 1, 0, 1.0)"
    if store_target.startswith("postgresql"):
        with psycopg.connect(store_target, autocommit=True) as conn:
            conn.execute(insert)
    else:
        with sqlite3.connect(store_target) as conn:
            conn.execute(insert)
    assert await asyncio.to_thread(migrate, store_target) == names[2:]
    assert await asyncio.to_thread(migrate, store_target) == []  # idempotent: nothing left to apply
    if not store_target.startswith("postgresql"):  # numbers and outcomes: the owner's only
        import os

        assert os.stat(store_target).st_mode & 0o777 == 0o600
    store = await open_store(store_target)
    try:
        async with store.transaction() as tx:
            rows = await tx.dnc_list()
        assert rows == [{"number": "+15550001", "added_at": 1.0, "source": "api"}]
        async with store.transaction() as tx:
            assert (await tx.call("CA-v2")) is not None and await tx.owed_calls() == []
            await tx.set_owed("CA-v2", "analysis")
            assert await tx.owed_calls() == [("CA-v2", "analysis")]
            with pytest.raises(ValueError):
                await tx.set_owed("CA-v2", "everything")
    finally:
        await store.close()


async def test_call_index_filters(store):
    async with store.transaction() as tx:
        for i, (outcome, number, campaign) in enumerate(
            [
                ("answered", "+15550001", "cmp1"),
                ("busy", "+15550002", "cmp1"),
                ("answered", "+15550003", None),
            ]
        ):
            await tx.index_call(
                CallEntry(
                    f"CA{i}",
                    transport="sip",
                    to_number=number,
                    started_at=100.0 + i,
                    outcome=outcome,
                    campaign_id=campaign,
                    complete=True,
                )
            )
    async with store.transaction() as tx:
        assert [c.id for c in await tx.calls()] == ["CA2", "CA1", "CA0"]  # newest first
        assert [c.id for c in await tx.calls(outcome="answered")] == ["CA2", "CA0"]
        assert [c.id for c in await tx.calls(number="+15550002")] == ["CA1"]
        assert [c.id for c in await tx.calls(campaign="cmp1")] == ["CA1", "CA0"]
        assert [c.id for c in await tx.calls(since=101.0, until=102.0)] == ["CA1"]
        assert [c.id for c in await tx.calls(limit=1)] == ["CA2"]
        # indexing a call again (at its end) updates its row
        await tx.index_call(CallEntry("CA0", transport="sip", started_at=100.0, outcome="failed"))
    async with store.transaction() as tx:
        call = await tx.call("CA0")
        assert call is not None and call.outcome == "failed" and call.complete is False


async def test_outbox_event_lives_and_dies_with_its_state_change(store):
    async with store.transaction() as tx:
        await tx.index_call(CallEntry("CA1", outcome="answered"))
        await tx.emit("call.ended", call_id="CA1", data={"outcome": "answered", "text": "héllo"})
    with pytest.raises(RuntimeError):
        async with store.transaction() as tx:
            await tx.index_call(CallEntry("CA2", outcome="busy"))
            await tx.emit("call.ended", call_id="CA2", data={})
            raise RuntimeError("the change fails after the event was appended")
    async with store.transaction() as tx:
        assert await tx.call("CA2") is None
        events = await tx.events()
    assert [(e.type, e.call_id, e.data) for e in events] == [
        ("call.ended", "CA1", {"outcome": "answered", "text": "héllo"})
    ]
    assert events[0].state == "pending" and events[0].attempts == 0


async def test_a_finished_campaign_writes_one_campaign_done_with_its_state_change(store):
    """`campaign.done` comes with the state change, once: a second look (another server's scheduler) writes
    none, and a campaign with a number left writes none."""
    async with store.transaction() as tx:
        camp = await tx.create_campaign("c", {}, [{"to": "+15550100"}, {"to": "+15550101"}], now=1.0)
        open_one = await tx.create_campaign("d", {}, [{"to": "+15550102"}], now=1.0)
        await tx.dnc_add(["+15550100", "+15550101", "+15550102"], now=1.0)
        assert await tx.claim_contacts(camp.id, now=2.0, lease_s=30, max_concurrent=4, per_minute=60, limit=4,
                                       later=lambda c: None) == []  # fmt: skip
        assert await tx.campaign_finished(camp.id) and not await tx.campaign_finished(camp.id)
        assert not await tx.campaign_finished(open_one.id)
    async with store.transaction() as tx:
        done = [e for e in await tx.events() if e.type == "campaign.done"]
        assert (await tx.campaign("c")).state == "done"
    assert [e.data for e in done] == [
        {"campaign_id": camp.id, "name": "c", "contacts": 2, "attempts": 0, "counts": {"dnc": 2}}
    ]


async def test_outbox_claims_hold_events_and_record_answers(store):
    async with store.transaction() as tx:
        first = await tx.emit("a", data={"n": 1})
        second = await tx.emit("b", data={"n": 2})
    now = max(first.created, second.created) + 1
    async with store.transaction() as tx:
        claimed = await tx.claim_events(now=now, lease_s=30, limit=10)
    assert [e.id for e in claimed] == [first.id, second.id]
    async with store.transaction() as tx:  # held by the claim: nobody else takes them within the lease
        assert await tx.claim_events(now=now + 1, lease_s=30) == []
        await tx.event_delivered(first.id, "HTTP 200")
        await tx.event_failed(second.id, "HTTP 500", retry_at=now + 5)
    async with store.transaction() as tx:
        assert [e.id for e in await tx.claim_events(now=now + 6)] == [second.id]
        await tx.event_failed(second.id, "HTTP 500", retry_at=None)
    async with store.transaction() as tx:
        by_id = {e.id: e for e in await tx.events()}
    assert (by_id[first.id].state, by_id[first.id].attempts, by_id[first.id].last_answer) == (
        "delivered",
        1,
        "HTTP 200",
    )
    assert (by_id[second.id].state, by_id[second.id].attempts) == ("dead", 2)


async def test_concurrent_outbox_claims_never_share_an_event(store_target):
    """Two stores (two servers) claiming at once from one database: every event goes to exactly one."""
    a = await open_store(store_target, server_id="a")
    b = await open_store(store_target, server_id="b")
    try:
        async with a.transaction() as tx:
            for i in range(40):
                await tx.emit("e", data={"i": i})

        async def drain(store):
            got = []
            while True:
                async with store.transaction() as tx:
                    batch = await tx.claim_events(now=1e12, lease_s=1e6, limit=3)
                if not batch:
                    return got
                got += [e.id for e in batch]

        got_a, got_b = await asyncio.gather(drain(a), drain(b))
        assert len(got_a) + len(got_b) == 40 and not set(got_a) & set(got_b)
    finally:
        await a.close()
        await b.close()


async def test_dnc_normalises_numbers(store):
    async with store.transaction() as tx:
        assert await tx.dnc_add(["+1 (555) 0001", "sip:+15550002@trunk.example;transport=tcp"], now=5.0) == 2
        assert await tx.dnc_add(["+15550001"], now=6.0) == 0  # already there
    async with store.transaction() as tx:
        assert await tx.dnc_has("sip:+15550001@pbx.example")
        assert await tx.dnc_has("+15550002")
        assert not await tx.dnc_has("+15550003")
        assert await tx.dnc_remove(["+15550002"]) == 1
        assert [r["number"] for r in await tx.dnc_list()] == ["+15550001"]
    assert normalize_number("sip:Alice@PBX.example;transport=tcp") == "alice@pbx.example"


async def test_old_record_folder_is_indexed_once(store, tmp_path):
    folder = tmp_path / "records"
    folder.mkdir()
    record = {
        "call_id": "old1",
        "meta": {"transport": "twilio", "caller": "+15550009"},
        "frames": [],
        "started_at": 50.0,
        "ended_at": 60.0,
        "complete": True,
        "spans": [{}],
        "summary": {},
    }
    (folder / "old1.json").write_text(json.dumps(record))
    (folder / "torn.jsonl").write_text(
        '{"type": "call_start", "call_id": "torn", "started_at": 70.0, "meta": {}}\n{"ty'
    )
    (folder / "junk.json").write_text("not json")
    assert await index_folder(store, folder) == 2
    (folder / "old2.json").write_text(json.dumps({**record, "call_id": "old2"}))
    assert await index_folder(store, folder) == 0  # once per folder: new calls are indexed as they end
    async with store.transaction() as tx:
        calls = {c.id: c for c in await tx.calls()}
    assert set(calls) == {"old1", "torn"}
    assert (
        calls["old1"].duration_s == 10.0
        and calls["old1"].spans == 1
        and calls["old1"].from_number == "+15550009"
    )
    assert (
        calls["old1"].record_path == str((folder / "old1.json").resolve()) and calls["old1"].wav_path is None
    )
    assert calls["torn"].complete is False and calls["torn"].jsonl_path is not None


def test_entry_from_record_reads_sip_dial_meta():
    entry = entry_from_record(
        {
            "call_id": "x",
            "meta": {"transport": "sip", "direction": "outbound", "outcome": "busy", "called": "sip:7002@h"},
        },
        None,
    )
    assert (entry.direction, entry.outcome, entry.to_number) == ("outbound", "busy", "sip:7002@h")


async def test_a_transaction_cancelled_while_begin_waits_leaves_the_sqlite_store_usable(tmp_path):
    """Another process holds SQLite's write lock; a transaction's `BEGIN IMMEDIATE` waits for it (the busy
    timeout) and its task is cancelled meanwhile. The worker thread still runs the BEGIN once the lock is free:
    that transaction must not stay open on the store's connection, or every later BEGIN fails ("cannot start a
    transaction within a transaction")."""
    import sqlite3
    import threading

    path = tmp_path / "data" / "duetaspan.sqlite3"
    store = await open_store(path)
    began = threading.Event()
    try:
        await store._run(lambda c: c.set_trace_callback(lambda sql: sql == "BEGIN IMMEDIATE" and began.set()))
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # the other process's write transaction

        async def write() -> None:
            async with store.transaction() as tx:
                await tx.dnc_add(["+15550009"], now=1.0)

        task = asyncio.create_task(write())
        # BEGIN runs on the worker thread, waiting for the lock
        assert await asyncio.to_thread(began.wait, 30)
        task.cancel()
        holder.execute("ROLLBACK")  # the lock is free: the worker's BEGIN now succeeds
        holder.close()
        with pytest.raises(asyncio.CancelledError):
            await task
        # a later transaction works, and the cancelled one wrote nothing
        async with store.transaction() as tx:
            await tx.dnc_add(["+15550010"], now=2.0)
        async with store.transaction() as tx:
            assert [r["number"] for r in await tx.dnc_list()] == ["+15550010"]
    finally:
        await store.close()


async def test_a_campaigns_status_is_read_at_one_moment_while_a_claim_commits(store_target):
    """A status is several queries (contacts by state, then the attempts). On PostgreSQL each statement of a
    READ COMMITTED transaction sees its own moment: a claim committed between them showed an attempt whose
    contact was not yet `dialling` (the scheduler test that failed once in r25). `transaction(snapshot=True)`
    reads them at one moment."""
    if not store_target.startswith("postgresql"):
        pytest.skip("SQLite's BEGIN IMMEDIATE holds the write lock: no claim can commit inside a read")
    store = await open_store(store_target)
    try:
        seen = {}
        for i, snapshot in enumerate((True, False)):
            async with store.transaction() as tx:
                camp = await tx.create_campaign(f"snap{i}", {}, [{"to": f"+1555010{i}"}], now=1.0)
            async with store.transaction(snapshot=snapshot) as reader:
                assert await reader.counts(camp.id) == {"pending": 1}
                async with store.transaction() as tx:  # another connection claims and commits meanwhile
                    claims = await tx.claim_contacts(camp.id, now=2.0, lease_s=30, max_concurrent=4, per_minute=60,
                                                     limit=4, later=lambda c: None)  # fmt: skip
                assert len(claims) == 1
                seen[snapshot] = await reader.attempt_count(camp.id)
        assert seen == {True: 0, False: 1}  # the snapshot's attempts agree with its counts; the default's do not
    finally:
        await store.close()
