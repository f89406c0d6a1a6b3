"""E.164 rows of a campaign are dialled through Twilio's REST API from the server (`agent.dial("+1555...")`):
the fake Twilio REST API takes each `calls.create`, and Twilio's side plays a real Media Stream over a
WebSocket for the numbers that answer, or reports busy / no-answer through the signed status callback. Both
stores; the outcomes, the retry of a busy number, no slot left held, and each answered call carries its row's
variables (`profile`: what `{name}` in the persona reads) and campaign, as a `sip:` row's call does, without
sending them to Twilio. With answer detection on (`[outbound] detect`), the who-answered outcomes of Twilio
calls are the attempts' outcomes and drive `[campaign.retry]`, as over SIP (tests/outbound/
test_campaign_voicemail.py)."""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest

from duetaspan.agent import Agent
from duetaspan.config import AgentConfig
from duetaspan.config.store import CampaignConfig, RetryRule
from duetaspan.outbound.contacts import parse_contacts
from duetaspan.outbound.handle import CampaignHandle, create_campaign
from duetaspan.outbound.scheduler import AgentDialer, CampaignRunner
from duetaspan.serving import twilio_dial_outcome
from duetaspan.store import Clock, open_store
from duetaspan.testing.sessions import capture_sessions
from tests.adapters.twilio.peer import ACCOUNT_SID, FakeTwilioRest, renumber, serve_agent_on_twilio
from tests.adapters.twilio.test_dial import FROM, dialling_agent, wait_for
from tests.outbound.test_answer_calls import ANSWERS, LABELS, _first_sound_s, callee_stream
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


async def run_campaign(agent, sessions: list, store, cfg: CampaignConfig, name: str, rows: str, calls: int):
    """Campaign `name` of the CSV `rows`, run from `agent` until done; then every slot back and `calls` call
    records written. Returns the campaign and its final status."""
    camp = await create_campaign(store, cfg, name, parse_contacts(rows), {})
    runner = CampaignRunner(store, AgentDialer(agent), cfg, free_slots=lambda: agent.free_slots)
    runner.start()
    try:
        status = await CampaignHandle(store, name).wait(poll_s=0.2, timeout_s=480)
    finally:
        await runner.stop()
    # the last call's slot goes back as its pipeline closes, just after the call ended
    await wait_for(lambda: agent.admission.held == 0 and agent.free_slots == agent.max_calls, 30)
    await wait_for(lambda: len(sessions) == calls and all(s.record is not None for s in sessions), 30)
    return camp, status


async def test_e164_rows_are_dialled_through_twilio(tmp_path, store_target):
    box: list = []
    fake = FakeTwilioRest(on_create=twilio_side(box))
    store = await open_store(store_target, clock=Clock(offset_s=MONDAY_17_UTC - time.time()))
    cfg = CampaignConfig(max_concurrent=2, calls_per_minute=1000, reserve_inbound=0, max_attempts=2, poll_s=0.1,
                         ring_timeout_s=10, retry={"busy": RetryRule(delay_s=0.2)})
    try:
        async with dialling_agent(tmp_path, fake) as (agent, peer, service, sessions):
            box.append(peer)
            agent.config.persona.prompt = "You call {name} about the {appointment_time} appointment."
            service.settings = service.settings.model_copy(update={"phone_number": FROM})
            rows = "to,name,appointment_time\n" + "".join(f"{n},Person {i},{i + 1} pm\n" for i, n in enumerate(ANSWER))
            camp, status = await run_campaign(agent, sessions, store, cfg, "tw", rows + f"{BUSY},,\n{RINGS},,\n", 3)
    finally:
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


VOICEMAIL, PERSON = "+15551230011", "+15551230012"


@pytest.mark.serial  # the verdicts and the message run in real time against the callees' streams
async def test_a_detected_twilio_campaign_leaves_its_message_after_the_beep_and_retries_per_outcome(
    tmp_path, store_target
):
    """One number is a voicemail box (a greeting, then a 900 Hz beep), one a person ("Hello, Priya here.").
    With `voicemail_left = {delay_s = 0.5}` and `max_attempts = 2`: the box is dialled twice through Twilio,
    each time the message reaches it only after the beep, and ends `voicemail_left`; the person is dialled once
    and ends `human` (no rule: final); no slot is left held."""
    plays = {VOICEMAIL: ("greeting_beep.wav", 6.0), PERSON: ("hello.wav", 3.0)}
    box: list = []
    heard: list[tuple[str, dict]] = []  # (number, {"t0": stream time 0, "got": what the callee received})

    async def callee(sid: str, form: dict) -> None:
        peer = box[0]
        base = {"CallSid": sid, "AccountSid": ACCOUNT_SID}
        await peer.post_form("/twilio/status", {**base, "CallStatus": "ringing"})
        await asyncio.sleep(0.2)
        await peer.post_form("/twilio/status", {**base, "CallStatus": "in-progress"})
        url, messages = callee_stream(*plays[form["To"]], sid, form)
        async with peer.open_stream(url) as ws:
            played = {"t0": time.monotonic()}
            played["got"] = await peer.play(ws, messages)
            heard.append((form["To"], played))

    config = AgentConfig.from_dict({"outbound": {"detect": True, "voicemail_wav": str(ANSWERS / "hello.wav")}},
                                   base_dir=tmp_path)  # fmt: skip
    agent = Agent(model="tiny-random", device="cpu", router=False, record_dir=tmp_path / "rec", seed=0,
                  max_calls=2, config=config)  # fmt: skip
    sessions = capture_sessions(agent)
    fake = FakeTwilioRest(on_create=callee)
    store = await open_store(store_target, clock=Clock(offset_s=MONDAY_17_UTC - time.time()))
    cfg = CampaignConfig(max_concurrent=2, calls_per_minute=1000, reserve_inbound=0, max_attempts=2, poll_s=0.1,
                         ring_timeout_s=20, retry={"voicemail_left": RetryRule(delay_s=0.5)})  # fmt: skip
    try:
        async with fake.running() as rest_url, agent, serve_agent_on_twilio(agent, rest_url) as (peer, service):
            box.append(peer)
            agent.twilio_service = service  # as `serve(twilio=True)` sets it
            service.dialer.on_dial = twilio_dial_outcome(agent, None)
            service.settings = service.settings.model_copy(update={"phone_number": FROM})
            camp, status = await run_campaign(agent, sessions, store, cfg, "vm", f"to\n{VOICEMAIL}\n{PERSON}\n", 3)
            await wait_for(lambda: len(heard) == 3, 30)
    finally:
        await store.close()
    assert status["counts"] == {"voicemail_left": 1, "human": 1}, status
    assert status["attempts"] == 3
    placed = [e["form"]["To"] for e in fake.requests if e["path"].endswith("/Calls.json")]
    assert sorted(placed) == sorted([VOICEMAIL, VOICEMAIL, PERSON])
    # each attempt's verdicts, outcome and campaign are in its record; the box heard nothing before its beep
    beep = LABELS["greeting_beep.wav"]["beep_at_s"]
    attempts = {VOICEMAIL: [], PERSON: []}
    for session in sessions:
        number = session.call.called
        record = json.loads((tmp_path / "rec" / f"{session.call.call_id}.json").read_text())
        assert record["meta"]["campaign_id"] == camp["id"] and record["meta"]["direction"] == "outbound"
        attempts[number].append(session.context.metadata["attempt"])
        if number == VOICEMAIL:
            assert record["meta"]["outcome"] == "voicemail_left", record["meta"]
            assert abs(record["meta"]["answer"]["beep_at_s"] - beep) < 0.25
        else:
            assert record["meta"]["answer"]["verdict"] == "human", record["meta"]
    assert sorted(attempts[VOICEMAIL]) == [1, 2] and attempts[PERSON] == [1]
    for number, played in heard:
        first = _first_sound_s(played)
        assert first is not None, number  # the agent was heard: the message, or its answer to the person
        if number == VOICEMAIL:
            assert first > beep + 0.3, (first, beep)  # never before the beep (it lasts 0.37 s)
