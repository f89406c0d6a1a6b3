"""SIP calls from SIPp against a real agent (`tiny-random` engine, in process): caller audio streamed by
SIPp as G.711 mu-law and A-law RTP reaches the model (the record's caller channel), the agent's audio goes
back as paced 20 ms RTP, an RFC 4733 digit reaches the call context exactly as Twilio DTMF does, the record
on disk says `transport: "sip"`, `direction: "inbound"` and the call's RTP figures (packets, loss, jitter), and a
tool's `end_call` sends BYE."""

from __future__ import annotations

import asyncio
import contextlib
import json
import wave

import numpy as np
import pytest

from duetaspan.adapters.sip.bridge import agent_call_handler
from duetaspan.agent import Agent
from duetaspan.errors import ConfigError
from duetaspan.testing.sessions import capture_sessions
from tests.adapters.sip.leaks import checked_endpoint
from tests.adapters.sip.peer import (
    SIPP_SHARE,
    caller_stream,
    needs_sipp,
    run_sipp,
    scenario,
    sip_e2e,
    wait_for,
)
from tests.support import load_ulaw, worker_sip_settings

pytestmark = [needs_sipp, sip_e2e, pytest.mark.slow]


@contextlib.asynccontextmanager
async def agent_endpoint(record_dir):
    agent = Agent(model="tiny-random", device="cpu", router=False, record_dir=record_dir, seed=0, max_calls=2)
    sessions = capture_sessions(agent)
    async with agent, checked_endpoint(agent_call_handler(agent), max_calls=2) as ep:
        yield ep, agent, sessions


def _alaw(ulaw: bytes) -> bytes:
    """The same audio as G.711 A-law (aiortp's codec tables, not ours)."""
    from aiortp.codecs.g711 import PcmaCodec, PcmuCodec

    return PcmaCodec().encode(PcmuCodec().decode(ulaw))


@pytest.mark.parametrize(("pt", "codec"), [(0, "PCMU"), (8, "PCMA")])
async def test_caller_audio_and_dtmf_reach_the_agent(tmp_path, pt, codec):
    ulaw = load_ulaw("time_tokyo")
    pcap, talk_ms = caller_stream(tmp_path, ulaw if pt == 0 else _alaw(ulaw), pt)
    path = scenario("caller_audio", tmp_path, PT=pt, CODEC=codec, PCAP=pcap, TALK_MS=talk_ms + 500)
    async with agent_endpoint(tmp_path) as (ep, agent, sessions):
        got = await run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf", str(path), "-m", "1")
        assert got.rc == 0, got.output + got.errors
        await wait_for(lambda: len(ep.finished) == 1 and sessions and sessions[0].record is not None,
                       timeout_s=60, what="the call's record")  # fmt: skip
        call = next(iter(ep.finished.values()))
        stats = call.media.stats()
        context = sessions[0].context
        assert agent.free_slots == agent.max_calls and ep.free_slots == 2
    assert call.end_reason == "caller hung up (BYE)"
    assert stats["codec"] == codec
    assert context.dtmf == "1"  # RFC 4733 -> InputDTMFFrame -> the call context, as over Twilio
    assert stats["frames_in"] >= len(ulaw) // 160 * 0.8  # the caller's RTP reached the pipeline
    assert stats["packets_sent"] >= 25  # the agent's audio went back as RTP (each 80 ms frame: 4 packets)
    record = json.loads((tmp_path / f"{call.call_sid.replace('@', '_')}.json").read_text())
    assert record["complete"] is True
    assert record["meta"] == {"caller": "sipp", "called": "agent", "transport": "sip", "direction": "inbound",
                              "outcome": "answered", "sip_status": 200, "bye": {"by": "caller"}}  # fmt: skip
    rtp = record["rtp"]  # what aiortp counted on SIPp's real RTP stream, into the record
    assert rtp["codec"] == codec and rtp["packets_received"] >= len(ulaw) // 160 * 0.8
    assert 0.0 <= rtp["loss_fraction"] <= 1.0 and rtp["packets_lost"] >= 0
    assert 0.0 <= rtp["jitter_ms"] < 200.0 and rtp["packets_sent"] >= 25
    with wave.open(str(tmp_path / f"{call.call_sid.replace('@', '_')}.wav")) as w:
        frames = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").reshape(-1, 2)
    caller = frames[:, 0].astype(np.float32) / 32768
    assert np.sqrt(np.mean(caller**2)) > 0.01  # the recorded caller channel carries the fixture's speech


async def test_end_call_tool_sends_bye(tmp_path):
    path = scenario("bye_from_agent", tmp_path, USER="agent", BYE_TIMEOUT_MS=30000)
    async with agent_endpoint(tmp_path) as (ep, _agent, sessions):
        sipp = asyncio.create_task(run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf", str(path), "-m", "1"))
        await wait_for(lambda: bool(sessions) and bool(ep.calls), what="the call to reach the agent")
        sessions[0].context.request_action("end_call", reason="caller said goodbye")  # as the tool does
        got = await sipp
        await wait_for(lambda: len(ep.finished) == 1, what="the call to finish")
        call = next(iter(ep.finished.values()))
    assert got.rc == 0, got.output + got.errors  # SIPp received our BYE and answered it
    assert call.end_reason == "end_call: caller said goodbye"


def keypad(digits: str) -> str:
    names = {"#": "pound", "*": "star"}
    return "".join(
        f'  <nop><action><exec play_pcap_audio="{SIPP_SHARE}/dtmf_2833_{names.get(d, d)}.pcap"/></action></nop>\n'
        '  <pause milliseconds="600"/>\n'
        for d in digits
    )


async def test_bank_pin_check_works_over_sip(tmp_path, monkeypatch):
    """The bank example's `verify_caller` (caller ID + keypad PIN) on a SIP call: the caller's number from the
    INVITE's From, the PIN typed as RFC 4733 digits, exactly as over Twilio."""
    monkeypatch.setenv("BANK_DB", str(tmp_path / "bank.sqlite3"))
    from examples.bank import bank_tools as bank

    path = scenario("caller_keypad", tmp_path, CALLER="+15550001111", DIGITS=keypad("2468#"))
    async with agent_endpoint(tmp_path) as (ep, _agent, sessions):
        got = await run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf", str(path), "-m", "1")
        assert got.rc == 0, got.output + got.errors
        await wait_for(lambda: len(ep.finished) == 1 and bool(sessions), what="the call to finish")
        context = sessions[0].context
    assert context.caller == "+15550001111" and context.dtmf == "2468#"
    assert bank.verify_caller(ctx=context)["sentence"] == "Verified: Sam Carter."


async def test_agent_dial_places_a_sip_call_that_runs_on_the_agent(tmp_path):
    """`await agent.dial("sip:...")` while `agent.serve(sip=...)` runs: SIPp's `uas` answers, the call runs
    on the agent (its record says `transport: "sip"`), and the agent's `end_call` hangs up with BYE."""
    from tests.adapters.sip.peer import free_udp_port, udp_bound
    from tests.support import free_port

    agent = Agent(model="tiny-random", device="cpu", router=False, record_dir=tmp_path, seed=0, max_calls=1)
    sessions = capture_sessions(agent)
    with pytest.raises(ConfigError, match=r"agent\.serve\(sip=True\)"):
        await agent.dial("sip:service@127.0.0.1:9")
    sip = {"port": free_udp_port(), **worker_sip_settings()}  # this xdist worker's RTP block
    server = asyncio.create_task(agent.serve(sip=sip, port=free_port()))
    try:
        await wait_for(
            lambda: agent.sip_endpoint is not None and agent.started, timeout_s=120, what="the server"
        )
        callee_port = free_udp_port()
        callee = asyncio.create_task(
            run_sipp("", tmp_path, "-sn", "uas", "-m", "1", port=callee_port, name="callee")
        )
        await udp_bound(callee_port)
        result = await agent.dial(f"sip:service@127.0.0.1:{callee_port}", ring_timeout_s=20)
        assert result.outcome == "answered", result
        await wait_for(lambda: bool(sessions), what="the placed call to reach the agent")
        await asyncio.sleep(1.0)  # the call talks for a moment
        sessions[0].context.request_action("end_call", reason="done")
        got = await callee
        assert got.rc == 0, got.output + got.errors  # SIPp's uas got our BYE
        await wait_for(lambda: sessions[0].record is not None, timeout_s=30, what="the record")
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
    record = json.loads((tmp_path / f"{result.call_id.replace('@', '_')}.json").read_text())
    assert record["meta"]["transport"] == "sip" and record["complete"] is True
