"""The campaign scheduler of one server: finds due numbers in the store, dials them at the campaign's pace and
records every attempt, on whichever dialler the number needs (`sip:` rows through the SIP endpoint, E.164 rows
through Twilio's REST API: `agent.dial`).

Each poll (`[campaign] poll_s`, and at once when a campaign starts or resumes):

1. renew this server's leases on the numbers it is dialling; finish as `interrupted` the attempts of any
   server whose leases ran out (it died mid-call), retried by the `failed` rule;
2. for each running campaign, claim due numbers in one database transaction (`duetaspan.store.campaigns`:
   the campaign's `max_concurrent` and `calls_per_minute` over all servers, the calling window in the callee's
   time, the do-not-call list), within this server's own budget: its free call slots minus
   `[campaign] reserve_inbound`, so inbound callers are never starved;
3. dial each claim: its attempt row is already committed, so a `kill -9` between the claim and the INVITE
   (or the REST call) loses nothing, and the number is not dialled again until the lease runs out;
4. a dial this server refused itself (no free slot after all: another transport took it) is not an attempt:
   kept as `not_dialled`, the number due again at the next poll;
5. when the call ends: the outcome, and the next attempt after the outcome's `[campaign.retry]` delay plus
   jitter while `max_attempts` allows, else the number is done.

Giving up on an attempt ends its call first. A dial with no outcome `DIAL_MARGIN_S` past the ring timeout is
cancelled (the SIP and Twilio diallers then CANCEL the ringing INVITE or REST call, or hang up one answered
meanwhile: `duetaspan.adapters.sip.outbound`, `duetaspan.adapters.twilio.outbound`), and a call the dial still
returned is hung up; an answered call still up after `MAX_CALL_S` is hung up (`call.end_call`). The number
stays held (not due again) until that is done; a call whose end cannot be confirmed within `HANG_UP_S` makes
the number final (`detail.reason` says why): one attempt too few rather than a second call beside a live one.

Times come from the store's `Clock` (a test moves it for a `serve` process through
`$DUETASPAN_TEST_CLOCK_FILE`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import Any, Protocol

from duetaspan.config.store import CampaignConfig
from duetaspan.outbound.windows import next_allowed
from duetaspan.store.campaigns import Campaign, Claim
from duetaspan.store.db import Store

log = logging.getLogger("duetaspan.campaign")
INTERRUPTED = "interrupted"
DIAL_MARGIN_S = 60.0  # past the ring timeout, a dial with no outcome yet is given up as `failed`
MAX_CALL_S = 4 * 3600.0  # an answered campaign call still up after this is hung up
HANG_UP_S = 30.0  # how long a call given up on may take to end (its BYE, its REST hang-up)
STARVED_LOG_S = 30.0  # while the dial budget stays <= 0, one log line per this many seconds
NO_SLOT = "no free slot"  # a dialler's refusal before anything left (SIP and Twilio say so in `reason`)


class Dialer(Protocol):
    """Places one call and returns when its outcome is known (a result with `outcome`, `call_id`, `call`)."""

    async def dial(self, to: str, *, ring_timeout_s: float, params: dict[str, Any]) -> Any: ...


class AgentDialer:
    """Dials through a served agent (`agent.dial`: SIP endpoint or Twilio)."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent

    async def dial(self, to: str, *, ring_timeout_s: float, params: dict[str, Any]) -> Any:
        return await self.agent.dial(to, ring_timeout_s=ring_timeout_s, params=params)


def effective_settings(base: CampaignConfig, overrides: dict[str, Any]) -> CampaignConfig:
    """The server's `[campaign]` with a campaign's own values over it."""
    return CampaignConfig.model_validate({**base.model_dump(), **overrides})


async def call_ended(call: Any, timeout_s: float | None = None) -> bool:
    """Wait for an answered call to end (a SIP or Twilio call's `ended` event; at once when it has none); one
    still up after `timeout_s` (None: `MAX_CALL_S`) is hung up. False when its end could not be confirmed."""
    ended = getattr(call, "ended", None)
    if not isinstance(ended, asyncio.Event):
        return True
    limit = MAX_CALL_S if timeout_s is None else timeout_s
    try:
        await asyncio.wait_for(ended.wait(), limit)
        return True
    except TimeoutError:
        log.warning("campaign call %s still up after %.0f s: hanging up", _call_id(call), limit)
    return await hang_up(call, f"campaign call longer than {limit:.0f} s")


async def hang_up(call: Any, reason: str) -> bool:
    """End a call the campaign gave up on (`call.end_call`: a SIP BYE, a Twilio REST hang-up) and wait up to
    `HANG_UP_S` for its `ended` event; True once it ended (or when there is no call to end)."""
    ended = getattr(call, "ended", None)
    if not isinstance(ended, asyncio.Event) or ended.is_set():
        return True
    try:
        await asyncio.wait_for(call.end_call(reason, drain_s=0.0), HANG_UP_S)
        await asyncio.wait_for(ended.wait(), HANG_UP_S)
    except TimeoutError:
        pass
    except Exception as exc:  # a REST hang-up that failed: the call's end stays unconfirmed
        log.warning("campaign call %s: hanging up failed: %s", _call_id(call), exc)
    if not ended.is_set():
        log.error("campaign call %s: hung up (%s) but not ended in %.0f s", _call_id(call), reason, HANG_UP_S)
    return ended.is_set()


def _call_id(call: Any) -> str:
    info = getattr(call, "info", None)
    return str(getattr(info, "call_id", None) or getattr(info, "call_sid", None) or "?")


class GaveUp(Exception):
    """The scheduler gave up on a dial (no outcome in time); `ended` says whether its call is known to be over."""

    def __init__(self, message: str, *, ended: bool) -> None:
        super().__init__(message)
        self.ended = ended


class CampaignRunner:
    """Runs every running campaign of the store from this server (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        dialer: Dialer,
        config: CampaignConfig,
        *,
        free_slots: Callable[[], int] | None = None,
        metrics: Any = None,
        rng: random.Random | None = None,
        recover_own: bool = False,
    ) -> None:
        self.store, self.dialer, self.config = store, dialer, config
        self.free_slots = free_slots
        self.metrics = metrics
        self.rng = rng or random.Random()
        self.clock = store.clock
        self.ringing = 0  # attempts whose dial has not returned yet (no slot of their own yet)
        self.tasks: set[asyncio.Task[None]] = set()
        self.held: dict[str, Claim] = {}  # contact id -> the claim this runner is dialling
        # a server with a stable id (`[store] server_id`) knows at start that its own leftover claims are dead
        self._recover_own = recover_own
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._starved_since: float | None = None  # monotonic: since when the dial budget is <= 0
        self._starved_logged = 0.0

    # --- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._run(), name="duetaspan-campaigns")

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        """Stop claiming; attempts in flight are finished as `interrupted` (retried by the `failed` rule)."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
            self._loop_task = None
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("campaign scheduler: a poll failed; trying again")
            try:
                await asyncio.wait_for(self._wake.wait(), self.config.poll_s)
            except TimeoutError:
                pass
            self._wake.clear()

    # --- one poll ------------------------------------------------------------------------------------
    async def tick(self) -> int:
        """One poll (the module docstring); the number of calls started."""
        now = self.clock.now()
        async with self.store.transaction() as tx:
            expired = await tx.expired_claims(now=now, own_too=self._recover_own)
            expired = [c for c in expired if c.contact.id not in self.held]
            await tx.renew_leases(list(self.held), until=now + self.config.lease_s)
            campaigns = {c.id: c for c in await tx.campaigns()}
        for claim in expired:
            camp = campaigns.get(claim.contact.campaign_id)
            settings = effective_settings(self.config, camp.settings if camp else {})
            log.warning("campaign %s: %s was left dialling by a stopped server: interrupted",
                        camp.name if camp else "?", claim.contact.to)
            await self._finish(claim, settings, INTERRUPTED, None, {"reason": "the server dialling it stopped"})
        self._recover_own = False
        started = 0
        for camp in campaigns.values():
            if camp.state != "running":
                continue
            started += await self._claim_and_dial(camp, now)
        return started

    def _budget(self) -> int:
        if self.free_slots is None:
            return 1_000_000
        free = self.free_slots()
        budget = free - self.config.reserve_inbound - self.ringing
        self._note_budget(budget, free)
        return budget

    def _note_budget(self, budget: int, free: int) -> None:
        """Say (at most every `STARVED_LOG_S`) that no call can be placed and why, while that lasts: a campaign
        that stalls on a slot nobody gives back shows it in the log, not only in its counts."""
        t = time.monotonic()
        if budget > 0:
            if self._starved_since is not None and t - self._starved_since >= STARVED_LOG_S:
                log.info("campaign scheduler: dial budget back (%d) after %.0f s", budget, t - self._starved_since)
            self._starved_since = None
            return
        if self._starved_since is None:
            self._starved_since, self._starved_logged = t, t
            log.debug("campaign scheduler: dial budget %d (free slots %d - reserve_inbound %d - ringing %d)",
                      budget, free, self.config.reserve_inbound, self.ringing)  # fmt: skip
        elif t - self._starved_logged >= STARVED_LOG_S:
            self._starved_logged = t
            log.info("campaign scheduler: no call placed for %.0f s: dial budget %d (free slots %d - "
                     "reserve_inbound %d - ringing %d; %d numbers held by this server)", t - self._starved_since,
                     budget, free, self.config.reserve_inbound, self.ringing, len(self.held))  # fmt: skip

    async def _claim_and_dial(self, camp: Campaign, now: float) -> int:
        settings = effective_settings(self.config, camp.settings)
        budget = self._budget()
        if budget <= 0:
            async with self.store.transaction() as tx:
                await tx.campaign_finished(camp.id)
            return 0

        def later(contact: Any) -> float | None:
            return next_allowed(now, contact.timezones, settings.window, settings.days)

        async with self.store.transaction() as tx:
            claims = await tx.claim_contacts(
                camp.id, now=now, lease_s=self.config.lease_s, max_concurrent=settings.max_concurrent,
                per_minute=settings.calls_per_minute, limit=budget, later=later,
            )
            if not claims and await tx.campaign_finished(camp.id):
                log.info("campaign %s: done", camp.name)
        for claim in claims:
            self.held[claim.contact.id] = claim
            self.ringing += 1
            task = asyncio.create_task(self._attempt(camp, settings, claim), name=f"campaign-{claim.attempt_id}")
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return len(claims)

    async def _attempt(self, camp: Campaign, settings: CampaignConfig, claim: Claim) -> None:
        contact = claim.contact
        params = {"campaign_id": camp.id, "campaign": camp.name, "campaign_to": contact.to,
                  "attempt": claim.n, "profile": dict(contact.variables)}
        outcome, call_id, detail = "failed", None, dict[str, Any]()
        ringing, final = True, False
        try:
            result = await self._dial(contact.to, settings, params)
            self.ringing, ringing = self.ringing - 1, False
            outcome, call_id = str(result.outcome), getattr(result, "call_id", None) or None
            detail = result.summary() if hasattr(result, "summary") else {}
            reason = str(getattr(result, "reason", "") or "")
            if outcome == "failed" and reason.startswith(NO_SLOT):  # refused here, before any INVITE / REST call
                await self._return(claim, reason)
                return
            if self.metrics is not None:
                self.metrics.started(camp.name)
            if outcome == "answered":
                if not await call_ended(getattr(result, "call", None)):
                    final, detail = True, {**detail, "reason": f"not ended in {HANG_UP_S:g} s after its hang-up"}
                outcome = _answered_outcome(result)
        except asyncio.CancelledError:
            await asyncio.shield(self._finish(claim, settings, INTERRUPTED, call_id, {"reason": "server stopping"}))
            raise
        except GaveUp as exc:
            log.warning("campaign %s: dialling %s: %s", camp.name, contact.to, exc)
            final, detail = not exc.ended, {"reason": str(exc)}
        except Exception as exc:  # a dialler that cannot dial this number: the attempt failed, the campaign goes on
            log.warning("campaign %s: dialling %s failed: %s", camp.name, contact.to, exc)
            detail = {"reason": str(exc)}
        finally:
            if ringing:
                self.ringing -= 1
        await self._finish(claim, settings, outcome, call_id, detail, final=final)
        self.wake()

    async def _dial(self, to: str, settings: CampaignConfig, params: dict[str, Any]) -> Any:
        """The dial's result; after the ring timeout plus `DIAL_MARGIN_S` without one (a dialler that never
        answers must not hold the number forever), the dial is cancelled, and a call it returned anyway is hung
        up (GaveUp). Cancelled itself (the server stops): the dial is cancelled and waited for the same way."""
        task = asyncio.ensure_future(self.dialer.dial(to, ring_timeout_s=settings.ring_timeout_s, params=params))
        limit = settings.ring_timeout_s + DIAL_MARGIN_S
        try:
            done, _ = await asyncio.wait({task}, timeout=limit)
        except asyncio.CancelledError:
            await asyncio.shield(_withdraw(task, "the server is stopping"))
            raise
        if task in done:
            return task.result()
        ended = await _withdraw(task, "no dial outcome in time")
        raise GaveUp(f"no dial outcome in {limit:.0f} s: given up, its call {'ended' if ended else 'NOT ended'}",
                     ended=ended)

    async def _return(self, claim: Claim, reason: str) -> None:
        self.held.pop(claim.contact.id, None)
        now = self.clock.now()
        async with self.store.transaction() as tx:
            await tx.return_claim(claim, now=now, next_at=now + self.config.poll_s, reason=reason)
        log.info("campaign: %s not dialled (%s): due again", claim.contact.to, reason)

    async def _finish(
        self, claim: Claim, settings: CampaignConfig, outcome: str, call_id: str | None, detail: dict[str, Any],
        *, final: bool = False,
    ) -> None:
        now = self.clock.now()
        rule = settings.retry.get("failed" if outcome == INTERRUPTED else outcome)
        next_at = None
        if rule is not None and claim.n < settings.max_attempts and not final:
            next_at = now + rule.delay_s + self.rng.uniform(0.0, rule.jitter_s)
        self.held.pop(claim.contact.id, None)
        async with self.store.transaction() as tx:
            finished = await tx.finish_attempt(claim, outcome, now=now, next_at=next_at, call_id=call_id,
                                               detail=detail)
            camp = await tx.campaign(claim.contact.campaign_id)
        if finished and self.metrics is not None and camp is not None:
            self.metrics.finished(camp.name, outcome)
        log.info("campaign %s: %s attempt %d: %s%s", camp.name if camp else "?", claim.contact.to, claim.n,
                 outcome, "" if next_at is None else f", again in {next_at - now:.0f} s")


async def _withdraw(task: asyncio.Future[Any], reason: str) -> bool:
    """Cancel a dial the scheduler gave up on and wait for it to unwind (the dialler CANCELs or hangs up what it
    placed), then hang up a call it returned anyway (it was answered just then); True once no call is left up."""
    task.cancel()
    await asyncio.wait({task})
    if task.cancelled() or task.exception() is not None:
        return True
    return await hang_up(getattr(task.result(), "call", None), f"campaign: {reason}")


def _answered_outcome(result: Any) -> str:
    """The who-answered outcome of an answered call (`human`, `voicemail_left`, `voicemail_no_message`, ...:
    `AnswerGate.call_outcome`) from the gate the transport's call holds (`call.answer`, set by the SIP and
    Twilio bridges when the call is detected); `answered` when the call was not detected or nothing was decided."""
    gate = getattr(getattr(result, "call", None), "answer", None)
    outcome = gate.call_outcome() if gate is not None else None
    return outcome if isinstance(outcome, str) and outcome else "answered"


__all__ = ["INTERRUPTED", "AgentDialer", "CampaignRunner", "Dialer", "GaveUp", "call_ended", "effective_settings",
           "hang_up"]
