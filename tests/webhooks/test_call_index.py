"""One index write per call end: a served agent's `AfterCall` writes the call's completed index row with its
`call.ended` event (one transaction); the agent's own store hook indexes only when nothing follows the call."""

from __future__ import annotations

import asyncio

from duetaspan import Agent
from duetaspan.config import WebhooksConfig
from duetaspan.store.calls import CallIndexOps
from duetaspan.testing import scripted_call
from duetaspan.webhooks.lifecycle import AfterCall


async def _one_call(agent, call_id: str) -> None:
    async with scripted_call(agent, "+15550001", call_id=call_id) as call:
        await call.silence(0.3)


async def _rows(store, call_id: str):
    async with store.transaction() as tx:
        return [c for c in await tx.calls() if c.id == call_id]


async def test_a_served_call_is_indexed_once_at_its_end(tiny_engine, store, tmp_path, monkeypatch):
    writes: list[tuple[str, bool]] = []
    ended = asyncio.Event()  # a completed row was written
    real = CallIndexOps.index_call

    async def counted(self, entry):
        writes.append((entry.id, bool(entry.complete)))
        await real(self, entry)
        if entry.complete:
            ended.set()

    monkeypatch.setattr(CallIndexOps, "index_call", counted)
    after_call = AfterCall(store, webhooks=WebhooksConfig())
    after_call.start()
    agent = Agent(persona="You are Ada.", engine=tiny_engine, max_calls=1, seed=0, record_dir=tmp_path / "calls")
    agent.store, agent.after_call = store, after_call  # what `serve` sets (duetaspan.webhooks.served)
    try:
        await _one_call(agent, "CA-served")
        await asyncio.wait_for(ended.wait(), 30)
        await after_call.stop()  # the call's pending store work finished
        assert writes == [("CA-served", False), ("CA-served", True)]  # call.started, then call.ended: once
        (row,) = await _rows(store, "CA-served")
        assert row.complete
        writes.clear()
        ended.clear()
        agent.after_call = None  # not served: the agent's store hook indexes the call, once
        await _one_call(agent, "CA-plain")
        await asyncio.wait_for(ended.wait(), 30)
        assert await _rows(store, "CA-plain") and writes == [("CA-plain", True)]
    finally:
        await after_call.stop()


async def test_a_call_a_killed_process_left_open_is_finished_by_the_second_pass(store, tmp_path):
    """At a start right after the kill the journal is too fresh to take (an older server mid-deploy may still
    write it); the pass `idle_s` later finishes it, and its row is indexed, not complete, `crashed`. A stop
    does not wait for a pass still to come."""
    from tests.pipeline.test_abandoned import _kill_a_call

    folder = tmp_path / "calls"
    folder.mkdir()
    _kill_a_call(folder)
    after_call = AfterCall(store, webhooks=WebhooksConfig())
    after_call.start()
    try:
        after_call.finish_abandoned(folder, idle_s=5.0)
        await asyncio.sleep(0.5)
        assert not (folder / "CA-killed.json").exists() and not await _rows(store, "CA-killed")
        for _ in range(600):
            if rows := await _rows(store, "CA-killed"):
                break
            await asyncio.sleep(0.1)
        (row,) = rows
        assert not row.complete and (folder / "CA-killed.json").exists()
        later = AfterCall(store, webhooks=WebhooksConfig())
        later.finish_abandoned(folder, idle_s=3600.0)
        await later.stop()
        assert later._finishing is not None and later._finishing.done()
    finally:
        await after_call.stop()
