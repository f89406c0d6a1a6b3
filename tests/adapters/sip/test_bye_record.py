"""Our own BYE's outcome in the stored call record, against SIPp as the caller and a real agent (`tiny-random`):
the agent's `end_call` sends BYE; a caller that answers it 200 leaves `meta.bye = {"by": "us", "outcome":
"200"}` in the `.json` on disk; a caller that never answers leaves `"no response"` with its detail ("no answer
in 64*T1 s", T1 shortened here so the give-up comes in 6.4 s, not 32 s). The record closes, and the agent's
slot is free, while our BYE is still unanswered (`"pending"` in the `.jsonl` line written at the close); the
outcome is appended when it lands, so the `.json` and a rebuild from the `.jsonl` agree."""

from __future__ import annotations

import asyncio
import json

import pytest

from duetaspan.adapters.sip.bridge import agent_call_handler
from duetaspan.agent import Agent
from duetaspan.pipeline.artifacts import consolidate, read_events
from duetaspan.testing.sessions import capture_sessions
from tests.adapters.sip.leaks import checked_endpoint
from tests.adapters.sip.peer import needs_sipp, run_sipp, scenario, sip_e2e, wait_for

pytestmark = [needs_sipp, sip_e2e, pytest.mark.slow]
T1 = 0.1  # 64*T1 = 6.4 s: long enough that the record closes first on a loaded box, short for CI


def _stem(call_id: str) -> str:
    return call_id.replace("@", "_")


async def _agent_hangs_up(ep, sessions, tmp_path, name: str, **values) -> tuple[object, object]:
    """One SIPp call (scenario `name`) that the agent ends with `end_call`; returns (the call, SIPp's result)."""
    path = scenario(name, tmp_path, USER="agent", BYE_TIMEOUT_MS=30000, **values)
    before = len(sessions)
    sipp = asyncio.create_task(run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf", str(path), "-m", "1", name=name))
    await wait_for(lambda: len(sessions) > before and bool(ep.calls), what="the call to reach the agent")
    call = next(iter(ep.calls.values()))
    sessions[-1].context.request_action("end_call", reason="done")
    await wait_for(lambda: sessions[-1].record is not None, timeout_s=60, what="the record to close")
    return call, sipp


async def test_our_bye_outcome_is_in_the_stored_record(tmp_path):
    agent = Agent(model="tiny-random", device="cpu", router=False, record_dir=tmp_path, seed=0, max_calls=2)
    sessions = capture_sessions(agent)
    async with agent, checked_endpoint(agent_call_handler(agent), max_calls=2, timer_t1_s=T1) as ep:
        # SIPp answers our BYE 200
        call, sipp = await _agent_hangs_up(ep, sessions, tmp_path, "bye_from_agent")
        got = await sipp
        assert got.rc == 0, got.output + got.errors
        json_path = tmp_path / f"{_stem(call.call_sid)}.json"
        await wait_for(lambda: json.loads(json_path.read_text())["meta"].get("bye", {}).get("outcome") == "200",
                       timeout_s=10, what="the 200 in the record")  # fmt: skip
        answered = json.loads(json_path.read_text())["meta"]["bye"]
        assert answered["by"] == "us" and 0 <= answered["after_s"] < 64 * T1, answered

        # SIPp never answers it: our BYE is retransmitted for 64*T1, then given up
        hold_ms = int(64 * T1 * 1000) + 1000
        call, sipp = await _agent_hangs_up(ep, sessions, tmp_path, "bye_unanswered", HOLD_MS=hold_ms)
        pending_at_close = call.signalling.get("BYE")
        slots_at_close = agent.free_slots
        json_path = tmp_path / f"{_stem(call.call_sid)}.json"
        await wait_for(lambda: json.loads(json_path.read_text())["meta"]["bye"]["outcome"] == "no response",
                       timeout_s=64 * T1 + 20, what="the give-up in the record")  # fmt: skip
        got = await sipp
        assert got.rc == 0, got.output + got.errors
    record = json.loads(json_path.read_text())
    bye = record["meta"]["bye"]
    assert bye == {"by": "us", "outcome": "no response", "after_s": bye["after_s"],
                   "detail": f"no answer in {64 * T1:g} s"}, bye  # fmt: skip
    assert 64 * T1 - 0.5 <= bye["after_s"] <= 64 * T1 + 5, bye
    # the record closed and the agent's slot was free before the give-up: not held for our BYE
    assert pending_at_close == "pending" and slots_at_close == agent.max_calls
    events = read_events(tmp_path / f"{_stem(call.call_sid)}.jsonl")
    kinds = [(e["type"], (e.get("bye") or {}).get("outcome")) for e in events if e["type"] in ("meta", "call_end")]
    assert kinds[-3:] == [("meta", "pending"), ("call_end", None), ("meta", "no response")], kinds
    assert consolidate(events)["meta"] == record["meta"]  # a rebuild from the event log agrees
    assert record["complete"] is True and record["meta"]["transport"] == "sip"
