"""The event outbox: an event is appended in the same transaction as the state change it reports (a call
indexed, an attempt finished), so that it exists if and only if the change does; a deliverer (webhooks)
claims due events, sends them and records the answer.

Row: `id`, `type`, `created`, `call_id`, `data` (JSON), `state` (`pending`, `delivered`, `dead`), `attempts`,
`next_attempt_at`, `last_answer`. A claim moves `next_attempt_at` past the claim's lease, so another
deliverer (another server on the same PostgreSQL) skips the event until the lease ends; rows are locked with
`FOR UPDATE SKIP LOCKED` there.

Example:
    >>> # async with store.transaction() as tx:
    >>> #     await tx.index_call(entry)
    >>> #     await tx.emit("call.ended", call_id=entry.id, data={"outcome": "answered"})
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from duetaspan.store.base import Row, SqlTx, dumps, loads, new_id

STATES = ("pending", "delivered", "dead")


@dataclass
class Event:
    """One outbox event."""

    type: str
    data: dict[str, Any] = field(default_factory=dict)
    call_id: str | None = None
    id: str = field(default_factory=lambda: new_id("evt"))
    created: float = field(default_factory=time.time)
    state: str = "pending"
    attempts: int = 0
    next_attempt_at: float = 0.0
    last_answer: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type,
            "created": self.created,
            "call_id": self.call_id,
            "data": self.data,
        }


def _event(row: Row) -> Event:
    return Event(
        type=row["type"],
        data=loads(row["data"]) or {},
        call_id=row["call_id"],
        id=row["id"],
        created=row["created"],
        state=row["state"],
        attempts=row["attempts"],
        next_attempt_at=row["next_attempt_at"],
        last_answer=row["last_answer"],
    )


_COLS = "id, type, created, call_id, data, state, attempts, next_attempt_at, last_answer"


class OutboxOps(SqlTx):
    """The outbox's statements (mixed into every backend's transaction)."""

    async def emit(
        self, event: Event | str, *, call_id: str | None = None, data: dict[str, Any] | None = None
    ) -> Event:
        """Append an event (an `Event`, or its type with `call_id` and `data`); due at once."""
        if isinstance(event, str):
            event = Event(type=event, data=data or {}, call_id=call_id)
        if not event.next_attempt_at:
            event.next_attempt_at = event.created
        await self.execute(
            f"INSERT INTO outbox ({_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                event.id,
                event.type,
                event.created,
                event.call_id,
                dumps(event.data),
                event.state,
                event.attempts,
                event.next_attempt_at,
                event.last_answer,
            ],
        )
        return event

    async def claim_events(
        self, *, now: float | None = None, lease_s: float = 30.0, limit: int = 50
    ) -> list[Event]:
        """Pending events due by `now`, oldest first, each held for `lease_s` (its `next_attempt_at` moves
        there, so no other deliverer takes it meanwhile)."""
        now = time.time() if now is None else now
        rows = await self.fetchall(
            f"SELECT {_COLS} FROM outbox WHERE state = 'pending' AND next_attempt_at <= ? "
            f"ORDER BY created, id LIMIT ?{self.lock_suffix}",
            [now, limit],
        )
        for row in rows:
            await self.execute(
                "UPDATE outbox SET next_attempt_at = ? WHERE id = ?", [now + lease_s, row["id"]]
            )
        return [_event(r) for r in rows]

    async def event_delivered(self, event_id: str, answer: str | None = None) -> None:
        await self.execute(
            "UPDATE outbox SET state = 'delivered', attempts = attempts + 1, last_answer = ? WHERE id = ?",
            [answer, event_id],
        )

    async def event_failed(self, event_id: str, answer: str | None, *, retry_at: float | None) -> None:
        """A failed delivery: due again at `retry_at`, or `dead` (None: no more tries)."""
        if retry_at is None:
            await self.execute(
                "UPDATE outbox SET state = 'dead', attempts = attempts + 1, last_answer = ? WHERE id = ?",
                [answer, event_id],
            )
        else:
            await self.execute(
                "UPDATE outbox SET attempts = attempts + 1, last_answer = ?, next_attempt_at = ? WHERE id = ?",
                [answer, retry_at, event_id],
            )

    async def events(
        self,
        *,
        state: str | None = None,
        type: str | None = None,
        call_id: str | None = None,
        limit: int = 100,
    ) -> list[Event]:
        """Events oldest first, by state, type or call."""
        where: list[str] = []
        params: list[Any] = []
        for column, value in (("state", state), ("type", type), ("call_id", call_id)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        sql = f"SELECT {_COLS} FROM outbox" + (" WHERE " + " AND ".join(where) if where else "")
        return [
            _event(r) for r in await self.fetchall(sql + " ORDER BY created, id LIMIT ?", [*params, limit])
        ]


__all__ = ["STATES", "Event", "OutboxOps"]
