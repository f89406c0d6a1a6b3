"""E.164 rows of a campaign are dialled through Twilio's REST API from the server (`agent.dial("+1555...")`):
the fake Twilio REST API takes each `calls.create`, and Twilio's side plays a real Media Stream over a
WebSocket for the numbers that answer, or reports busy / no-answer through the signed status callback. Both
stores; the outcomes, the retry of a busy number, no slot left held, and each answered call carries its row's
variables (`profile`: what `{name}` in the persona reads) and campaign, as a `sip:` row's call does, without
sending them to Twilio."""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest

from duetaspan.config.store import CampaignConfig, RetryRule
from duetaspan.outbound.contacts import parse_contacts
from duetaspan.outbound.handle import CampaignHandle, create_campaign
from duetaspan.outbound.scheduler import AgentDialer, CampaignRunner
from duetaspan.store import Clock, open_store
from tests.adapters.twilio.peer import ACCOUNT_SID, FakeTwilioRest, renumber
from tests.adapters.twilio.test_dial import FROM, dialling_agent, wait_for
from tests.support import load_twilio_stream

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
ANSWER = ["+15551230001", "+15551230002", "+15551230003"]
BUSY, RINGS = "+15551230004", "+15551230005"
MONDAY_17_UTC = 1772470800.0  # 2026-03-02 17:00 UTC: 12:00 in New York, 09:00 in Los Angeles


def twilio_side(box: list):
    async def run(sid: str, form: dict) -> None:
        peer = box[0]
        base = {"CallSid": sid, "AccountSid": ACCOUNT_SID}
        await peer.post_form("/twilio/status", {**base, "CallStatus": "ringing"})
        await asyncio.sleep(0.2)
        if form["To"] == BUSY:
            await peer.post_form("/twilio/status", {**base, "CallStatus": "busy"})
            return
        if form["To"] == RINGS:
            await peer.post_form("/twilio/status", {**base, "CallStatus": "no-answer"})
            return
        url = re.search(r'<Stream [^>]*url="([^"]+)"', form["Twiml"]).group(1)
        await peer.post_form("/twilio/status", {**base, "CallStatus": "in-progress"})
        async with peer.open_stream(url) as ws:
            await peer.play(ws, renumber(load_twilio_stream("time_tokyo"), sid)[:60], linger_s=0.2)

    return run


async def test_e164_rows_are_dialled_through_twilio(tmp_path, store_target):
    box: list = []
    fake = FakeTwilioRest(on_create=twilio_side(box))
    store = await open_store(store_target, clock=Clock(offset_s=MONDAY_17_UTC - time.time()))
    cfg = CampaignConfig(max_concurrent=2, calls_per_minute=1000, reserve_inbound=0, max_attempts=2, poll_s=0.1,
                         ring_timeout_s=10, retry={"busy": RetryRule(delay_s=0.2)})
    runner = None
    try:
        async with dialling_agent(tmp_path, fake) as (agent, peer, service, sessions):
            box.append(peer)
            agent.config.persona.prompt = "You call {name} about the {appointment_time} appointment."
            service.settings = service.settings.model_copy(update={"phone_number": FROM})
            rows = "to,name,appointment_time\n" + "".join(f"{n},Person {i},{i + 1} pm\n" for i, n in enumerate(ANSWER))
            camp = await create_campaign(store, cfg, "tw", parse_contacts(rows + f"{BUSY},,\n{RINGS},,\n"), {})
            runner = CampaignRunner(store, AgentDialer(agent), cfg, free_slots=lambda: agent.free_slots)
            runner.start()
            status = await CampaignHandle(store, "tw").wait(poll_s=0.2, timeout_s=480)
            await runner.stop()
            runner = None
            # the last call's slot goes back as its pipeline closes, just after the call ended
            await wait_for(lambda: agent.admission.held == 0 and agent.free_slots == agent.max_calls, 30)
            await wait_for(lambda: len(sessions) == 3 and all(s.record is not None for s in sessions), 30)
    finally:
        if runner is not None:
            await runner.stop()
        await store.close()
    assert status["counts"] == {"answered": 3, "busy": 1, "no-answer": 1}
    assert status["attempts"] == 6  # the busy number: twice (max_attempts 2)
    placed = [e["form"]["To"] for e in fake.requests if e["path"].endswith("/Calls.json")]
    assert sorted(placed) == sorted([*ANSWER, BUSY, BUSY, RINGS])
    # the row's variables reached each answered call (the persona's `{name}`), and its campaign its record
    for session in sessions:
        i = ANSWER.index(session.call.called)
        assert session.context.profile["name"] == f"Person {i}", session.call.params
        assert session.context.metadata["campaign"] == "tw" and session.context.metadata["attempt"] == 1
        assert agent.persona(session.context).text.startswith(f"You call Person {i} about the {i + 1} pm")
        record = json.loads((tmp_path / f"{session.call.call_id}.json").read_text())
        assert record["meta"]["campaign_id"] == camp["id"]
    # and never went to Twilio (the REST request carries only the number, our stream URL and the TwiML)
    assert not any("Person" in json.dumps(e["form"]) for e in fake.requests)
