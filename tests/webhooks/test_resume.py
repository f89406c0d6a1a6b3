"""After-call work a killed process still owed, finished by the next one (`AfterCall.resume`), on both stores.

A process killed after writing a call's record and before committing its `call.ended`, or during the call's
analysis, leaves the call's index row `owed`; these tests leave exactly that state the way the killed process
did (its `call.started` committed by a real `AfterCall`, its record written by a real `CallRecorder`, its
after-close work never run or cancelled mid-analysis) and start another `AfterCall` on the same store and
folder. The real process killed with `kill -9` mid-analysis is in test_serve_webhooks.py."""

from __future__ import annotations

import asyncio
import json
import os
import time

from duetaspan.adapters.llm import ChatClient
from duetaspan.config import WebhooksConfig
from duetaspan.pipeline.artifacts import CallRecorder, update_record
from duetaspan.testing import ScriptedLLM
from duetaspan.testing.llm import hang, tool_call
from duetaspan.webhooks.analysis import TOOL, Analyzer
from duetaspan.webhooks.lifecycle import AfterCall

HOOKS = WebhooksConfig(urls=["http://127.0.0.1:9/hook"])  # events are written; nothing is delivered (not started)
ANSWER = {"summary": "The caller asked for the time.", "success": True}


async def _events(store, call_id: str) -> list[str]:
    async with store.transaction() as tx:
        return [e.type for e in await tx.events(call_id=call_id)]


async def _owed(store) -> dict[str, str]:
    async with store.transaction() as tx:
        return dict(await tx.owed_calls())


def _age(path, seconds: float = 3600.0) -> None:
    """The next start comes later than the kill: the record has not been touched for a while."""
    old = time.time() - seconds
    os.utime(path, (old, old))


async def _started_then_closed_unsent(store, folder, call_id: str, **kwargs) -> CallRecorder:
    """A call whose process died between writing its record and committing its `call.ended`: the first
    `AfterCall` commits `call.started`, the recorder writes the record, its after-close work never runs."""
    first = AfterCall(store, webhooks=HOOKS, secrets=["s"], **kwargs)
    meta = {"transport": "sip", "caller": "+15550001111", "called": "+15550002222"}  # what the transport writes
    recorder = CallRecorder(folder, call_id, meta=meta, audio=False)
    first.attach(recorder, caller="+15550001111", called="+15550002222", transport="sip")
    await asyncio.gather(*first._tasks)  # call.started is in
    assert await _owed(store) == {call_id: "end"}
    recorder.after_close.clear()  # the kill: nothing after the record
    recorder.close()
    assert (folder / f"{call_id}.json").exists() and await _events(store, call_id) == ["call.started"]
    return recorder


async def test_a_call_whose_process_died_before_call_ended_is_ended_by_the_next(store, tmp_path):
    folder = tmp_path / "calls"
    await _started_then_closed_unsent(store, folder, "CA-unsent")
    nxt = AfterCall(store, webhooks=HOOKS, secrets=["s"])
    try:
        assert await nxt.resume(folder) == []  # the record was written just now: maybe still being closed
        _age(folder / "CA-unsent.json")
        other = tmp_path / "elsewhere"  # another server's folder on the same store: not its call
        other.mkdir()
        assert await nxt.resume(other, idle_s=0) == []
        assert await nxt.resume(folder) == ["CA-unsent"]
        await asyncio.gather(*nxt._tasks)
        assert await nxt.resume(folder, idle_s=0) == []  # owed nothing now: never sent twice
    finally:
        await nxt.stop()
    assert await _events(store, "CA-unsent") == ["call.started", "call.ended"]
    assert await _owed(store) == {}
    async with store.transaction() as tx:
        row = await tx.call("CA-unsent")
        (ended,) = await tx.events(type="call.ended")
    assert row is not None and row.record_path == str((folder / "CA-unsent.json").resolve())
    assert ended.data["caller"] == "+15550001111" and ended.data["transport"] == "sip"


async def test_a_live_call_of_this_process_is_never_taken(store, tmp_path):
    """Its own call, closed but with its after-call work still running (a slow store or analysis), is this
    process's to finish, however old its record."""
    folder = tmp_path / "calls"
    after_call = AfterCall(store, webhooks=HOOKS, secrets=["s"])
    recorder = CallRecorder(folder, "CA-mine", audio=False)
    after_call.attach(recorder, caller=None, called=None, transport="twilio")
    try:
        await asyncio.gather(*after_call._tasks)
        recorder.after_close.clear()  # its call.ended not written yet, as if still on its way
        recorder.close()
        _age(folder / "CA-mine.json")
        assert await after_call.resume(folder, idle_s=0) == []
    finally:
        await after_call.stop()
    assert await _owed(store) == {"CA-mine": "end"}


def _analysing(llm_url: str, **kwargs):
    return {"analyzer": Analyzer(summary=True, success_question="Did the caller get the time?"),
            "llm": ChatClient(llm_url, "scripted", api_key="x"), **kwargs}  # fmt: skip


async def test_an_analysis_the_process_died_in_is_made_by_the_next(store, tmp_path):
    folder = tmp_path / "calls"
    llm = ScriptedLLM({"rules": [{"match": "Transcript:", "reply": hang()}]})
    async with llm as llm_url:
        first = AfterCall(store, webhooks=HOOKS, secrets=["s"], **_analysing(llm_url))
        recorder = CallRecorder(folder, "CA-analysing", audio=False)
        first.attach(recorder, caller=None, called=None, transport="sip")
        recorder.close()
        for _ in range(600):  # call.ended committed, the analysis asked for (and hanging)
            if llm.requests and "call.ended" in await _events(store, "CA-analysing"):
                break
            await asyncio.sleep(0.05)
        assert await _owed(store) == {"CA-analysing": "analysis"}
        for task in list(first._tasks):  # the kill
            task.cancel()
        await asyncio.gather(*first._tasks, return_exceptions=True)
        await first.llm.aclose()
        llm.rules[0]["reply"] = tool_call(TOOL, **ANSWER)
        _age(folder / "CA-analysing.json")
        without = AfterCall(store, webhooks=HOOKS, secrets=["s"])  # a server without [analysis]: leaves it owed
        assert await without.resume(folder) == []
        nxt = AfterCall(store, webhooks=HOOKS, secrets=["s"], **_analysing(llm_url))
        try:
            assert await nxt.resume(folder) == ["CA-analysing"]
            await asyncio.gather(*nxt._tasks)
        finally:
            await nxt.stop()
    assert await _events(store, "CA-analysing") == ["call.started", "call.ended", "call.analyzed"]
    assert await _owed(store) == {}
    record = json.loads((folder / "CA-analysing.json").read_text())
    assert {k: record["analysis"][k] for k in ANSWER} == ANSWER


async def test_an_analysis_written_before_the_kill_is_sent_not_made_again(store, tmp_path):
    """Killed between writing the analysis into the record and committing `call.analyzed`: the next process
    sends the record's analysis and asks the LLM nothing."""
    folder = tmp_path / "calls"
    llm = ScriptedLLM({"rules": [{"match": "Transcript:", "reply": tool_call(TOOL, **ANSWER)}]})
    async with llm as llm_url:
        await _started_then_closed_unsent(store, folder, "CA-written")
        async with store.transaction() as tx:  # its call.ended committed, its analysis owed
            await tx.emit("call.ended", call_id="CA-written", data={})
            await tx.set_owed("CA-written", "analysis")
        update_record(folder, "CA-written", analysis={"summary": "Written before the kill.", "attempts": 1})
        _age(folder / "CA-written.json")
        nxt = AfterCall(store, webhooks=HOOKS, secrets=["s"], **_analysing(llm_url))
        try:
            assert await nxt.resume(folder) == ["CA-written"]
            await asyncio.gather(*nxt._tasks)
        finally:
            await nxt.stop()
        assert llm.requests == []
    async with store.transaction() as tx:
        (analyzed,) = await tx.events(type="call.analyzed")
    assert analyzed.data == {"summary": "Written before the kill.", "attempts": 1}
    assert await _owed(store) == {}


async def test_a_served_call_owes_nothing_once_its_work_is_done(store, tmp_path):
    """The owed column through a whole call: `end` from its start, `analysis` once ended, nothing after."""
    folder = tmp_path / "calls"
    llm = ScriptedLLM({"rules": [{"match": "Transcript:", "reply": tool_call(TOOL, **ANSWER)}]})
    async with llm as llm_url:
        after_call = AfterCall(store, webhooks=HOOKS, secrets=["s"], **_analysing(llm_url))
        recorder = CallRecorder(folder, "CA-whole", audio=False)
        after_call.attach(recorder, caller=None, called=None, transport="sip")
        try:
            await asyncio.gather(*after_call._tasks)
            assert await _owed(store) == {"CA-whole": "end"}
            recorder.close()
        finally:
            await after_call.stop()
    assert await _owed(store) == {}
    assert await _events(store, "CA-whole") == ["call.started", "call.ended", "call.analyzed"]


async def test_a_calls_end_lands_after_its_start_however_late_the_start(store, tmp_path, monkeypatch):
    """The start's row (not complete, owed `end`) and the end's are separate transactions (on PostgreSQL on
    separate connections): a call that ends before its start's write is in must not have its completed row
    overwritten by it, or it would stay owed and be sent again; nor may its `call.answered` come first."""
    real = AfterCall._write

    async def slow_start(self, entry, type_, call_id, data, **kwargs):
        if type_ == "call.started":  # a store that is slow right then
            await asyncio.sleep(0.5)
        await real(self, entry, type_, call_id, data, **kwargs)

    monkeypatch.setattr(AfterCall, "_write", slow_start)
    folder = tmp_path / "calls"
    after_call = AfterCall(store, webhooks=HOOKS, secrets=["s"])
    recorder = CallRecorder(folder, "CA-short", audio=False)
    after_call.attach(recorder, caller=None, called=None, transport="sip")
    recorder.event("meta", outcome="answered", direction="outbound")  # answered at once (SIP's 200 OK)
    recorder.close()  # ended at once
    await after_call.stop()
    assert await _owed(store) == {}
    async with store.transaction() as tx:
        events = await tx.events(call_id="CA-short")
    # in this order, by the time they were committed (`created`), as the receiver gets them
    assert [e.type for e in events] == ["call.started", "call.answered", "call.ended"]
    async with store.transaction() as tx:
        row = await tx.call("CA-short")
    assert row is not None and row.record_path is not None  # the end's row, not the start's
