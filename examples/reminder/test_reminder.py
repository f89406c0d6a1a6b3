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

from duetaspan.pipeline.frames import SpanFrame
from examples.testing import answer_twilio_stream, capture_sessions, scripted_agent, tool_call, wait_for
from tests.adapters.twilio.peer import (
    ACCOUNT_SID,
    AUTH_TOKEN,
    PUBLIC_URL,
    FakeTwilioRest,
    serve_agent_on_twilio,
)
from tests.fakes.asr_server import ScriptedASRServer
from tests.fakes.llm_server import ScriptedLLMServer
from tests.support import REPO_ROOT

HERE = Path(__file__).parent
PATIENT, CLINIC = "+15551234567", "+15552223333"

LLM_SCRIPT = {
    "rules": [
        {"match": "change it", "reply": tool_call("update_appointment", day="Thursday", time="3 PM")},
        {"match": "hello", "reply": tool_call("get_appointment")},
    ]
}


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


async def test_reminder_call_is_placed_then_rescheduled(tmp_path, monkeypatch, tiny_engine):
    monkeypatch.setenv("REMINDER_DB", str(tmp_path / "reminders.sqlite3"))
    llm, asr, rest = ScriptedLLMServer(LLM_SCRIPT), ScriptedASRServer(), FakeTwilioRest()
    async with llm.serve() as llm_url, asr.serve() as asr_url, rest.running() as rest_url:
        agent = scripted_agent(HERE / "agent.toml", tiny_engine, llm_url, asr_url, tmp_path / "calls")
        # the agent is served while the command dials (as with `duetaspan serve` running in another shell)
        (code, call_sid, err), _ = await asyncio.gather(place_call(rest_url), agent.start())
        assert code == 0, err
        [created] = rest.requests
        assert created["form"]["To"] == PATIENT and created["form"]["Url"] == f"{PUBLIC_URL}/twilio/voice"
        assert re.fullmatch(r"CA[0-9a-f]{32}|CA\d{32}", call_sid)
        try:
            async with capture_sessions(agent) as sessions:
                async with serve_agent_on_twilio(agent, rest_url) as (peer, _service):
                    # the patient answers: Twilio fetches the webhook the command gave it, for this CallSid
                    answered = {"CallSid": call_sid, "AccountSid": ACCOUNT_SID, "From": CLINIC, "To": PATIENT,
                                "Direction": "outbound-api", "CallStatus": "in-progress"}  # fmt: skip
                    status, twiml = await peer.post_form("/twilio/voice", answered)
                    assert status == 200, twiml
                    url = re.search(r'<Stream [^>]*url="([^"]+)"', twiml)[1]
                    async with peer.open_stream(url) as ws:
                        patient, reader = await answer_twilio_stream(ws, call_sid, ACCOUNT_SID, sessions)
                        asr.default = "Hello?"
                        await patient.say("greeting", seconds=0.8)
                        appointment = await patient.ask()
                        asr.default = "Oh, Tuesday doesn't work. Could we change it to Thursday at 3 pm?"
                        await patient.say("greeting", seconds=1.0)
                        moved = await patient.ask()
                        await patient.stop()  # the patient hangs up
                        await asyncio.wait_for(reader, 10)
                    context = sessions[0].context
                    record_path = tmp_path / "calls" / f"{call_sid}.json"
                    await wait_for(record_path.exists, what="the artifacts")
        finally:
            await agent.stop()

    assert context.called == PATIENT and context.caller == CLINIC
    assert isinstance(appointment, SpanFrame) and appointment.tool == "get_appointment"
    assert appointment.reference == (
        "(tool result) Jordan Lee has a cleaning at Harbor Dental on Tuesday at 10 AM, not yet confirmed."
    )
    assert isinstance(moved, SpanFrame) and moved.tool == "update_appointment"
    assert moved.arguments == {"day": "Thursday", "time": "3 PM"}
    assert moved.reference == "(tool result) Moved the cleaning to Thursday at 3 PM, confirmed."
    db = sqlite3.connect(tmp_path / "reminders.sqlite3")
    assert db.execute("SELECT day, time, status FROM appointments").fetchall() == [
        ("Thursday", "3 PM", "confirmed")
    ]
    slots = db.execute("SELECT day || ' ' || time FROM open_slots ORDER BY 1").fetchall()
    assert ("Thursday 3 PM",) not in slots and ("Tuesday 10 AM",) in slots
    record = json.loads(record_path.read_text())
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
