"""The campaign scheduler on both stores, with a movable clock: pacing (max_concurrent over two servers on one
database, calls_per_minute, reserved inbound slots), calling windows in the callee's time (narrowest of an
ambiguous number's zones), retries with delays and a maximum, the do-not-call list at dial time, attempts
interrupted by a server that died, and never one number dialled twice at once.

The dialler here is a line that answers as the test says after a short real wait (the real SIP dial is
test_campaign_sip.py's); everything the scheduler decides goes through the real store."""

from __future__ import annotations

import asyncio
import datetime as dt
from dataclasses import dataclass

import numpy as np
import pytest

from duetaspan.config.store import CampaignConfig, RetryRule
from duetaspan.outbound.contacts import parse_contacts
from duetaspan.outbound.scheduler import CampaignRunner
from duetaspan.store import Clock, open_store

MONDAY_NOON_UTC = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.UTC).timestamp()


def clock_at(t: float) -> Clock:
    import time

    return Clock(offset_s=t - time.time())


@dataclass
class Result:
    outcome: str
    call_id: str = ""
    call: object = None


class Line:
    """Answers each number with its scripted outcomes (then the last one again), counting concurrency."""

    def __init__(self, script: dict[str, list[str]], hold_s: float = 0.05) -> None:
        self.script, self.hold_s = script, hold_s
        self.dialled: list[str] = []
        self.live: set[str] = set()
        self.max_live = 0
        self.overlaps: list[str] = []

    async def dial(self, to: str, *, ring_timeout_s: float, params: dict) -> Result:
        if to in self.live:
            self.overlaps.append(to)
        self.live.add(to)
        self.dialled.append(to)
        self.max_live = max(self.max_live, len(self.live))
        try:
            await asyncio.sleep(self.hold_s)
            outcomes = self.script.get(to, ["answered"])
            n = self.dialled.count(to)
            return Result(outcomes[min(n, len(outcomes)) - 1], f"call-{to}-{n}")
        finally:
            self.live.discard(to)


def config(**kw) -> CampaignConfig:
    base = {"max_concurrent": 3, "calls_per_minute": 1000, "window": "09:00-20:00", "reserve_inbound": 0,
            "max_attempts": 3, "poll_s": 0.05, "lease_s": 30,
            "retry": {"busy": RetryRule(delay_s=60), "no-answer": RetryRule(delay_s=120, jitter_s=30)}}
    return CampaignConfig(**{**base, **kw})


async def run_until(runner: CampaignRunner, store, name: str, pred, timeout_s: float = 60.0) -> dict:
    from duetaspan.outbound.handle import CampaignHandle

    handle = CampaignHandle(store, name)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        status = await handle.status()
        if pred(status):
            return status
        assert asyncio.get_running_loop().time() < deadline, f"timed out: {status}"
        await asyncio.sleep(0.05)


async def new_campaign(store, name: str, csv: str, **settings):
    from duetaspan.outbound.handle import create_campaign

    return await create_campaign(store, CampaignConfig(), name, parse_contacts(csv), settings)


async def run_to_done(store, name: str, csv: str, line, cfg) -> dict:
    """A new campaign `name` over `csv`, run by its own runner on `line` until it is done; its status."""
    await new_campaign(store, name, csv)
    runner = CampaignRunner(store, line, cfg, free_slots=lambda: 5)
    runner.start()
    try:
        return await run_until(runner, store, name, lambda s: s["state"] == "done")
    finally:
        await runner.stop()


async def test_windows_retries_dnc_and_pacing(store_target):
    store = await open_store(store_target, clock=clock_at(MONDAY_NOON_UTC), server_id="s1")
    csv = "to,timezone\n" + "".join(f"+4420794600{i:02d},\n" for i in range(8))  # London: 12:00, open
    csv += "+64211234567,\n"  # New Zealand: 01:00 Tuesday, closed until 09:00 there (20:00 UTC)
    csv += "+442079460099,\n"  # on the do-not-call list
    line = Line({"+442079460001": ["busy", "answered"], "+442079460002": ["no-answer"]})
    async with store.transaction() as tx:
        await tx.dnc_add(["+44 20 7946 0099"], now=0.0)
    await new_campaign(store, "c1", csv)
    runner = CampaignRunner(store, line, config(), free_slots=lambda: 10)
    runner.start()
    try:
        status = await run_until(runner, store, "c1", lambda s: s["counts"].get("pending", 0) <= 4
                                 and not s["counts"].get("dialling"))
        assert line.max_live <= 3 and not line.overlaps
        assert "+64211234567" not in line.dialled
        assert "+442079460099" not in line.dialled and status["counts"]["dnc"] == 1
        async with store.transaction() as tx:
            contacts = {c.to: c for c in await tx.contacts(status["id"])}
        nz = contacts["+64211234567"]
        assert nz.attempts == 0 and nz.next_at == dt.datetime(2026, 3, 2, 20, 0, tzinfo=dt.UTC).timestamp()
        busy = contacts["+442079460001"]
        assert busy.state == "pending" and busy.outcome == "busy" and busy.attempts == 1
        assert 60 <= busy.next_at - MONDAY_NOON_UTC <= 62  # the busy rule's delay
        noans = contacts["+442079460002"]
        assert 120 <= noans.next_at - MONDAY_NOON_UTC <= 152  # 120 s plus up to 30 s jitter
        # the clock moves on 10 minutes at a time: the retries fall due (London still open)
        for expected in (10, 11):  # the busy retry and the first no-answer retry, then the last one
            store.clock.offset_s += 600
            await run_until(runner, store, "c1", lambda s, n=expected: not s["counts"].get("dialling")
                            and s["attempts"] == n)
        assert line.dialled.count("+442079460002") == 3  # no-answer: max_attempts 3, then done
        store.clock.offset_s = MONDAY_NOON_UTC + 8 * 3600 + 60 - __import__("time").time()  # 20:01 UTC: NZ 09:01
        await run_until(runner, store, "c1", lambda s: s["state"] == "done", timeout_s=60)
        async with store.transaction() as tx:
            contacts = {c.to: c for c in await tx.contacts(status["id"])}
        assert contacts["+442079460001"].outcome == "answered" and contacts["+442079460001"].attempts == 2
        assert contacts["+442079460002"].outcome == "no-answer" and contacts["+442079460002"].attempts == 3
        assert contacts["+64211234567"].outcome == "answered" and contacts["+64211234567"].attempts == 1
        assert line.dialled.count("+442079460002") == 3 and not line.overlaps
    finally:
        await runner.stop()
        await store.close()


async def test_the_gates_other_endings_are_final_unless_a_retry_rule_names_them(store_target):
    """`fax`, `ivr_dead_end`, `screening_rejected`: final by default, retried when `[campaign.retry]` lists
    them (a fax line that a person answers next time, a phone menu tried again later)."""
    store = await open_store(store_target, clock=clock_at(MONDAY_NOON_UTC), server_id="s1")
    ending = {"+442079460011": "fax", "+442079460012": "ivr_dead_end", "+442079460013": "screening_rejected"}
    line = Line({n: [e, "answered"] for n, e in ending.items()})
    csv = "to\n" + "".join(f"{n}\n" for n in ending)
    await new_campaign(store, "final", csv)
    retried = {e: RetryRule(delay_s=300) for e in ending.values()}
    runner = CampaignRunner(store, line, config(retry=retried), free_slots=lambda: 10)
    default_runner = CampaignRunner(store, line, config(), free_slots=lambda: 10)
    default_runner.start()
    try:
        status = await run_until(default_runner, store, "final", lambda s: s["state"] == "done")
        async with store.transaction() as tx:
            contacts = {c.to: c for c in await tx.contacts(status["id"])}
        assert {n: (c.outcome, c.attempts) for n, c in contacts.items()} == {n: (e, 1) for n, e in ending.items()}
        await default_runner.stop()
        line.dialled.clear()
        await new_campaign(store, "retried", csv)
        runner.start()
        status = await run_until(runner, store, "retried", lambda s: s["attempts"] == 3
                                 and not s["counts"].get("dialling"))
        async with store.transaction() as tx:
            contacts = {c.to: c for c in await tx.contacts(status["id"])}
        for n, e in ending.items():
            assert contacts[n].state == "pending" and contacts[n].outcome == e and contacts[n].attempts == 1
            assert 300 <= contacts[n].next_at - MONDAY_NOON_UTC <= 302  # the rule's delay
        store.clock.offset_s += 600
        status = await run_until(runner, store, "retried", lambda s: s["state"] == "done")
        async with store.transaction() as tx:
            contacts = {c.to: c for c in await tx.contacts(status["id"])}
        assert {n: (c.outcome, c.attempts) for n, c in contacts.items()} == {n: ("answered", 2) for n in ending}
        assert sorted(line.dialled) == sorted(list(ending) * 2) and not line.overlaps
    finally:
        await default_runner.stop()
        await runner.stop()
        await store.close()


async def test_two_servers_one_database_never_dial_a_number_twice_at_once(store_target):
    """Two schedulers (two servers) on one database and one phone line: max_concurrent holds over both, every
    number is dialled exactly its policy's times, and no two dials of one number overlap."""
    a = await open_store(store_target, clock=clock_at(MONDAY_NOON_UTC), server_id="server-a")
    b = await open_store(store_target, clock=clock_at(MONDAY_NOON_UTC), server_id="server-b")
    numbers = [f"+4420794601{i:02d}" for i in range(30)]
    line = Line({n: ["busy", "answered"] for n in numbers[:10]}, hold_s=0.1)
    cfg = config(max_concurrent=3, retry={"busy": RetryRule(delay_s=0.2)})
    await new_campaign(a, "shared", "to\n" + "\n".join(numbers) + "\n")
    # two call slots per server: 4 in all, but the campaign's max_concurrent of 3 holds over both
    runners = [CampaignRunner(s, line, cfg, free_slots=lambda: 2) for s in (a, b)]
    for r in runners:
        r.start()
    try:
        await run_until(runners[0], a, "shared", lambda s: s["state"] == "done", timeout_s=90)
        assert not line.overlaps and line.max_live == 3
        assert sorted(line.dialled) == sorted(numbers + numbers[:10])  # busy once then answered: 2 attempts
        async with a.transaction() as tx:
            camp = await tx.campaign("shared")
            owners = {row["owner"] for row in await tx.attempts(camp.id)}
        assert owners == {"server-a", "server-b"}  # both servers dialled; the database kept them apart
    finally:
        for r in runners:
            await r.stop()
        await a.close()
        await b.close()


async def test_reserve_inbound_and_calls_per_minute(store):
    store.clock = clock_at(MONDAY_NOON_UTC)
    await new_campaign(store, "slow", "to\n" + "".join(f"+4420794602{i:02d}\n" for i in range(10)))
    free = {"slots": 3}
    line = Line({}, hold_s=0.3)
    runner = CampaignRunner(store, line, config(max_concurrent=10, calls_per_minute=4, reserve_inbound=2),
                            free_slots=lambda: free["slots"])
    runner.start()
    try:
        await run_until(runner, store, "slow", lambda s: s["attempts"] >= 4, timeout_s=30)
        await asyncio.sleep(0.5)  # (a window for a wrong fifth dial to show up; the assertion is exact)
        status = await run_until(runner, store, "slow", lambda s: not s["counts"].get("dialling"))
        assert status["attempts"] == 4 and line.max_live == 1  # 3 free - 2 reserved: one at a time; 4 a minute
        store.clock.offset_s += 61  # a minute later: four more
        await run_until(runner, store, "slow", lambda s: s["attempts"] >= 8, timeout_s=30)
        free["slots"] = 2  # only the reserved slots left: nothing more is dialled
        store.clock.offset_s += 61
        await asyncio.sleep(0.5)
        status = await run_until(runner, store, "slow", lambda s: not s["counts"].get("dialling"))
        assert status["attempts"] == 8
    finally:
        await runner.stop()


async def test_attempts_of_a_dead_server_are_interrupted_and_retried(store_target):
    """A server claimed numbers and died (its leases were never renewed): another finds them once the leases
    end, finishes each open attempt as `interrupted` and retries it by the `failed` rule."""
    dead = await open_store(store_target, clock=clock_at(MONDAY_NOON_UTC), server_id="dead")
    await new_campaign(dead, "crash", "to\n+442079460300\n+442079460301\n")
    async with dead.transaction() as tx:
        camp = await tx.campaign("crash")
        claims = await tx.claim_contacts(camp.id, now=dead.clock.now(), lease_s=30, max_concurrent=5,
                                         per_minute=100, limit=5, later=lambda c: None)
    assert len(claims) == 2
    await dead.close()  # killed: the attempts stay open, the contacts `dialling`
    alive = await open_store(store_target, clock=clock_at(MONDAY_NOON_UTC + 10), server_id="alive")
    line = Line({})
    runner = CampaignRunner(alive, line, config(retry={"failed": RetryRule(delay_s=5)}), free_slots=lambda: 5)
    runner.start()
    try:
        await asyncio.sleep(0.3)
        assert line.dialled == []  # leases still held (10 s of 30): nobody dials them
        alive.clock.offset_s += 25  # past the leases: interrupted, retried 5 s later
        await asyncio.sleep(0.3)
        assert line.dialled == []
        alive.clock.offset_s += 6
        await run_until(runner, alive, "crash", lambda s: s["state"] == "done")
        async with alive.transaction() as tx:
            attempts = await tx.attempts(camp.id)
        assert sorted((r["to_number"], r["n"], r["outcome"]) for r in attempts) == [
            ("+442079460300", 1, "interrupted"), ("+442079460300", 2, "answered"),
            ("+442079460301", 1, "interrupted"), ("+442079460301", 2, "answered")]
        assert sorted(line.dialled) == ["+442079460300", "+442079460301"]
    finally:
        await runner.stop()
        await alive.close()


def test_an_answered_attempts_outcome_is_who_answered():
    """The attempt's outcome of an answered call comes from the answer gate its call holds (`call.answer`, set by
    the SIP and Twilio bridges): the `[campaign.retry]` keys `human`, `voicemail_left`, `voicemail_no_message`;
    `answered` when the call was not detected or nothing was decided (over real SIP: test_campaign_voicemail.py)."""
    from types import SimpleNamespace

    from duetaspan.model.slots import FrameResult
    from duetaspan.outbound.gate import AnswerGate
    from duetaspan.outbound.scheduler import _answered_outcome
    from duetaspan.outbound.verdicts import Verdict
    from duetaspan.pipeline.ticks import TickOutput

    def outcome(*verdicts: Verdict, message: bool = True, play_s: float = 0.0) -> str:
        gate = AnswerGate(timeout_s=4.0, message_pcm=np.ones(24000, dtype=np.float32) * 0.1 if message else None)
        for v in verdicts:
            gate._heard(v)  # what the detector hands the gate
        for i in range(round(play_s / 0.08)):  # the engine's 80 ms ticks while the message plays
            silence = np.zeros(1920, dtype=np.float32)
            gate.tick(TickOutput(FrameResult(0, i, silence, -1, "", False, True, [], 0.0), silence, i, False, 0.0))
        return _answered_outcome(Result("answered", "c1", SimpleNamespace(answer=gate)))

    greeting, beep = Verdict("voicemail", 0.9, 2.8), Verdict("beep", 0.9, 4.0, beep_at_s=4.0, beep_end_s=4.37)
    assert _answered_outcome(Result("answered", "c1", SimpleNamespace(answer=None))) == "answered"  # not detected
    assert _answered_outcome(Result("answered", "c1", None)) == "answered"
    assert outcome() == "answered"  # detected, but it ended before any verdict
    assert outcome(Verdict("human", 0.7, 2.2)) == "human"
    assert outcome(Verdict("silence", 0.8, 3.5)) == "human"  # the gate opened: the agent said hello
    assert outcome(greeting) == "voicemail_no_message"  # the greeting hung up before the beep
    assert outcome(greeting, beep, play_s=0.5) == "voicemail_no_message"  # ... or in the middle of the message
    assert outcome(greeting, beep, play_s=1.2) == "voicemail_left"  # the whole message (1 s) was left
    assert outcome(greeting, beep, message=False) == "voicemail_no_message"  # none configured
    assert outcome(Verdict("fax", 0.9, 1.0)) == "fax"  # the gate's own outcome (final unless a retry rule names it)


class LiveCall:
    """An answered call that stays up until it is hung up (`end_call`), unless `deaf` (its hang-up is lost)."""

    def __init__(self, line: LiveLine, to: str, deaf: bool = False) -> None:
        self.line, self.to, self.deaf = line, to, deaf
        self.ended = asyncio.Event()
        self.hung_up: list[str] = []

    async def end_call(self, reason: str, drain_s: float = 3.0) -> None:
        self.hung_up.append(reason)
        if not self.deaf:
            self.line.live.discard(self.to)
            self.ended.set()


class LiveLine:
    """Every dial is answered and its call stays up until hung up; a number dialled while its call is still up
    is an overlap. `crossing`: a dial that is answered only just as the scheduler gives up on it (its
    cancellation and the answer cross) and returns the live call anyway; `deaf`: calls whose hang-up is lost."""

    def __init__(self, *, crossing: bool = False, deaf: bool = False) -> None:
        self.crossing, self.deaf = crossing, deaf
        self.live: set[str] = set()
        self.calls: list[LiveCall] = []
        self.overlaps: list[str] = []

    async def dial(self, to: str, *, ring_timeout_s: float, params: dict) -> Result:
        if to in self.live:
            self.overlaps.append(to)
        if self.crossing:
            try:
                await asyncio.sleep(3600)  # rings until given up
            except asyncio.CancelledError:
                pass  # ... and is answered just then
        self.live.add(to)
        self.calls.append(LiveCall(self, to, self.deaf))
        return Result("answered", f"call-{to}-{len(self.calls)}", self.calls[-1])


async def test_a_call_given_up_on_is_hung_up_before_its_number_is_due_again(store, monkeypatch):
    """An answered call still up after MAX_CALL_S, and a dial that is answered just as the scheduler gives up on
    it (no outcome `DIAL_MARGIN_S` past the ring timeout), are hung up before the attempt is finished: the
    retry never dials the number while its earlier call is up."""
    from duetaspan.outbound import scheduler

    store.clock = clock_at(MONDAY_NOON_UTC)
    monkeypatch.setattr(scheduler, "MAX_CALL_S", 0.3)
    monkeypatch.setattr(scheduler, "DIAL_MARGIN_S", 0.3)
    cfg = config(ring_timeout_s=0.1, max_attempts=2,
                 retry={"answered": RetryRule(delay_s=0), "failed": RetryRule(delay_s=0)})
    for name, line, outcome in (("long", LiveLine(), "answered"), ("crossed", LiveLine(crossing=True), "failed")):
        status = await run_to_done(store, name, "to\n+442079460400\n", line, cfg)
        assert len(line.calls) == 2 and not line.overlaps and not line.live, name  # each call ended before the next
        assert all(len(call.hung_up) == 1 and call.ended.is_set() for call in line.calls), name
        async with store.transaction() as tx:
            attempts = await tx.attempts(status["id"])
        assert [r["outcome"] for r in attempts] == [outcome, outcome], name


async def test_a_call_whose_hang_up_is_not_confirmed_makes_its_number_final(store, monkeypatch):
    """A call given up on whose end cannot be confirmed (its hang-up lost) is never followed by another dial of
    its number, whatever the retry rules say: the number is done, the attempt's detail says why."""
    from duetaspan.outbound import scheduler

    store.clock = clock_at(MONDAY_NOON_UTC)
    monkeypatch.setattr(scheduler, "MAX_CALL_S", 0.2)
    monkeypatch.setattr(scheduler, "DIAL_MARGIN_S", 0.2)
    monkeypatch.setattr(scheduler, "HANG_UP_S", 0.2)
    cfg = config(ring_timeout_s=0.1, retry={"answered": RetryRule(delay_s=0), "failed": RetryRule(delay_s=0)})
    for name, line in (("long", LiveLine(deaf=True)), ("crossed", LiveLine(crossing=True, deaf=True))):
        status = await run_to_done(store, name, "to\n+442079460401\n", line, cfg)
        assert len(line.calls) == 1 and line.calls[0].hung_up, name  # hung up, once dialled, never again
        async with store.transaction() as tx:
            [attempt] = await tx.attempts(status["id"])
        assert attempt["outcome"] == "failed" if name == "crossed" else "answered", (name, attempt)
        assert "not ended" in attempt["detail"].lower(), (name, attempt)


async def test_a_number_whose_zones_share_no_window_ends_as_no_window(store):
    """Zones that share no hour of the calling window (09:00-13:00 in Tokyo is 19:00-23:00 in New York) can
    never be called: the number ends with the final outcome `no_window` when its turn comes, never dialled, and
    the campaign finishes (it was pushed 9 days on, again and again, and the campaign stayed `running`)."""
    from duetaspan.outbound.handle import create_campaign

    store.clock = clock_at(MONDAY_NOON_UTC)  # 21:00 in Tokyo, 07:00 in New York
    contacts = parse_contacts("to\n+442079460500\n")
    contacts.append({"to": "+815012345678", "variables": {}, "timezones": ["America/New_York", "Asia/Tokyo"]})
    await create_campaign(store, CampaignConfig(), "far", contacts, {"window": "09:00-13:00"})
    line = Line({})
    runner = CampaignRunner(store, line, config(), free_slots=lambda: 5)  # the campaign's own window applies
    runner.start()
    try:
        status = await run_until(runner, store, "far", lambda s: s["state"] == "done")
    finally:
        await runner.stop()
    assert status["counts"] == {"answered": 1, "no_window": 1}  # London (12:00 there) was called
    assert line.dialled == ["+442079460500"]
    async with store.transaction() as tx:
        events = await tx.events(type="campaign.attempt")
    assert ("+815012345678", "no_window") in {(e.data["to"], e.data["outcome"]) for e in events}


async def test_a_dial_budget_that_stays_empty_is_logged_rate_limited(store, monkeypatch, caplog):
    """While the server's dial budget stays <= 0 (no free slot beyond reserve_inbound), the scheduler says so in
    the log, why (free slots, reserve, ringing) and for how long, at most once per STARVED_LOG_S, not per poll."""
    import logging

    from duetaspan.outbound import scheduler

    store.clock = clock_at(MONDAY_NOON_UTC)
    monkeypatch.setattr(scheduler, "STARVED_LOG_S", 0.3)
    await new_campaign(store, "starved", "to\n+442079460600\n")
    free = {"slots": 1}
    line = Line({})
    runner = CampaignRunner(store, line, config(reserve_inbound=1), free_slots=lambda: free["slots"])
    caplog.set_level(logging.INFO, logger="duetaspan.campaign")
    runner.start()
    try:
        await asyncio.sleep(1.5)  # ~30 polls with no budget (a span in which nothing may be dialled)
        assert line.dialled == []
        starved = [r.getMessage() for r in caplog.records if "no call placed for" in r.getMessage()]
        assert 2 <= len(starved) <= 6, starved  # every 0.3 s, not every 0.05 s poll
        assert "dial budget 0 (free slots 1 - reserve_inbound 1 - ringing 0" in starved[0]
        free["slots"] = 2
        await run_until(runner, store, "starved", lambda s: s["state"] == "done")
        assert any("dial budget back" in r.getMessage() for r in caplog.records)
    finally:
        await runner.stop()


class Params(Line):
    """A `Line` that also keeps what each dial was given (the contact's variables among it)."""

    def __init__(self, script: dict[str, list[str]]) -> None:
        super().__init__(script)
        self.params: dict[str, dict] = {}

    async def dial(self, to: str, *, ring_timeout_s: float, params: dict) -> Result:
        self.params[to] = {**params, "ring_timeout_s": ring_timeout_s}
        return await super().dial(to, ring_timeout_s=ring_timeout_s, params=params)


async def test_agent_campaign_from_python_with_its_own_settings(store):
    """`agent.campaign(contacts, name=..., **settings)` on a serving agent (its store and scheduler, as `serve`
    sets them: duetaspan.outbound.serve): the campaign's own days, attempts, pacing and ring timeout win over
    `[campaign]`, a campaign without them keeps the config's (closed on Monday here: not dialled), each dial
    gets the contact's variables, and the handle reports, exports and cancels."""
    from duetaspan import Agent
    from duetaspan.errors import ConfigError
    from duetaspan.outbound.handle import CampaignHandle

    store.clock = clock_at(MONDAY_NOON_UTC)
    agent = Agent(model="tiny-random", device="cpu", router=False, seed=0, max_calls=4)
    agent.config.campaign = config(days=["tue"], max_concurrent=3, max_attempts=3, ring_timeout_s=30.0)
    with pytest.raises(ConfigError, match="serving agent"):
        await agent.campaign([{"to": "+442079460001"}], name="too-early")  # not serving: no store yet
    line = Params({"+442079460002": ["busy"]})
    agent.store = store
    agent.campaigns = CampaignRunner(store, line, agent.config.campaign, free_slots=lambda: 10)
    agent.campaigns.start()
    try:
        contacts = [{"to": f"+4420794600{i:02d}", "name": n, "appointment_time": "Tuesday 10 am"}
                    for i, n in enumerate(["Ada", "Bo", "Cy", "Di"], start=1)]  # fmt: skip
        own = await agent.campaign(contacts, name="reminders", days=["mon"], max_concurrent=1, max_attempts=1,
                                   ring_timeout_s=12.5)  # fmt: skip
        default = await agent.campaign("to\n+442079460099\n", name="config-days")  # CSV text
        status = await own.wait(poll_s=0.05, timeout_s=60)
        assert status["state"] == "done"
        assert status["counts"] == {"answered": 3, "busy": 1}  # busy: final after the campaign's one attempt
        assert line.max_live == 1  # the campaign's max_concurrent, not the config's 3
        assert line.params["+442079460001"]["profile"] == {"name": "Ada", "appointment_time": "Tuesday 10 am"}
        assert {p["ring_timeout_s"] for p in line.params.values()} == {12.5}
        assert {p["campaign"] for p in line.params.values()} == {"reminders"}
        assert (await default.status())["counts"] == {"pending": 1} and "+442079460099" not in line.dialled
        exported = await own.export()
        assert exported.splitlines()[0].startswith("to,") and len(exported.splitlines()) == 5
        assert (await default.cancel())["state"] == "cancelled"
        with pytest.raises(ConfigError):
            await agent.campaign([{"to": "+442079460003"}], name="reminders")  # the name is taken
        with pytest.raises(ConfigError, match="window '20:00-09:00'"):  # a clear error, nothing created
            await agent.campaign([{"to": "+442079460003"}], name="bad", window="20:00-09:00")
        with pytest.raises(ConfigError, match="max_concurent"):  # a misspelt setting is not silently ignored
            await agent.campaign([{"to": "+442079460003"}], name="bad", max_concurent=4)
        with pytest.raises(ConfigError, match="no campaign 'bad'"):
            await CampaignHandle(store, "bad").status()
    finally:
        await agent.campaigns.stop()
