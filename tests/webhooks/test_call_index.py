"""One index write per call end: a served agent's `AfterCall` writes the call's completed index row with its
`call.ended` event (one transaction); the agent's own store hook indexes only when nothing follows the call."""

from __future__ import annotations

import asyncio
import time

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
    real = CallIndexOps.index_call

    async def counted(self, entry):
        writes.append((entry.id, bool(entry.complete)))
        await real(self, entry)

    monkeypatch.setattr(CallIndexOps, "index_call", counted)
    after_call = AfterCall(store, webhooks=WebhooksConfig())
    after_call.start()
    agent = Agent(persona="You are Ada.", engine=tiny_engine, max_calls=1, seed=0, record_dir=tmp_path / "calls")
    agent.store, agent.after_call = store, after_call  # what `serve` sets (duetaspan.webhooks.served)
    try:
        await _one_call(agent, "CA-served")
        deadline = time.monotonic() + 30
        while not any(done for _, done in writes) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await after_call.stop()  # the call's pending store work finished
        assert writes == [("CA-served", False), ("CA-served", True)]  # call.started, then call.ended: once
        (row,) = await _rows(store, "CA-served")
        assert row.complete
        writes.clear()
        agent.after_call = None  # not served: the agent's store hook indexes the call, once
        await _one_call(agent, "CA-plain")
        deadline = time.monotonic() + 30
        while not await _rows(store, "CA-plain") and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert writes == [("CA-plain", True)]
    finally:
        await after_call.stop()
