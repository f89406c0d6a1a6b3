"""100 numbers in one campaign with `max_concurrent` 4, dialled over real SIP (the agent's SIP endpoint,
`agent.dial`) to SIPp callees that answer, reject with 486 or ring out, on the `tiny-random` engine on the
CPU, on both stores: every number ends with the right outcome (busy ones retried once, then final), numbers
on the do-not-call list and numbers whose local time is outside the window are never dialled, never more
than 4 calls at once, and afterwards no call slot, SIP call or RTP port is left held."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt

import pytest

from duetaspan.adapters.sip.bridge import agent_call_handler
from duetaspan.agent import Agent
from duetaspan.agent.dialing import dial_slots
from duetaspan.config.store import CampaignConfig, RetryRule
from duetaspan.outbound.contacts import parse_contacts
from duetaspan.outbound.handle import CampaignHandle, create_campaign
from duetaspan.outbound.scheduler import AgentDialer, CampaignRunner
from duetaspan.store import Clock, open_store
from tests.adapters.sip.peer import (
    endpoint_on_loopback,
    free_udp_port,
    needs_sipp,
    run_sipp,
    scenario,
    sip_e2e,
    udp_bound,
)
from tests.outbound.conftest import assert_nothing_held, cancel_all

pytestmark = [needs_sipp, sip_e2e, pytest.mark.slow, pytest.mark.timeout(600)]

MONDAY_NOON_UTC = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.UTC).timestamp()
HUNDRED_DEADLINE_S = 480.0  # the 100 numbers take ~15 s here; generous for a loaded CI box


class CountingDialer(AgentDialer):
    """The agent's real dial, with the number of dials in flight watched."""

    def __init__(self, agent) -> None:
        super().__init__(agent)
        self.live = self.max_live = 0
        self.dialled: list[str] = []

    async def dial(self, to, *, ring_timeout_s, params):
        self.live += 1
        self.max_live = max(self.max_live, self.live)
        self.dialled.append(to)
        try:
            result = await super().dial(to, ring_timeout_s=ring_timeout_s, params=params)
            if result.outcome == "answered":
                await result.call.ended.wait()
            return result
        finally:
            self.live -= 1


def stuck(status, runner, dialer, agent, ep, sipp, tmp_path) -> str:
    """What a campaign that did not finish was waiting on: its counts, the numbers this runner holds and its
    dials ringing, the dial slots (agent, endpoint), the endpoint's calls, ports and dialogs, and the callees
    (running or not, the last lines of their SIPp error files)."""
    calls = {cid: (call.end_reason or "up", call.ended.is_set()) for cid, call in ep.calls.items()}
    lines = [
        f"status: counts {status['counts']}, attempts {status['attempts']}",
        f"runner: held {sorted(c.contact.to for c in runner.held.values())}, ringing {runner.ringing}, "
        f"tasks {len(runner.tasks)}; dialer: {dialer.live} dials in flight",
        f"dial slots {dial_slots(agent)}: agent free {agent.free_slots} (admission held {agent.admission.held}), "
        f"endpoint free {ep.free_slots}",
        f"endpoint: calls {calls}, answering {sorted(ep.answering)}, RTP ports {sorted(ep.ports._allocated)}",
        f"aiosipua outbound calls: {sorted(ep.uas.uac._calls) if ep.uas is not None and ep.uas.uac else []}",
    ]
    for name, task in zip(("answer", "busy", "ring"), sipp, strict=True):
        errors = tmp_path / f"{name}-errors.txt"
        tail = errors.read_text(errors="replace").strip().splitlines()[-3:] if errors.is_file() else []
        lines.append(f"callee {name} (SIPp): {'exited' if task.done() else 'running'}; errors: {tail}")
    return "\n".join(lines)


async def test_hundred_numbers_max_concurrent_4(tmp_path, store_target):
    import time

    ports = {kind: free_udp_port() for kind in ("answer", "busy", "ring")}
    uri = lambda n, kind: f"sip:{n}@127.0.0.1:{ports[kind]}"  # noqa: E731
    rows = [(uri(f"+4420794610{i:02d}", "answer"), "") for i in range(50)]
    rows += [(uri(f"+4420794620{i:02d}", "busy"), "") for i in range(20)]
    rows += [(uri(f"+4420794630{i:02d}", "ring"), "") for i in range(10)]
    dnc = [uri(f"+4420794640{i:02d}", "answer") for i in range(10)]
    rows += [(n, "") for n in dnc]
    rows += [(uri(f"+4420794650{i:02d}", "answer"), "Pacific/Auckland") for i in range(10)]  # 01:00 there
    csv = "to,timezone\n" + "".join(f"{to},{tz}\n" for to, tz in rows)
    # one 200 per INVITE, no 180 (callee_holds_first.xml says why): with four calls at once on a loaded box our
    # INVITE is retransmitted before SIPp's answer lands, and SIPp's callee_answers.xml (180 then 200) aborts
    # such a call, which no RFC 3261 UAS does; this one answers the retransmission with its 200 again (our ACK
    # and the 200 for its BYE stay required)
    answers = scenario("callee_holds_first", tmp_path, HOLD_CALLS=0, HOLD_MS=0, TALK_MS=200)
    sipp = [
        asyncio.create_task(run_sipp("", tmp_path, "-sf", str(answers), "-m", "50", "-rtp_echo", "-l", "8",
                                     port=ports["answer"], timeout_s=540, name="answer")),
        asyncio.create_task(run_sipp("", tmp_path, "-sf", str(scenario("callee_busy", tmp_path)), "-m", "40",
                                     port=ports["busy"], timeout_s=540, name="busy")),
        asyncio.create_task(run_sipp("", tmp_path, "-sf", str(scenario("callee_rings", tmp_path)), "-m", "10",
                                     port=ports["ring"], timeout_s=540, name="ring")),
    ]
    for port in ports.values():
        await udp_bound(port)
    store = await open_store(store_target, clock=Clock(offset_s=MONDAY_NOON_UTC - time.time()))
    cfg = CampaignConfig(max_concurrent=4, calls_per_minute=10000, reserve_inbound=1, max_attempts=2,
                         ring_timeout_s=1.0, poll_s=0.1, retry={"busy": RetryRule(delay_s=0.3, jitter_s=0.2)})
    agent = Agent(model="tiny-random", device="cpu", router=False, seed=0, max_calls=6)
    runner = None
    try:
        async with agent, endpoint_on_loopback(agent_call_handler(agent), max_calls=6) as ep:
            agent.sip_endpoint = ep
            ep.shared = agent.admission
            async with store.transaction() as tx:
                await tx.dnc_add(dnc, now=0.0)
            await create_campaign(store, cfg, "hundred", parse_contacts(csv), {})
            dialer = CountingDialer(agent)
            runner = CampaignRunner(store, dialer, cfg, free_slots=lambda: dial_slots(agent))
            runner.start()
            handle = CampaignHandle(store, "hundred")
            # done but for the 10 numbers waiting for their window (09:00 in Auckland)
            deadline = asyncio.get_running_loop().time() + HUNDRED_DEADLINE_S
            while True:
                status = await handle.status()
                if status["counts"].get("pending") == 10 and not status["counts"].get("dialling"):
                    break
                if asyncio.get_running_loop().time() > deadline:
                    dump = stuck(status, runner, dialer, agent, ep, sipp, tmp_path)
                    pytest.fail(f"the campaign did not finish in {HUNDRED_DEADLINE_S:.0f} s\n{dump}")
                await asyncio.sleep(0.2)
            await runner.stop()
            runner = None
            async with store.transaction() as tx:
                not_dialled = await tx.scalar("SELECT COUNT(*) AS n FROM attempts WHERE outcome = 'not_dialled'")
            results = await asyncio.wait_for(asyncio.gather(*sipp), 120)
            await assert_nothing_held(agent, ep, 6)
    finally:
        if runner is not None:
            await runner.stop()
        await cancel_all(sipp)
        await store.close()
    assert status["counts"] == {"answered": 50, "busy": 20, "no-answer": 10, "dnc": 10, "pending": 10}
    assert not_dialled == 0  # every claim was dialled: the budget never offered a slot the endpoint would refuse
    assert status["attempts"] == 50 + 40 + 10  # busy: retried once (max_attempts 2)
    assert dialer.max_live <= 4
    assert not set(dialer.dialled) & (set(dnc) | {to for to, tz in rows if tz})  # DNC and closed windows
    answer, busy, ring = results
    assert answer.count("Successful call") == 50, answer.output + answer.errors
    assert busy.count("Successful call") + busy.count("Failed call") == 40
    assert ring.count("Successful call") + ring.count("Failed call") == 10


async def test_a_call_still_closing_on_the_endpoint_is_not_offered_to_the_campaign(tmp_path, store_target):
    """A SIP call's `ended` event comes before its endpoint slot is free (its handler, media and RTP port close
    after it): the scheduler's budget (`dial_slots(agent)`) waits for the endpoint, so no claim is refused and
    kept as `not_dialled` (on `agent.free_slots` alone, one call closing for 1.5 s made ~15 such rows)."""
    import time

    port = free_udp_port()
    answers = scenario("callee_holds_first", tmp_path, HOLD_CALLS=0, HOLD_MS=0, TALK_MS=200)  # one 200 per INVITE
    sipp = asyncio.create_task(run_sipp("", tmp_path, "-sf", str(answers), "-m", "3", "-rtp_echo", port=port,
                                        timeout_s=300, name="answer"))  # fmt: skip
    await udp_bound(port)

    async def closing_slowly(call) -> None:  # the agent's handler writing its record after the caller hung up
        await call.ended.wait()
        await asyncio.sleep(1.5)

    store = await open_store(store_target, clock=Clock(offset_s=MONDAY_NOON_UTC - time.time()))
    cfg = CampaignConfig(max_concurrent=1, calls_per_minute=10000, reserve_inbound=0, max_attempts=1,
                         ring_timeout_s=5.0, poll_s=0.1)
    agent = Agent(model="tiny-random", device="cpu", router=False, seed=0, max_calls=1)
    runner = None
    try:
        async with agent, endpoint_on_loopback(closing_slowly, max_calls=1) as ep:
            agent.sip_endpoint = ep
            csv = "to\n" + "".join(f"sip:+4420794610{i:02d}@127.0.0.1:{port}\n" for i in range(3))
            await create_campaign(store, cfg, "closing", parse_contacts(csv), {})
            runner = CampaignRunner(store, AgentDialer(agent), cfg, free_slots=lambda: dial_slots(agent))
            runner.start()
            handle = CampaignHandle(store, "closing")
            deadline = asyncio.get_running_loop().time() + 240
            while (status := await handle.status())["counts"] != {"answered": 3}:
                assert asyncio.get_running_loop().time() < deadline, status
                await asyncio.sleep(0.1)
            await runner.stop()
            runner = None
            async with store.transaction() as tx:
                outcomes = [r["outcome"] for r in await tx.fetchall("SELECT outcome FROM attempts ORDER BY started_at")]
            assert (await asyncio.wait_for(sipp, 120)).count("Successful call") == 3
    finally:
        if runner is not None:
            await runner.stop()
        sipp.cancel()
        with contextlib.suppress(BaseException):
            await sipp
        await store.close()
    assert outcomes == ["answered"] * 3
