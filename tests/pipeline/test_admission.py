"""One call budget (`duetaspan.pipeline.admission`): slots by call id with references, reservations that
lapse, the drain's refusals and its end of the live calls; and the agent's budget shared by a Pipecat
service of the user's own pipeline and the Twilio webhook on a real loopback server."""

from __future__ import annotations

import asyncio

import pytest

from duetaspan import Agent
from duetaspan.pipeline.admission import Admission, NotAdmitted, Refusal, Slot
from duetaspan.pipeline.runner import EngineFull
from tests.adapters.twilio.peer import serve_twilio, twilio_service
from tests.pipeline.scripted_engine import ScriptedEngine


def test_slots_are_counted_by_call_id_with_references():
    admission = Admission(2)
    first = admission.try_acquire("twilio", "CA1")
    assert isinstance(first, Slot) and admission.free == 1
    again = admission.try_acquire("pipecat", "CA1")  # the call's own pipeline takes the reserved slot
    assert again is first and first.refs == 2 and admission.free == 1
    assert isinstance(admission.try_acquire("webrtc", "web-1"), Slot)
    busy = admission.try_acquire("sip", "x")
    assert isinstance(busy, Refusal) and busy.reason == "busy" and not busy
    first.release()
    assert admission.held == 2  # one reference left
    first.release()
    assert admission.held == 1 and admission.free == 1
    first.release()  # past zero: nothing happens to the others
    assert admission.held == 1
    assert Admission(lambda: 0).try_acquire("twilio", "CA2").reason == "not_ready"


def test_a_reservation_lapses_unless_held():
    now = [0.0]
    admission = Admission(1, clock=lambda: now[0])
    reserved = admission.try_acquire("twilio", "CA1", ttl_s=30)
    now[0] = 31.0
    assert admission.held == 0 and admission.get("CA1") is None
    kept = admission.try_acquire("twilio", "CA2", ttl_s=30)
    assert isinstance(kept, Slot) and reserved is not kept
    kept.hold()  # the stream arrived
    now[0] = 100.0
    assert admission.held == 1


def test_a_drain_waits_for_an_unredeemed_reservation_only_briefly():
    """A webhook answered just before the drain still gets its stream, but a token nobody redeems does not
    hold the exit up for its whole 30 s TTL (Ctrl-C on a laptop after one test call)."""
    from duetaspan.pipeline.admission import DRAIN_RESERVATION_GRACE_S

    now = [0.0]
    admission = Admission(2, clock=lambda: now[0])
    reserved = admission.try_acquire("twilio", "CA-pending", ttl_s=30)
    live = admission.try_acquire("twilio", "CA-live", ttl_s=30)
    live.hold()
    assert admission.start_drain("SIGINT")
    now[0] = DRAIN_RESERVATION_GRACE_S - 1
    assert admission.get("CA-pending") is reserved  # it may still arrive
    now[0] = DRAIN_RESERVATION_GRACE_S + 1
    assert admission.get("CA-pending") is None and admission.held == 1  # the live call is untouched
    now[0] = 1000.0
    assert admission.get("CA-live") is live


async def test_draining_refuses_new_calls_and_ends_the_live_ones_with_a_reason():
    admission = Admission(4)
    live = admission.try_acquire("twilio", "CA1")
    reserved = admission.try_acquire("twilio", "CA2", ttl_s=30)
    assert isinstance(live, Slot) and isinstance(reserved, Slot)
    ended: list[str] = []

    async def hang_up() -> None:
        ended.append("CA1")
        live.release()

    live.on_end(hang_up)
    assert admission.start_drain("SIGTERM") and not admission.start_drain("again")
    assert admission.free == 0
    refused = admission.try_acquire("webrtc", "web-1")
    assert isinstance(refused, Refusal) and refused.reason == "draining" and "SIGTERM" in refused.message
    assert admission.try_acquire("pipecat", "CA1") is live  # an admitted call's own pipeline still gets it
    live.release()
    assert not await admission.wait_empty(0.2)
    assert await admission.end_all("shutdown") == 2
    assert ended == ["CA1"] and live.ended_by == "shutdown"
    assert await admission.wait_empty(5) and admission.held == 0  # the unused reservation went too


async def test_a_pipecat_service_and_the_twilio_webhook_share_the_agents_slots(tmp_path):
    agent = Agent(persona="You are Ada.", engine=ScriptedEngine(max_slots=2), router=False, max_calls=2)
    async with agent:

        async def never(call) -> None:
            raise AssertionError("no stream in this test")

        twilio = twilio_service(never, admission=agent.admission)
        async with serve_twilio(twilio) as peer:
            own = agent.service("CA-own-pipeline")  # a user's own Pipecat pipeline
            await own.attach()
            assert agent.admission.get("CA-own-pipeline") is own.admitted and agent.free_slots == 1
            status, body = await peer.voice("CA-phone-1")
            assert status == 200 and "<Stream" in body
            status, body = await peer.voice("CA-phone-2")  # both slots taken, one per transport
            assert status == 200 and "<Stream" not in body and "<Say>" in body, body
            await own.close()  # the pipeline ended: its slot is free
            status, body = await peer.voice("CA-phone-3")
            assert status == 200 and "<Stream" in body
            agent.admission.start_drain("test")
            status, body = await peer.voice("CA-phone-4")
            assert '<Reject reason="busy" />' in body, body
            late = agent.service("CA-late")
            with pytest.raises(EngineFull) as refused:
                await late.attach()
            assert isinstance(refused.value, NotAdmitted) and refused.value.refusal.reason == "draining"
            await late.close()
            await asyncio.sleep(0)
