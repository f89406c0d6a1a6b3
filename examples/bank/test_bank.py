"""The bank line end to end on CPU over a real Twilio Media Stream: caller ID from the signed webhook, a PIN
typed as DTMF, balance only after verification, a card lock whose card digits are redacted in the artifacts,
and a transfer to a human carried out through (a loopback fake of) Twilio's REST API."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

from duetaspan.pipeline.frames import SpanFrame
from duetaspan.registry import REDACTED, CallContext
from examples.testing import answer_twilio_stream, capture_sessions, scripted_agent, tool_call, wait_for
from tests.adapters.twilio.peer import (
    ACCOUNT_SID,
    FakeTwilioRest,
    serve_agent_on_twilio,
)
from tests.fakes.asr_server import ScriptedASRServer
from tests.fakes.llm_server import ScriptedLLMServer

HERE = Path(__file__).parent
CALLER = "+15550001111"


LLM_SCRIPT = {
    "rules": [
        {"match": "human", "reply": tool_call("transfer_call", destination="human")},
        {"match": "lock", "reply": tool_call("lock_card", last4="4242")},
        {"match": "balance", "reply": tool_call("get_balance")},
    ]
}


async def test_bank_call_verifies_by_keypad_locks_a_card_and_transfers(tmp_path, monkeypatch, tiny_engine):
    monkeypatch.setenv("BANK_DB", str(tmp_path / "bank.sqlite3"))
    llm, asr, rest = ScriptedLLMServer(LLM_SCRIPT), ScriptedASRServer(), FakeTwilioRest()
    async with llm.serve() as llm_url, asr.serve() as asr_url, rest.running() as rest_url:
        agent = scripted_agent(HERE / "agent.toml", tiny_engine, llm_url, asr_url, tmp_path / "calls")
        async with agent, capture_sessions(agent) as sessions:
            async with serve_agent_on_twilio(agent, rest_url) as (peer, _service):
                url = await peer.stream_url("CA-bank", caller=CALLER)  # the signed voice webhook
                async with peer.open_stream(url) as ws:
                    caller, reader = await answer_twilio_stream(ws, "CA-bank", ACCOUNT_SID, sessions)

                    asr.default = "Can you tell me my account balance, please?"
                    await caller.say("account_balance", seconds=1.0)
                    before_pin = await caller.ask()
                    await caller.dtmf("2468#")
                    asr.default = "Okay, I typed my PIN. What's my balance?"
                    await caller.say("account_balance", seconds=1.0)
                    balance = await caller.ask()
                    asr.default = "Please lock my card ending in four two four two."
                    await caller.say("account_balance", seconds=1.0)
                    locked = await caller.ask()
                    asr.default = "Thanks. Can I talk to a human about a loan?"
                    await caller.say("account_balance", seconds=1.0)
                    transfer = await caller.ask()
                    await caller.silence(0.5)
                    await wait_for(lambda: rest.requests, within_s=10, what="the transfer through REST")
                    await asyncio.wait_for(reader, 10)  # the server closes the stream after the transfer
                context = sessions[0].context
                await wait_for(lambda: (tmp_path / "calls" / "CA-bank.json").exists(), what="the artifacts")

    # caller ID and keypad reached the tools through the call context
    assert context.caller == CALLER and context.dtmf == "2468#"
    assert isinstance(before_pin, SpanFrame) and before_pin.tool == "get_balance"
    assert "type their four-digit PIN on the keypad" in before_pin.reference
    assert isinstance(balance, SpanFrame)
    assert balance.reference == "(tool result) Sam Carter, checking balance: $1,234.56."
    assert isinstance(locked, SpanFrame) and locked.tool == "lock_card"
    assert locked.arguments == {"last4": REDACTED}  # redacted in events, spans and artifacts
    db = sqlite3.connect(tmp_path / "bank.sqlite3")
    assert db.execute("SELECT last4, locked FROM cards").fetchall() == [("4242", 1)]
    assert isinstance(transfer, SpanFrame) and transfer.tool == "transfer_call"
    assert transfer.reference == "(tool result) Transferring the call to human now."
    # the live call was handed to the human's number through Twilio's REST API
    [redirect] = rest.requests
    assert redirect["path"] == f"/2010-04-01/Accounts/{ACCOUNT_SID}/Calls/CA-bank.json"
    assert "<Dial" in redirect["form"]["Twiml"] and "+15550009999" in redirect["form"]["Twiml"]
    # artifacts: four spans; the card digits typed into the tool never appear as arguments
    text = (tmp_path / "calls" / "CA-bank.json").read_text()
    record = json.loads(text)
    assert [s["reference"] for s in record["spans"]] == [
        s.reference for s in (before_pin, balance, locked, transfer)
    ]
    assert '"last4": "4242"' not in text and "2468" not in text
    assert record["meta"] == {"caller": CALLER, "called": "+15552223333", "transport": "twilio"}


async def test_bank_tools_refuse_unverified_callers(tmp_path, monkeypatch):
    monkeypatch.setenv("BANK_DB", str(tmp_path / "bank.sqlite3"))
    from examples.bank import bank_tools as bank

    def call(fn, **kw):
        return fn(**kw)  # a @tool stays a plain callable

    wrong_pin = CallContext(caller=CALLER, dtmf="1111#")
    stranger = CallContext(caller="+15559990000", dtmf="2468#")
    good = CallContext(caller=CALLER, dtmf="99#2468#")  # a mistyped first try, then the PIN
    assert bank.typed_pin("2468") is None and bank.typed_pin("12#2468#") == "2468"
    assert call(bank.verify_caller, ctx=wrong_pin)["verified"] is False
    assert "No account" in call(bank.verify_caller, ctx=stranger)["sentence"]
    assert call(bank.get_balance, ctx=stranger)["verified"] is False
    assert call(bank.lock_card, last4="4242", ctx=wrong_pin)["locked"] is False
    assert call(bank.verify_caller, ctx=good)["sentence"] == "Verified: Sam Carter."
    history = call(bank.recent_transactions, ctx=good, count=2)
    assert history["sentence"] == "Harbor Coffee -$4.75 on 2026-03-02; City Power -$89.12 on 2026-03-01."
