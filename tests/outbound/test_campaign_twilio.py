"""E.164 rows of a campaign are dialled through Twilio's REST API from the server (`agent.dial("+1555...")`):
the fake Twilio REST API takes each `calls.create`, and Twilio's side plays a real Media Stream over a
WebSocket for the numbers that answer, or reports busy / no-answer through the signed status callback. Both
stores; the outcomes, the retry of a busy number, and no slot left held."""

from __future__ import annotations

import asyncio
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
        async with dialling_agent(tmp_path, fake) as (agent, peer, service, _sessions):
            box.append(peer)
            service.settings = service.settings.model_copy(update={"phone_number": FROM})
            await create_campaign(store, cfg, "tw", parse_contacts("to\n" + "\n".join([*ANSWER, BUSY, RINGS])), {})
            runner = CampaignRunner(store, AgentDialer(agent), cfg, free_slots=lambda: agent.free_slots)
            runner.start()
            status = await CampaignHandle(store, "tw").wait(poll_s=0.2, timeout_s=480)
            await runner.stop()
            runner = None
            # the last call's slot goes back as its pipeline closes, just after the call ended
            await wait_for(lambda: agent.admission.held == 0 and agent.free_slots == agent.max_calls, 30)
    finally:
        if runner is not None:
            await runner.stop()
        await store.close()
    assert status["counts"] == {"answered": 3, "busy": 1, "no-answer": 1}
    assert status["attempts"] == 6  # the busy number: twice (max_attempts 2)
    placed = [e["form"]["To"] for e in fake.requests if e["path"].endswith("/Calls.json")]
    assert sorted(placed) == sorted([*ANSWER, BUSY, BUSY, RINGS])
