"""Calls the server places through Twilio (`agent.dial("+1555...")`, `POST /admin/dial`): the fake Twilio REST
API takes `calls.create` with our inline `<Connect><Stream>` TwiML, and a callee plays Twilio over a real
WebSocket to the signed stream URL in it (real mu-law audio), or reports busy / no-answer through the signed
status callback; the outcome, the slot, the record and the admin route."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re

import aiohttp
import pytest

from duetaspan.access import ADMIN_TOKEN_ENV, BearerRole
from duetaspan.adapters.sip.admin import ANY_DIAL_PATH, DIAL_PATH, add_dial_route
from duetaspan.agent import Agent
from duetaspan.serving import twilio_dial_outcome
from duetaspan.testing.sessions import capture_sessions
from tests.adapters.twilio.peer import (
    ACCOUNT_SID,
    FakeTwilioRest,
    TwilioPeer,
    renumber,
    serve_agent_on_twilio,
)
from tests.support import load_twilio_stream

TO, FROM = "+15551234567", "+15557654321"
ADMIN = "admin-token-for-the-dial-test"


async def wait_for(predicate, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


def callee(peer_box: list, *, answer: bool = True, status: str | None = None, ring_s: float = 0.3):
    """Twilio's side of a placed call: ringing, then the stream (a recorded call) or a final status."""
    played: dict = {}

    async def run(sid: str, form: dict) -> None:
        peer: TwilioPeer = peer_box[0]
        base = {"CallSid": sid, "AccountSid": ACCOUNT_SID}
        await peer.post_form("/twilio/status", {**base, "CallStatus": "ringing"})
        await asyncio.sleep(ring_s)
        if status is not None:
            await peer.post_form("/twilio/status", {**base, "CallStatus": status})
        if not answer:
            return
        url = re.search(r'<Stream [^>]*url="([^"]+)"', form["Twiml"]).group(1)
        await peer.post_form("/twilio/status", {**base, "CallStatus": "in-progress"})
        async with peer.open_stream(url) as ws:
            played["got"] = await peer.play(ws, renumber(load_twilio_stream("time_tokyo"), sid), linger_s=0.3)

    return run, played


@contextlib.asynccontextmanager
async def dialling_agent(tmp_path, fake: FakeTwilioRest):
    agent = Agent(model="tiny-random", device="cpu", router=False, record_dir=tmp_path, seed=0, max_calls=2)
    sessions = capture_sessions(agent)
    async with fake.running() as rest_url, agent, serve_agent_on_twilio(agent, rest_url) as (peer, service):
        agent.twilio_service = service  # as `serve(twilio=True)` sets it
        service.dialer.on_dial = twilio_dial_outcome(agent, None)
        yield agent, peer, service, sessions


async def test_agent_dials_a_number_and_the_answered_call_runs_on_the_agent(tmp_path):
    box: list = []
    run, played = callee(box)
    fake = FakeTwilioRest(on_create=run)
    async with dialling_agent(tmp_path, fake) as (agent, peer, service, sessions):
        box.append(peer)
        result = await agent.dial(TO, caller=FROM, ring_timeout_s=20)
        assert result.outcome == "answered", result
        sid = result.call_id
        await wait_for(lambda: sid in service.finished and sessions and sessions[0].record is not None)
        assert agent.free_slots == agent.max_calls
    create = fake.requests[0]
    assert create["path"] == f"/2010-04-01/Accounts/{ACCOUNT_SID}/Calls.json"
    form = create["form"]
    assert form["To"] == TO and form["From"] == FROM and form["Timeout"] == "20" and "Url" not in form
    # our own signed stream URL, its single-use token spent by the callee's upgrade
    assert re.search(r'<Connect><Stream [^>]*url="wss://agent\.example\.test/twilio/stream/[\w-]{20,}"', form["Twiml"])
    assert form["StatusCallback"] == "https://agent.example.test/twilio/status"
    assert result.summary()["transport"] == "twilio" and result.summary()["twilio_status"] == "in-progress"
    record = json.loads((tmp_path / f"{sid}.json").read_text())
    assert record["complete"] is True and record["summary"]["frames"] >= 1
    meta = record["meta"]
    assert meta["direction"] == "outbound" and meta["outcome"] == "answered" and meta["transport"] == "twilio"
    assert meta["dial"]["to"] == TO and meta["dial"]["from"] == FROM and meta["dial"]["ring_s"] > 0.2
    assert played["got"].media_bytes()  # the agent spoke back over the stream


@pytest.mark.parametrize("status,outcome", [("busy", "busy"), ("no-answer", "no-answer"), ("failed", "failed")])
async def test_a_final_status_before_any_stream_is_the_outcome_and_is_recorded(tmp_path, status, outcome):
    box: list = []
    run, _ = callee(box, answer=False, status=status, ring_s=0.1)
    fake = FakeTwilioRest(on_create=run)
    async with dialling_agent(tmp_path, fake) as (agent, peer, service, _):
        box.append(peer)
        result = await agent.dial(TO, caller=FROM, ring_timeout_s=20)
        assert (result.outcome, result.status) == (outcome, status)
        assert agent.free_slots == agent.max_calls  # the slot held while it rang is free again
        assert service.tokens.pending == 0  # its stream token is void
    record = json.loads((tmp_path / f"{result.call_id}.json").read_text())
    assert record["summary"]["ended_by"] == outcome and record["summary"]["frames"] == 0
    assert record["meta"]["direction"] == "outbound" and record["meta"]["twilio_status"] == status


async def test_no_outcome_in_time_cancels_the_call_and_a_refused_create_fails(tmp_path):
    box: list = []
    run, _ = callee(box, answer=False, ring_s=0.0)  # rings and rings
    fake = FakeTwilioRest(on_create=run, refuse_numbers={"+15550000000"})
    async with dialling_agent(tmp_path, fake) as (agent, peer, service, _):
        box.append(peer)
        service.dialer.answer_margin_s = 0.5
        result = await agent.dial(TO, caller=FROM, ring_timeout_s=1)
        assert result.outcome == "no-answer" and "cancelled" in result.reason
        assert fake.requests[-1]["form"] == {"Status": "canceled"}
        refused = await agent.dial("+15550000000", caller=FROM, ring_timeout_s=5)
        assert refused.outcome == "failed" and "21219" in refused.reason and refused.call_id == ""
        assert agent.free_slots == agent.max_calls
        with pytest.raises(ValueError, match=r"E\.164"):
            await agent.dial(TO, ring_timeout_s=5)  # no caller ID and no [twilio] phone_number


async def test_a_cancelled_dial_cancels_its_ringing_call_and_frees_its_slot(tmp_path):
    """A dial cancelled while it rings (a campaign's scheduler gave up on it, the server stops) cancels the call
    through the REST API, frees its slot and voids its stream token: a late answer gets no stream."""
    box: list = []
    run, _ = callee(box, answer=False, ring_s=0.0)  # rings and rings
    fake = FakeTwilioRest(on_create=run)
    async with dialling_agent(tmp_path, fake) as (agent, peer, service, _):
        box.append(peer)
        dial = asyncio.create_task(agent.dial(TO, caller=FROM, ring_timeout_s=60))
        await wait_for(lambda: bool(service.dialer.pending))
        dial.cancel()
        with pytest.raises(asyncio.CancelledError):
            await dial
        assert fake.requests[-1]["form"] == {"Status": "canceled"}
        assert agent.free_slots == agent.max_calls and service.tokens.pending == 0
        assert not service.dialer.pending


async def test_admin_dial_route_places_twilio_calls_and_keeps_the_sip_route(tmp_path):
    from duetaspan.server import create_app
    from tests.adapters.twilio.peer import run_uvicorn

    box: list = []
    run, _ = callee(box, answer=False, status="busy", ring_s=0.1)
    fake = FakeTwilioRest(on_create=run)
    async with dialling_agent(tmp_path, fake) as (agent, peer, _service, _):
        box.append(peer)
        app = create_app()
        app.state.admin = BearerRole("admin", ADMIN, ADMIN_TOKEN_ENV)
        add_dial_route(app, None, twilio=agent.dial)
        auth = {"Authorization": f"Bearer {ADMIN}"}
        async with run_uvicorn(app) as base, aiohttp.ClientSession() as http:

            async def post(path: str, body: dict, headers: dict | None = None) -> tuple[int, dict]:
                async with http.post(base + path, json=body, headers=auth if headers is None else headers) as r:
                    return r.status, await r.json()

            status, data = await post(ANY_DIAL_PATH, {"to": TO, "from": FROM, "ring_timeout_s": 10})
            assert status == 200 and data["outcome"] == "busy" and data["transport"] == "twilio", data
            assert (await post(ANY_DIAL_PATH, {"to": TO}, headers={}))[0] == 401
            assert (await post(ANY_DIAL_PATH, {"to": "+1 555 hello"}))[0] == 400
            assert (await post(ANY_DIAL_PATH, {"to": TO, "from": "7001"}))[0] == 400
            # SIP is not served here: both routes say so; /admin/sip/dial still takes SIP URIs only
            status, data = await post(ANY_DIAL_PATH, {"to": "sip:7002@127.0.0.1"})
            assert status == 409 and "--sip" in data["error"]
            assert (await post(DIAL_PATH, {"to": "sip:7002@127.0.0.1"}))[0] == 409
    assert len([r for r in fake.requests if r["path"].endswith("Calls.json")]) == 1
