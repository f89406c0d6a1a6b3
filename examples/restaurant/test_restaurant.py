"""The restaurant bot end to end on CPU: a caller asks for a table, books it and cancels it; the scripted
router picks the example's SQLite tools, the side-effect policy lets only the explicit requests through, each
answer lands as a Context Span in the tiny-random model's streams, and the database and artifacts agree."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from duetaspan.pipeline.frames import NoSpanFrame, SpanFrame
from duetaspan.pipeline.session import CallInfo
from examples.testing import LoopbackCaller, run_loopback_call, scripted_agent, tool_call
from tests.fakes.asr_server import ScriptedASRServer
from tests.fakes.llm_server import ScriptedLLMServer

HERE = Path(__file__).parent
CALLER = "+15550001111"


LLM_SCRIPT = {
    # checked in order against the router's user message (the question plus the call's earlier context)
    "rules": [
        {"match": "cancel", "reply": tool_call("cancel_booking")},
        {"match": "please book", "reply": tool_call("book_table", people=4, time="7 PM")},
        # the LLM over-eagerly books when the caller only asked: the side-effect policy refuses it
        {"match": "how about", "reply": tool_call("book_table", people=4, time="8 PM")},
        {"match": "do you have", "reply": tool_call("check_availability", people=4, time="7 PM")},
    ]
}
HEARD = [
    "Hi, do you have a table for four at 7 pm tonight?",
    "Hmm, and how about eight?",
    "Great, please book it for four people at 7 pm.",
    "Sorry, something came up. Please cancel my booking.",
]


async def test_restaurant_checks_books_and_cancels(tmp_path, monkeypatch, tiny_engine):
    monkeypatch.setenv("RESTAURANT_DB", str(tmp_path / "restaurant.sqlite3"))
    llm, asr = ScriptedLLMServer(LLM_SCRIPT), ScriptedASRServer()

    async def caller(c: LoopbackCaller) -> None:
        for text in HEARD:
            asr.default = text  # what the ASR "hears" in this turn, however VAD cuts the utterance
            await c.say("book_table", seconds=1.0)
            await c.ask()

    async with llm.serve() as llm_url, asr.serve() as asr_url:
        agent = scripted_agent(HERE / "agent.toml", tiny_engine, llm_url, asr_url, tmp_path / "calls")
        async with agent:
            assert {"check_availability", "book_table", "cancel_booking", "find_booking"} <= set(
                agent.registry.names()
            )
            out = await run_loopback_call(agent, CallInfo("CA-luigi", caller=CALLER), caller)

    available, refused, booked, cancelled = out.outcomes
    assert isinstance(available, SpanFrame) and available.tool == "check_availability"
    assert available.reference == "(tool result) Yes, a table for 4 is free at 7 PM tonight."
    assert isinstance(refused, NoSpanFrame)  # "how about eight?" asked for no booking
    assert isinstance(booked, SpanFrame) and booked.tool == "book_table"
    assert booked.arguments == {"people": 4, "time": "7 PM"}
    assert booked.reference == "(tool result) Booked a table for 4 at 7 PM tonight, confirmation L-0001."
    assert isinstance(cancelled, SpanFrame) and cancelled.tool == "cancel_booking"
    assert cancelled.reference == "(tool result) Cancelled the booking for 4 at 7 PM tonight."
    for span in (available, booked, cancelled):
        assert span.n_frames > 0 and span.frame_index > 0

    # the database: one booking, under the caller's number (from the call context), now cancelled
    db = sqlite3.connect(tmp_path / "restaurant.sqlite3")
    assert db.execute("SELECT phone, people, hour, status FROM bookings").fetchall() == [
        (CALLER, 4, 19, "cancelled")
    ]
    # artifacts: the three spans at the frames they landed, the refusal among the retrieval events
    record = json.loads((tmp_path / "calls" / "CA-luigi.json").read_text())
    assert record["complete"] and record["meta"]["caller"] == CALLER
    assert [s["reference"] for s in record["spans"]] == [available.reference, booked.reference,
                                                         cancelled.reference]  # fmt: skip
    assert [s["frame_index"] for s in record["spans"]] == [s.frame_index for s in out.spans()]
    assert len(record["rets"]) == 4
    assert (tmp_path / "calls" / "CA-luigi.wav").stat().st_size > 44
    assert len(llm.requests) >= 4 and len(asr.requests) >= 4
    assert all(r["model"] == "scripted" for r in llm.requests)
