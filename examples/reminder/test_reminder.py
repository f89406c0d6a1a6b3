"""The outbound reminder end to end on CPU: the real `duetaspan call` command places the call through (a
loopback fake of) Twilio's REST API, Twilio's side is played when the patient answers (the signed voice
webhook for an outbound call, then the Media Stream), and the agent reads, reschedules and confirms the
appointment with the example's tools."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sqlite3
import sys
from pathlib import Path

from duetaspan.agent import Agent
from duetaspan.testing import scripted_call, tool_call
from duetaspan.testing.twilio import ACCOUNT_SID, AUTH_TOKEN, PUBLIC_URL
from tests.adapters.twilio.peer import FakeTwilioRest
from tests.support import REPO_ROOT

HERE = Path(__file__).parent
PATIENT, CLINIC = "+15551234567", "+15552223333"


async def place_call(rest_url: str) -> tuple[int, str, str]:
    """`duetaspan call ...` as a user types it (a real subprocess), REST pointed at the loopback fake."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TWILIO_", "OPENAI_"))}
    env |= {"TWILIO_ACCOUNT_SID": ACCOUNT_SID, "TWILIO_AUTH_TOKEN": AUTH_TOKEN, "TWILIO_API_BASE_URL": rest_url,
            "PYTHONPATH": str(REPO_ROOT)}  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "duetaspan", "call", PATIENT, "--from", CLINIC, "--public-url", PUBLIC_URL,
        "--config", str(HERE / "agent.toml"),
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode().strip(), err.decode()


async def test_reminder_call_is_placed_then_rescheduled(tmp_path, monkeypatch, tiny_engine, scripted_llm,
                                                       scripted_asr):  # fmt: skip
    monkeypatch.setenv("REMINDER_DB", str(tmp_path / "reminders.sqlite3"))
    scripted_llm.on("change it", tool_call("update_appointment", day="Thursday", time="3 PM"))
    scripted_llm.on("hello", tool_call("get_appointment"))
    rest = FakeTwilioRest()
    agent = Agent.from_config(HERE / "agent.toml", engine=tiny_engine, max_calls=1, seed=0,
                              record_dir=tmp_path / "calls")  # fmt: skip
    async with rest.running() as rest_url:
        code, call_sid, err = await place_call(rest_url)
        assert code == 0, err
        [created] = rest.requests
        assert created["form"]["To"] == PATIENT and created["form"]["Url"] == f"{PUBLIC_URL}/twilio/voice"
        assert re.fullmatch(r"CA[0-9a-f]{32}|CA\d{32}", call_sid)
        # the patient answers: Twilio fetches the webhook the command gave it, for this CallSid, then streams
        async with scripted_call(agent, CLINIC, called=PATIENT, transport="twilio", direction="outbound-api",
                                 call_id=call_sid, llm=scripted_llm, asr=scripted_asr,
                                 rest_url=rest_url) as patient:  # fmt: skip
            await patient.say("greeting", heard="Hello?", seconds=0.8)
            appointment = await patient.ask()
            await patient.say("Oh, Tuesday doesn't work. Could we change it to Thursday at 3 pm?")
            moved = await patient.ask()
            context = patient.session.context
        # the patient hung up (Twilio's stop): the call ended and its artifacts are complete

    assert context.called == PATIENT and context.caller == CLINIC
    appointment.expect_tool("get_appointment")
    assert appointment.reference == (
        "(tool result) Jordan Lee has a cleaning at Harbor Dental on Tuesday at 10 AM, not yet confirmed."
    )
    moved.expect_tool("update_appointment", day="Thursday", time="3 PM")
    assert moved.reference == "(tool result) Moved the cleaning to Thursday at 3 PM, confirmed."
    db = sqlite3.connect(tmp_path / "reminders.sqlite3")
    assert db.execute("SELECT day, time, status FROM appointments").fetchall() == [
        ("Thursday", "3 PM", "confirmed")
    ]
    slots = db.execute("SELECT day || ' ' || time FROM open_slots ORDER BY 1").fetchall()
    assert ("Thursday 3 PM",) not in slots and ("Tuesday 10 AM",) in slots
    record = json.loads((tmp_path / "calls" / f"{call_sid}.json").read_text())
    assert record["complete"] and [s["reference"] for s in record["spans"]] == [
        appointment.reference,
        moved.reference,
    ]
    assert record["meta"] == {"caller": CLINIC, "called": PATIENT, "transport": "twilio"}


def test_confirming_keeps_the_slot(tmp_path, monkeypatch):
    monkeypatch.setenv("REMINDER_DB", str(tmp_path / "r.sqlite3"))
    from duetaspan.registry import CallContext
    from examples.reminder import reminder_tools as book

    ctx = CallContext(caller=CLINIC, called=PATIENT)
    assert book.confirm_appointment(ctx=ctx)["sentence"] == "Confirmed: cleaning on Tuesday at 10 AM."
    assert book.get_appointment(ctx=ctx)["status"] == "confirmed"
    assert book.open_slots(day="wednesday")["slots"] == ["Wednesday 9 AM", "Wednesday 2 PM"]
    assert book._norm_time("3:00 p.m.") == "3 PM"
