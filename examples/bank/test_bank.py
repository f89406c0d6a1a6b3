"""The bank line end to end on CPU over a real Twilio Media Stream: caller ID from the signed webhook, a PIN
typed as DTMF, balance only after verification, a card lock whose card digits are redacted in the artifacts,
and a transfer to a human carried out through (a loopback fake of) Twilio's REST API. Driven with
`duetaspan.testing`'s scripted caller on its "twilio" transport."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

from duetaspan.agent import Agent
from duetaspan.registry import REDACTED, CallContext
from duetaspan.testing import scripted_call, tool_call, wait_until
from duetaspan.testing.twilio import ACCOUNT_SID
from tests.adapters.twilio.peer import FakeTwilioRest

HERE = Path(__file__).parent
CALLER = "+15550001111"


async def test_bank_call_verifies_by_keypad_locks_a_card_and_transfers(tmp_path, monkeypatch, tiny_engine,
                                                                       scripted_llm, scripted_asr):  # fmt: skip
    monkeypatch.setenv("BANK_DB", str(tmp_path / "bank.sqlite3"))
    scripted_llm.on("human", tool_call("transfer_call", destination="human"))
    scripted_llm.on("lock", tool_call("lock_card", last4="4242"))
    scripted_llm.on("balance", tool_call("get_balance"))
    rest = FakeTwilioRest()
    agent = Agent.from_config(HERE / "agent.toml", engine=tiny_engine, max_calls=1, seed=0,
                              record_dir=tmp_path / "calls")  # fmt: skip
    async with rest.running() as rest_url:
        async with scripted_call(agent, CALLER, transport="twilio", llm=scripted_llm, asr=scripted_asr,
                                 call_id="CA-bank", rest_url=rest_url) as call:  # fmt: skip
            await call.say(
                "account_balance", heard="Can you tell me my account balance, please?", seconds=1.0
            )
            before_pin = await call.ask()
            await call.press("2468#")
            await call.say("account_balance", heard="Okay, I typed my PIN. What's my balance?", seconds=1.0)
            balance = await call.ask()
            await call.say("Please lock my card ending in four two four two.")
            locked = await call.ask()
            await call.say("Thanks. Can I talk to a human about a loan?")
            transfer = await call.ask()
            await call.silence(0.5)
            await wait_until(lambda: rest.requests, within_s=10, what="the transfer through REST")
            context = call.session.context

    # caller ID and keypad reached the tools through the call context
    assert context.caller == CALLER and context.dtmf == "2468#"
    before_pin.expect_tool("get_balance").expect_span(contains="type their four-digit PIN on the keypad")
    balance.expect_span()
    assert balance.reference == "(tool result) Sam Carter, checking balance: $1,234.56."
    locked.expect_tool("lock_card", last4=REDACTED)  # redacted in events, spans and artifacts
    assert locked.frame.arguments == {"last4": REDACTED}
    db = sqlite3.connect(tmp_path / "bank.sqlite3")
    assert db.execute("SELECT last4, locked FROM cards").fetchall() == [("4242", 1)]
    transfer.expect_tool("transfer_call", destination="human")
    assert transfer.reference == "(tool result) Transferring the call to human now."
    # the live call was handed to the human's number through Twilio's REST API
    [redirect] = rest.requests
    assert redirect["path"] == f"/2010-04-01/Accounts/{ACCOUNT_SID}/Calls/CA-bank.json"
    assert "<Dial" in redirect["form"]["Twiml"] and "+15550009999" in redirect["form"]["Twiml"]
    # artifacts: four spans; the card digits typed into the tool never appear as arguments
    assert call.line.closed  # the server closed the stream after the transfer
    text = (tmp_path / "calls" / "CA-bank.json").read_text()
    record = json.loads(text)
    assert record == call.record
    assert [s["reference"] for s in call.spans] == [
        o.reference for o in (before_pin, balance, locked, transfer)
    ]
    # the PIN as digits of its own, not inside a timing's decimals ("at_ms": 1046.2468810001155 failed a CI run)
    assert '"last4": "4242"' not in text and not re.search(r"(?<![\d.])2468(?!\d)", text)
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
