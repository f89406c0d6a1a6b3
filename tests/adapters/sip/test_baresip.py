"""baresip, a real softphone, dials the agent (`tiny-random`, in process): its `aufile` module plays a
fixture as the microphone, its `sndfile` module writes what it hears. The agent's audio must reach it
through at least 80 % of the call, the caller's speech must reach the agent's record, and the record's
`rtp` figures must count baresip's packets (loss fraction between 0 and 1, jitter, RTT). Gap statistics
belong in benchmarks/sip.py, not here."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from duetaspan.adapters.sip.bridge import agent_call_handler
from duetaspan.agent import Agent
from tests.adapters.sip.leaks import checked_endpoint
from tests.adapters.sip.peer import BARESIP, needs_baresip, sip_e2e, wait_for
from tests.adapters.sip.softphone import dial, softphone
from tests.adapters.sip.softphone import heard as heard_by

# serial: real-time calls whose seconds of audio heard (and DTMF) are asserted: they want a core when they ask
pytestmark = [needs_baresip, sip_e2e, pytest.mark.slow, pytest.mark.serial]


async def test_baresip_hears_the_agent_through_the_call(tmp_path):
    assert BARESIP is not None
    agent = Agent(model="tiny-random", device="cpu", router=False, record_dir=tmp_path, seed=0, max_calls=1)
    async with agent, checked_endpoint(agent_call_handler(agent), max_calls=1) as ep:
        # baresip's SIP port is picked once the agent is loaded, just before it starts: a port found free
        # before seconds of model loading may be another process's by then (baresip then exits at once)
        phone = softphone(tmp_path, "time_tokyo", pad_s=2.0)
        log = await dial(phone, ep.port, tmp_path)
        # a baresip that never started or never got through fails here, with its log, not after 30 s of waiting
        assert "Call established" in log, log[-3000:]
        await wait_for(lambda: len(ep.finished) == 1, timeout_s=30,
                       what=f"the call to finish (baresip's log ends: {log[-3000:]})")  # fmt: skip
        call = next(iter(ep.finished.values()))
        call_s = call.media.frames_in * 0.02  # the caller's 20 ms frames: how long media flowed
    assert call.end_reason == "caller hung up (BYE)"
    heard, _rate = heard_by(phone)
    assert call_s > 4.0
    assert len(heard) / 8000 >= 0.8 * call_s, (len(heard) / 8000, call_s)  # agent audio through the call
    windows = heard[: len(heard) // 160 * 160].reshape(-1, 160)
    audible = np.sqrt((windows**2).mean(axis=1)) > 1e-3
    assert audible.mean() >= 0.8, (
        audible.mean()
    )  # agent audio, not silence, in at least 80 % of 20 ms windows
    record = tmp_path / f"{call.call_sid}.json"
    assert record.is_file()
    rtp = json.loads(record.read_text())["rtp"]  # a softphone's real RTP (and RTCP) in the record
    assert rtp["packets_received"] >= call_s * 50 * 0.8 and 0.0 <= rtp["loss_fraction"] <= 1.0, rtp
    assert 0.0 <= rtp["jitter_ms"] < 200.0 and rtp["packets_sent"] > 0, rtp
    assert 0.0 <= rtp.get("rtt_ms", 0.0) < 1000.0, rtp  # present once baresip's report names our SR


async def test_send_dtmf_tool_reaches_baresip(tmp_path):
    """The built-in `send_dtmf` tool, run as the router would on a live call, presses keys that baresip
    decodes (RFC 4733)."""
    from duetaspan.adapters.sip.bridge import bind_actions
    from duetaspan.registry import CallContext, ToolRegistry
    from duetaspan.tools import send_dtmf

    assert BARESIP is not None
    phone = softphone(tmp_path, "greeting", pad_s=3.0)
    registry = ToolRegistry([send_dtmf])
    results = []

    async def presses_keys(call) -> None:
        context = CallContext(call_id=call.call_sid)
        bind_actions(call, context)
        await asyncio.sleep(0.5)
        results.append(await registry.call("send_dtmf", {"digits": "15#9"}, context))
        await call.ended.wait()

    async with checked_endpoint(presses_keys) as ep:
        log = await dial(phone, ep.port, tmp_path)
    assert results and results[0].ok, results
    # baresip names each key as its event starts; it reports an event's end only once the next one begins,
    # so the last key's end is not checked. The events are paced in real time (`CallMedia.send_dtmf_paced`:
    # the marker bit on the first packet, one every 20 ms; test_dtmf_pacing checks the packets themselves)
    events = [line for line in log.splitlines() if "received event:" in line]
    starts = [line.split("'")[1] for line in events if "(end=0)" in line]
    ends = [line.split("'")[1] for line in events if "(end=1)" in line]
    assert starts == list("15#9"), log[-3000:]
    assert ends[:3] == list("15#"), log[-3000:]
