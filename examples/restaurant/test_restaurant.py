"""The restaurant bot end to end on CPU: a caller asks for a table, books it and cancels it; the scripted
router picks the example's SQLite tools, the side-effect policy lets only the explicit requests through, each
answer lands as a Context Span in the tiny-random model's streams, and the database and artifacts agree.
Driven with `duetaspan.testing`, as a user would test their own agent."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from duetaspan.agent import Agent
from duetaspan.testing import scripted_call, tool_call

HERE = Path(__file__).parent
CALLER = "+15550001111"


async def test_restaurant_checks_books_and_cancels(tmp_path, monkeypatch, tiny_engine, scripted_llm,
                                                   scripted_asr):  # fmt: skip
    monkeypatch.setenv("RESTAURANT_DB", str(tmp_path / "restaurant.sqlite3"))
    # checked in order against the router's user message (the question plus the call's earlier context)
    scripted_llm.on("cancel", tool_call("cancel_booking"))
    scripted_llm.on("please book", tool_call("book_table", people=4, time="7 PM"))
    # the LLM over-eagerly books when the caller only asked: the side-effect policy refuses it
    scripted_llm.on("how about", tool_call("book_table", people=4, time="8 PM"))
    scripted_llm.on("do you have", tool_call("check_availability", people=4, time="7 PM"))
    agent = Agent.from_config(HERE / "agent.toml", engine=tiny_engine, max_calls=1, seed=0,
                              record_dir=tmp_path / "calls")  # fmt: skip
    async with scripted_call(agent, CALLER, llm=scripted_llm, asr=scripted_asr, call_id="CA-luigi") as call:
        assert {"check_availability", "book_table", "cancel_booking", "find_booking"} <= set(
            agent.registry.names()
        )
        await call.say("Hi, do you have a table for four at 7 pm tonight?")
        available = await call.ask()
        await call.say("Hmm, and how about eight?")
        refused = await call.ask()
        await call.say("Great, please book it for four people at 7 pm.")
        booked = await call.ask()
        await call.say("Sorry, something came up. Please cancel my booking.")
        cancelled = await call.ask()

    available.expect_tool("check_availability", people=4, time="7 PM")
    assert available.reference == "(tool result) Yes, a table for 4 is free at 7 PM tonight."
    refused.expect_refused(tool="book_table").expect_no_tool().expect_no_span()  # "how about" booked nothing
    booked.expect_tool("book_table", people=4, time="7 PM").expect_span(contains="confirmation L-0001")
    assert booked.reference == "(tool result) Booked a table for 4 at 7 PM tonight, confirmation L-0001."
    cancelled.expect_tool("cancel_booking").expect_span(contains="Cancelled the booking for 4 at 7 PM")
    for span in (available, booked, cancelled):
        assert span.frame.n_frames > 0 and span.frame.frame_index > 0

    # the database: one booking, under the caller's number (from the call context), now cancelled
    db = sqlite3.connect(tmp_path / "restaurant.sqlite3")
    assert db.execute("SELECT phone, people, hour, status FROM bookings").fetchall() == [
        (CALLER, 4, 19, "cancelled")
    ]
    # artifacts: the three spans at the frames they landed, the refusal among the retrieval events
    record = call.record
    assert record is not None and record["complete"] and record["meta"]["caller"] == CALLER
    assert (tmp_path / "calls" / "CA-luigi.json").is_file() and (
        tmp_path / "calls" / "CA-luigi.wav"
    ).stat().st_size > 44
    assert [s["reference"] for s in call.spans] == [
        available.reference,
        booked.reference,
        cancelled.reference,
    ]
    assert [s["frame_index"] for s in call.spans] == [
        o.frame.frame_index for o in (available, booked, cancelled)
    ]
    assert [c["tool"] for c in call.tool_calls] == ["check_availability", "book_table", "cancel_booking"]
    assert len(record["rets"]) == 4
    assert len(scripted_llm.requests) >= 4 and len(scripted_asr.requests) >= 4
    assert all(r["model"] == "scripted" for r in scripted_llm.requests)
