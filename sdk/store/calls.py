"""The call index: one row per call record (id, numbers, times, transport, outcome, verdict, campaign,
artefact paths), so that listing and filtering calls (`GET /admin/calls`, the viewer's list) reads a table
instead of every file of the record folder.

`entry_from_record(record, folder)` turns a call record (`duetaspan.pipeline.artifacts`) into a row;
`duetaspan.store.backfill.index_folder(store, folder)` indexes a whole old record folder once.

Example:
    >>> entry = entry_from_record({"call_id": "CA1", "meta": {"transport": "sip", "caller": "7001"},
    ...                            "started_at": 10.0, "ended_at": 12.5, "complete": True}, None)
    >>> entry.transport, entry.from_number, entry.duration_s
    ('sip', '7001', 2.5)
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from duetaspan.store.base import Row, SqlTx

log = logging.getLogger("duetaspan.store")
MAX_LIMIT = 1000
# after-call work a served call is owed (the `owed` column): `end` from its start until its `call.ended` is
# committed, `analysis` from then until its `call.analyzed` is, where analysis is on (duetaspan.webhooks.lifecycle)
OWED = ("end", "analysis")
MAX_OWED = 10000  # per pass: the live calls of every server on the store and the ones a kill left


@dataclass
class CallEntry:
    """One indexed call. Times are epoch seconds; paths are absolute (None: not written)."""

    id: str
    transport: str | None = None
    direction: str | None = None
    from_number: str | None = None
    to_number: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    duration_s: float | None = None
    outcome: str | None = None
    verdict: str | None = None
    complete: bool = False
    campaign_id: str | None = None
    record_path: str | None = None
    wav_path: str | None = None
    jsonl_path: str | None = None
    spans: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_COLUMNS = [f.name for f in fields(CallEntry)]


def _entry(row: Row) -> CallEntry:
    data = {k: row[k] for k in _COLUMNS}
    data["complete"] = bool(data["complete"])
    return CallEntry(**data)


def entry_from_record(record: dict[str, Any], folder: Path | None, **extra: Any) -> CallEntry:
    """The index row of a call record; `folder` is where its files lie (paths are set for those that exist)."""
    meta = record.get("meta") or {}
    summary = record.get("summary") or {}
    call_id = str(record.get("call_id") or extra.pop("id", ""))
    started, ended = record.get("started_at"), record.get("ended_at")
    duration = None
    frames = int(summary.get("frames") or len(record.get("frames") or []))
    if frames:  # the call's length as heard: frames of 80 ms (the wav's length)
        duration = round(frames * float(record.get("frame_ms") or 80.0) / 1000.0, 3)
    elif isinstance(started, int | float) and isinstance(ended, int | float):
        duration = round(float(ended) - float(started), 3)
    paths: dict[str, str | None] = {"record_path": None, "wav_path": None, "jsonl_path": None}
    if folder is not None:
        stem = "".join(c if c.isalnum() or c in "_.-" else "_" for c in call_id) or "call"
        for key, suffix in (("record_path", ".json"), ("wav_path", ".wav"), ("jsonl_path", ".jsonl")):
            path = Path(folder) / f"{stem}{suffix}"
            paths[key] = str(path.resolve()) if path.exists() else None
    verdict = meta.get("verdict") or summary.get("verdict")
    entry = CallEntry(
        id=call_id,
        transport=meta.get("transport"),
        direction=meta.get("direction"),
        from_number=meta.get("caller"),
        to_number=meta.get("called"),
        started_at=started,
        ended_at=ended,
        duration_s=duration,
        outcome=meta.get("outcome") or summary.get("ended_by"),
        verdict=verdict if isinstance(verdict, str) else None,
        complete=bool(record.get("complete")),
        campaign_id=meta.get("campaign_id"),
        spans=len(record.get("spans") or []),
        **paths,
    )
    for key, value in extra.items():
        setattr(entry, key, value)
    return entry


class CallIndexOps(SqlTx):
    """The call index's statements (mixed into every backend's transaction)."""

    async def index_call(self, entry: CallEntry) -> None:
        """Insert or replace the row of `entry.id` (a call indexed again, e.g. at its end, is updated)."""
        cols = [*_COLUMNS, "indexed_at"]
        values = [getattr(entry, c) for c in _COLUMNS] + [time.time()]
        values[_COLUMNS.index("complete")] = int(entry.complete)
        updates = ", ".join(f"{c} = excluded.{c}" for c in cols if c != "id")
        await self.execute(
            f"INSERT INTO calls ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) "
            f"ON CONFLICT (id) DO UPDATE SET {updates}",
            values,
        )

    async def call(self, call_id: str) -> CallEntry | None:
        row = await self.fetchone(f"SELECT {', '.join(_COLUMNS)} FROM calls WHERE id = ?", [call_id])
        return _entry(row) if row else None

    async def calls(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        outcome: str | None = None,
        number: str | None = None,
        campaign: str | None = None,
        transport: str | None = None,
        limit: int = 100,
    ) -> list[CallEntry]:
        """Calls newest first: started in [since, until), with this outcome, from or to this number, of this
        campaign (its id)."""
        where: list[str] = []
        params: list[Any] = []
        if since is not None:
            where.append("started_at >= ?")
            params.append(since)
        if until is not None:
            where.append("started_at < ?")
            params.append(until)
        for column, value in (("outcome", outcome), ("campaign_id", campaign), ("transport", transport)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if number is not None:
            where.append("(from_number = ? OR to_number = ?)")
            params += [number, number]
        sql = f"SELECT {', '.join(_COLUMNS)} FROM calls"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY started_at DESC, id DESC LIMIT ?"
        params.append(max(1, min(int(limit), MAX_LIMIT)))
        return [_entry(r) for r in await self.fetchall(sql, params)]

    async def set_owed(self, call_id: str, owed: str | None) -> None:
        """What after-call work the call `call_id` is still owed (`OWED`), None: nothing."""
        if owed is not None and owed not in OWED:
            raise ValueError(f"owed must be one of {OWED} or None, not {owed!r}")
        await self.execute("UPDATE calls SET owed = ? WHERE id = ?", [owed, call_id])

    async def owed_calls(self) -> list[tuple[str, str]]:
        """The calls still owed after-call work, oldest first: (id, what is owed)."""
        rows = await self.fetchall(
            "SELECT id, owed FROM calls WHERE owed IS NOT NULL ORDER BY started_at, id LIMIT ?", [MAX_OWED]
        )
        return [(r["id"], r["owed"]) for r in rows]

    async def indexed_ids(self) -> set[str]:
        return {r["id"] for r in await self.fetchall("SELECT id FROM calls")}

    async def meta_value(self, key: str) -> str | None:
        row = await self.fetchone("SELECT value FROM store_meta WHERE key = ?", [key])
        return row["value"] if row else None

    async def set_meta_value(self, key: str, value: str) -> None:
        await self.execute(
            "INSERT INTO store_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = "
            "excluded.value",
            [key, value],
        )


__all__ = ["CallEntry", "CallIndexOps", "entry_from_record"]
