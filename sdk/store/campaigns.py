"""Campaigns in the store: a campaign (name, state, settings), its contacts (one per number of the list: the
number, its variables, its time zones, its state), every attempt at a contact, and the do-not-call list.

Who dials what is decided here, in the database: `claim_contacts` locks the campaign's row (PostgreSQL
`SELECT ... FOR UPDATE`; SQLite holds the whole database for the transaction), counts the calls in flight
and the attempts of the last minute over every server, and takes due contacts with `FOR UPDATE SKIP
LOCKED`, moving each to `dialling` with a lease (`lease_owner`, `lease_until`) and writing its attempt row
in the same transaction, before any INVITE or REST call leaves. A contact in `dialling` is never claimed
again until its attempt is finished or its lease ran out (the server died: `expired_claims`).

Contact states: `pending` (due at `next_at`), `dialling`, `done` (`outcome` says how it ended). Campaign
states: `running`, `paused`, `cancelled`, `done`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from duetaspan.store.base import Row, dumps, loads, new_id
from duetaspan.store.outbox import OutboxOps

CAMPAIGN_STATES = ("running", "paused", "cancelled", "done")
_SIP = re.compile(r"^sips?:([^@;]+)(@.*)?$", re.I)
_PUNCT = re.compile(r"[\s().-]")


def normalize_number(to: str) -> str:
    """The key a number is suppressed by: `sip:+1 555 0100@trunk` and `+15550100` are both `+15550100`;
    a SIP URI whose user is not a number keeps `user@host` (lower case)."""
    to = to.strip()
    m = _SIP.match(to)
    if m:
        user = _PUNCT.sub("", m[1])
        if re.fullmatch(r"\+?\d{3,20}", user):
            return user
        return (m[1] + (m[2] or "").split(";", 1)[0]).lower()
    cleaned = _PUNCT.sub("", to)
    return cleaned if re.fullmatch(r"\+?\d{3,20}", cleaned) else to.lower()


@dataclass
class Campaign:
    id: str
    name: str
    state: str
    created: float
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class Contact:
    id: str
    campaign_id: str
    position: int
    to: str
    variables: dict[str, Any]
    timezones: list[str]
    state: str
    attempts: int
    next_at: float
    outcome: str | None
    last_attempt_at: float | None


@dataclass
class Claim:
    """A contact this server is now dialling, and the attempt already written for it."""

    contact: Contact
    attempt_id: str
    n: int  # the attempt's number: 1 for the first


def _campaign(row: Row) -> Campaign:
    return Campaign(row["id"], row["name"], row["state"], row["created"], loads(row["settings"]) or {})


def _contact(row: Row) -> Contact:
    return Contact(
        row["id"],
        row["campaign_id"],
        row["position"],
        row["to_number"],
        loads(row["variables"]) or {},
        loads(row["timezones"]) or [],
        row["state"],
        row["attempts"],
        row["next_at"],
        row["outcome"],
        row["last_attempt_at"],
    )


class CampaignOps(OutboxOps):
    """Campaign, contact, attempt and do-not-call statements (mixed into every backend's transaction)."""

    row_lock = ""  # PostgreSQL: " FOR UPDATE" (waits for the row: claims of one campaign serialise)
    server_id = "server"  # set by the store: who holds the leases this transaction takes

    async def create_campaign(
        self, name: str, settings: dict[str, Any], contacts: Sequence[dict[str, Any]], *, now: float
    ) -> Campaign:
        """A new running campaign with its contacts (`to`, `variables`, `timezones`), all due at `now`."""
        campaign = Campaign(new_id("cmp"), name, "running", now, settings)
        await self.execute(
            "INSERT INTO campaigns (id, name, state, created, settings) VALUES (?, ?, ?, ?, ?)",
            [campaign.id, name, "running", now, dumps(settings)],
        )
        for i, c in enumerate(contacts):
            await self.execute(
                "INSERT INTO contacts (id, campaign_id, position, to_number, variables, timezones, state, "
                "attempts, next_at) VALUES (?, ?, ?, ?, ?, ?, 'pending', 0, ?)",
                [
                    new_id("con"),
                    campaign.id,
                    i,
                    c["to"],
                    dumps(c.get("variables") or {}),
                    dumps(c.get("timezones") or []),
                    now,
                ],
            )
        return campaign

    async def campaign(self, name_or_id: str) -> Campaign | None:
        row = await self.fetchone(
            "SELECT * FROM campaigns WHERE name = ? OR id = ?", [name_or_id, name_or_id]
        )
        return _campaign(row) if row else None

    async def campaigns(self, *, state: str | None = None) -> list[Campaign]:
        sql, params = "SELECT * FROM campaigns", []
        if state is not None:
            sql, params = sql + " WHERE state = ?", [state]
        return [_campaign(r) for r in await self.fetchall(sql + " ORDER BY created, id", params)]

    async def set_campaign_state(self, campaign_id: str, state: str) -> None:
        await self.execute("UPDATE campaigns SET state = ? WHERE id = ?", [state, campaign_id])

    async def contacts(self, campaign_id: str) -> list[Contact]:
        rows = await self.fetchall(
            "SELECT * FROM contacts WHERE campaign_id = ? ORDER BY position", [campaign_id]
        )
        return [_contact(r) for r in rows]

    async def attempt_count(self, campaign_id: str) -> int:
        """The campaign's attempts: every call tried or in flight (a `not_dialled` claim is not an attempt)."""
        return int(await self.scalar(
            "SELECT COUNT(*) AS n FROM attempts WHERE campaign_id = ? AND (outcome IS NULL OR outcome <> 'not_dialled')",
            [campaign_id],
        ) or 0)  # fmt: skip

    async def counts(self, campaign_id: str) -> dict[str, int]:
        """Contacts by state (`pending`, `dialling`) and, for those done, by outcome."""
        rows = await self.fetchall(
            "SELECT state, outcome, COUNT(*) AS n FROM contacts WHERE campaign_id = ? GROUP BY state, outcome",
            [campaign_id],
        )
        out: dict[str, int] = {}
        for r in rows:
            key = (r["outcome"] or "done") if r["state"] == "done" else r["state"]
            out[key] = out.get(key, 0) + int(r["n"])
        return out

    async def attempts(self, campaign_id: str) -> list[Row]:
        return await self.fetchall(
            "SELECT a.*, c.to_number FROM attempts a JOIN contacts c ON c.id = a.contact_id "
            "WHERE a.campaign_id = ? ORDER BY a.started_at, a.id",
            [campaign_id],
        )

    async def claim_contacts(
        self,
        campaign_id: str,
        *,
        now: float,
        lease_s: float,
        max_concurrent: int,
        per_minute: float,
        limit: int,
        later: Callable[[Contact], float | None],
    ) -> list[Claim]:
        """Take up to `limit` due contacts for this server (see the module docstring). `later(contact)`: None
        when the contact may be called now, else when to look at it again (its calling window), or infinity
        when never (its zones share no window: the contact is done, outcome `no_window`)."""
        camp = await self.fetchone(f"SELECT state FROM campaigns WHERE id = ?{self.row_lock}", [campaign_id])
        if camp is None or camp["state"] != "running":
            return []
        inflight = int(
            await self.scalar(
                "SELECT COUNT(*) AS n FROM contacts WHERE campaign_id = ? AND state = 'dialling'",
                [campaign_id],
            )
        )
        recent = int(
            await self.scalar(
                "SELECT COUNT(*) AS n FROM attempts WHERE campaign_id = ? AND started_at > ?",
                [campaign_id, now - 60],
            )
        )
        room = min(limit, max_concurrent - inflight, math.floor(per_minute) - recent)
        if room <= 0:
            return []
        rows = await self.fetchall(
            "SELECT * FROM contacts WHERE campaign_id = ? AND state = 'pending' AND next_at <= ? "
            f"ORDER BY next_at, position LIMIT ?{self.lock_suffix}",
            [campaign_id, now, room * 4 + 8],
        )
        claims: list[Claim] = []
        for row in rows:
            if len(claims) >= room:
                break
            contact = _contact(row)
            if await self.dnc_has(contact.to):
                await self.execute(
                    "UPDATE contacts SET state = 'done', outcome = 'dnc' WHERE id = ?", [contact.id]
                )
                await self.emit_contact(contact, "dnc", None)
                continue
            when = later(contact)
            if when is not None and math.isinf(when):  # its zones share no calling window: never callable
                await self.execute(
                    "UPDATE contacts SET state = 'done', outcome = 'no_window' WHERE id = ?", [contact.id]
                )
                await self.emit_contact(contact, "no_window", None)
                continue
            if when is not None:
                await self.execute(
                    "UPDATE contacts SET next_at = ? WHERE id = ?", [max(when, now), contact.id]
                )
                continue
            owner = self.owner
            changed = await self.execute(
                "UPDATE contacts SET state = 'dialling', attempts = attempts + 1, last_attempt_at = ?, "
                "lease_owner = ?, lease_until = ? WHERE id = ? AND state = 'pending'",
                [now, owner, now + lease_s, contact.id],
            )
            if changed != 1:
                continue
            attempt_id, n = new_id("att"), contact.attempts + 1
            await self.execute(
                "INSERT INTO attempts (id, contact_id, campaign_id, n, owner, started_at) VALUES (?, ?, ?, ?, ?, ?)",
                [attempt_id, contact.id, campaign_id, n, owner, now],
            )
            contact.attempts, contact.state, contact.last_attempt_at = n, "dialling", now
            claims.append(Claim(contact, attempt_id, n))
        return claims

    async def emit_contact(self, contact: Contact, outcome: str, attempt: dict[str, Any] | None) -> None:
        """The outbox event of a contact's attempt (or of its suppression)."""
        await self.emit(
            "campaign.attempt",
            call_id=(attempt or {}).get("call_id"),
            data={
                "campaign_id": contact.campaign_id,
                "to": contact.to,
                "outcome": outcome,
                "attempts": contact.attempts,
                **(attempt or {}),
            },
        )

    async def finish_attempt(
        self,
        claim: Claim,
        outcome: str,
        *,
        now: float,
        next_at: float | None,
        call_id: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> bool:
        """Record how the attempt went and what becomes of its contact: due again at `next_at` or done. False
        when the attempt was already finished (e.g. found interrupted by another server)."""
        changed = await self.execute(
            "UPDATE attempts SET ended_at = ?, outcome = ?, call_id = ?, detail = ? WHERE id = ? AND outcome IS NULL",
            [now, outcome, call_id, dumps(detail or {}), claim.attempt_id],
        )
        if changed != 1:
            return False
        state = "pending" if next_at is not None else "done"
        await self.execute(
            "UPDATE contacts SET state = ?, next_at = ?, outcome = ?, lease_owner = NULL, lease_until = NULL "
            "WHERE id = ?",
            [state, next_at if next_at is not None else claim.contact.next_at, outcome, claim.contact.id],
        )
        await self.emit_contact(
            claim.contact, outcome, {"attempt": claim.n, "call_id": call_id, "final": state == "done"}
        )
        return True

    async def return_claim(self, claim: Claim, *, now: float, next_at: float, reason: str) -> None:
        """The call never left (this server had no free slot after all): the attempt is kept as `not_dialled`
        and does not count against the number's attempts; the number is due again at `next_at`."""
        changed = await self.execute(
            "UPDATE attempts SET ended_at = ?, outcome = 'not_dialled', detail = ? WHERE id = ? AND outcome IS NULL",
            [now, dumps({"reason": reason}), claim.attempt_id],
        )
        if changed == 1:
            await self.execute(
                "UPDATE contacts SET state = 'pending', attempts = attempts - 1, next_at = ?, lease_owner = NULL, "
                "lease_until = NULL WHERE id = ?",
                [next_at, claim.contact.id],
            )

    async def renew_leases(self, contact_ids: Sequence[str], *, until: float) -> None:
        """Extend this server's leases on the contacts it is dialling now (not those a previous run of a server
        with the same id left behind: they expire, or `expired_claims(own_too=True)` takes them at start)."""
        for contact_id in contact_ids:
            await self.execute(
                "UPDATE contacts SET lease_until = ? WHERE id = ? AND state = 'dialling' AND lease_owner = ?",
                [until, contact_id, self.owner],
            )

    async def expired_claims(self, *, now: float, own_too: bool = False) -> list[Claim]:
        """Contacts left `dialling` by a server that stopped renewing (its lease ran out), or by this very
        server before it restarted (`own_too`, at start); with their open attempts."""
        rows = await self.fetchall(
            "SELECT c.*, a.id AS attempt_id, a.n AS attempt_n FROM contacts c JOIN attempts a ON a.contact_id = c.id "
            "AND a.outcome IS NULL WHERE c.state = 'dialling' AND (c.lease_until < ? OR c.lease_owner = ?)",
            [now, self.owner if own_too else ""],
        )
        return [Claim(_contact(r), r["attempt_id"], int(r["attempt_n"])) for r in rows]

    async def campaign_finished(self, campaign_id: str) -> bool:
        """Mark a running campaign `done` when none of its contacts is pending or dialling, and write its
        `campaign.done` event (same transaction: exactly one, even with several servers on the store)."""
        left = int(
            await self.scalar(
                "SELECT COUNT(*) AS n FROM contacts WHERE campaign_id = ? AND state <> 'done'", [campaign_id]
            )
        )
        if left:
            return False
        changed = await self.execute(
            "UPDATE campaigns SET state = 'done' WHERE id = ? AND state = 'running'", [campaign_id]
        )
        if changed != 1:
            return False
        counts = await self.counts(campaign_id)
        name = await self.scalar("SELECT name FROM campaigns WHERE id = ?", [campaign_id])
        await self.emit(
            "campaign.done",
            data={"campaign_id": campaign_id, "name": name, "contacts": sum(counts.values()),
                  "attempts": await self.attempt_count(campaign_id), "counts": counts},
        )  # fmt: skip
        return True

    @property
    def owner(self) -> str:
        return self.server_id

    async def dnc_add(self, numbers: Sequence[str], *, now: float, source: str = "api") -> int:
        added = 0
        for number in numbers:
            added += await self.execute(
                "INSERT INTO dnc (number, added_at, source) VALUES (?, ?, ?) ON CONFLICT (number) DO NOTHING",
                [normalize_number(number), now, source],
            )
        return added

    async def dnc_remove(self, numbers: Sequence[str]) -> int:
        removed = 0
        for number in numbers:
            removed += await self.execute("DELETE FROM dnc WHERE number = ?", [normalize_number(number)])
        return removed

    async def dnc_has(self, number: str) -> bool:
        return (
            await self.fetchone("SELECT number FROM dnc WHERE number = ?", [normalize_number(number)])
            is not None
        )

    async def dnc_list(self) -> list[Row]:
        return await self.fetchall("SELECT number, added_at, source FROM dnc ORDER BY number")


__all__ = ["CAMPAIGN_STATES", "Campaign", "CampaignOps", "Claim", "Contact", "normalize_number"]
