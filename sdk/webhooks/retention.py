"""Retention and data-subject deletes: what we keep about calls, and for how long.

Everywhere a call's data lives: its files in the record folder (`<id>.wav`, `.jsonl`, `.json`, and the
`.tmp` of an interrupted write), its row in the store's call index, its outbox events, its campaign attempt
rows. `purge` deletes by age (the sweeper runs it with `[recording] retain_days` for audio and
`records_retain_days` for records, index rows, delivered outbox events and finished campaigns' contacts;
`duetaspan records purge --before DATE` runs it on demand); `delete_call` / `delete_number` remove one call
or one person (a data-subject request): every call from or to the number, its contact rows, its records,
and every outbox event of those calls or naming the number in its data, except that a number on the
do-not-call list stays there (the list exists to keep calling it from happening again), and so do the
`dnc.*` events that report the entry.

Outbox events nobody sends: `campaign.*` / `dnc.*` events are written whether or not `[webhooks] urls` is set
(the outbox is the store's event log; a `duetaspan campaign` or `dnc` command writing them does not know the
server's URLs, and a URL configured later gets what is still inside its retry window); `call.*` events only
when URLs are set (`AfterCall._wanted`). A server without URLs runs the sweeper for them: undelivered events
(pending or dead) older than `[webhooks] retry_for_s` are deleted (a deliverer started later would give them
up unsent anyway); `records purge --before` deletes undelivered events older than its date too.

Ages come from the files' modification time (a record is written when its call ends) and the rows' own
times (`started_at`, `created`), so files the index never saw are swept too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from duetaspan.store.campaigns import normalize_number

log = logging.getLogger(__name__)
DAY_S = 86400.0
AUDIO_SUFFIXES = (".wav",)
RECORD_SUFFIXES = (".json", ".jsonl", ".wav", ".json.tmp", ".jsonl.tmp")
FINISHED_CAMPAIGNS = ("done", "cancelled")
# A data-subject delete keeps the do-not-call entry and the outbox events that report it (`dnc.added`,
# `dnc.changed`): they carry the opt-out to your systems (a pending one is still delivered) and are its trail.
KEPT_EVENTS = "dnc."
NUMBER_FIELDS = ("to", "caller", "called", "number")  # the event data fields that hold a person's number


@dataclass
class Purged:
    """What one purge or delete removed."""

    audio_files: int = 0
    record_files: int = 0
    bytes: int = 0
    index_rows: int = 0
    outbox_rows: int = 0
    contact_rows: int = 0
    attempt_rows: int = 0
    calls: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return (
            f"{self.audio_files} audio files, {self.record_files} record files ({self.bytes / 1e6:.1f} MB), "
            f"{self.index_rows} index rows, {self.outbox_rows} outbox events, {self.contact_rows} contacts, "
            f"{self.attempt_rows} attempts"
        )


def _unlink(path: Path, out: Purged, *, audio: bool) -> None:
    try:
        size = path.stat().st_size
        path.unlink()
    except FileNotFoundError:
        return
    out.bytes += size
    if audio:
        out.audio_files += 1
    else:
        out.record_files += 1


def _stem(name: str) -> str:
    for suffix in sorted(RECORD_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _old_files(
    record_dir: Path | None, audio_before: float | None, records_before: float | None
) -> list[tuple[Path, bool]]:
    """The files to delete, each with whether it is audio."""
    if record_dir is None or not Path(record_dir).is_dir():
        return []
    out = []
    for path in sorted(Path(record_dir).iterdir()):
        if not path.is_file() or not path.name.endswith(RECORD_SUFFIXES):
            continue
        mtime = path.stat().st_mtime
        if records_before is not None and mtime < records_before:
            out.append((path, path.suffix == ".wav"))
        elif audio_before is not None and path.suffix == ".wav" and mtime < audio_before:
            out.append((path, True))
    return out


def _folder_calls(record_dir: Path | None, key: str) -> set[str]:
    """The ids of the calls in the folder from or to the number `key` (records and crash journals)."""
    ids: set[str] = set()
    if record_dir is None or not Path(record_dir).is_dir():
        return ids
    for path in Path(record_dir).iterdir():
        if path.suffix == ".json" and key in _record_numbers(path):
            ids.add(_stem(path.name))
        elif path.suffix == ".jsonl" and key in _journal_numbers(path):
            ids.add(_stem(path.name))
    return ids


async def purge(
    store: Any,
    record_dir: Path | None,
    *,
    audio_before: float | None = None,
    records_before: float | None = None,
    undelivered_before: float | None = None,
) -> Purged:
    """Delete audio older than `audio_before` and records (files, index rows, delivered outbox events,
    finished campaigns' contacts and attempts) older than `records_before`, and undelivered outbox events
    (pending or dead) older than `undelivered_before` (unix seconds; None: keep)."""
    out = Purged()
    for path, audio in _old_files(record_dir, audio_before, records_before):
        _unlink(path, out, audio=audio)
    if store is not None and undelivered_before is not None:
        async with store.transaction() as tx:
            out.outbox_rows += await tx.execute(
                "DELETE FROM outbox WHERE state <> 'delivered' AND created < ?", [undelivered_before]
            )
    if store is not None and records_before is not None:
        async with store.transaction() as tx:
            out.index_rows = await tx.execute("DELETE FROM calls WHERE started_at < ?", [records_before])
            out.outbox_rows += await tx.execute(
                "DELETE FROM outbox WHERE state = 'delivered' AND created < ?", [records_before]
            )
            finished = "SELECT id FROM campaigns WHERE state IN ('done', 'cancelled')"
            old = f"campaign_id IN ({finished}) AND COALESCE(last_attempt_at, 0) < ?"
            out.attempt_rows = await tx.execute(
                f"DELETE FROM attempts WHERE contact_id IN (SELECT id FROM contacts WHERE {old})",
                [records_before],
            )
            out.contact_rows = await tx.execute(f"DELETE FROM contacts WHERE {old}", [records_before])
    return out


async def delete_call(store: Any, record_dir: Path | None, call_id: str) -> Purged:
    """Remove one call everywhere: its files, index row, outbox events (but `dnc.*`: see `KEPT_EVENTS`) and
    attempt rows' link to it."""
    out = Purged(calls=[call_id])
    if record_dir is not None:
        stem = "".join(c if c.isalnum() or c in "_.-" else "_" for c in call_id) or "call"
        for suffix in RECORD_SUFFIXES:
            _unlink(Path(record_dir) / f"{stem}{suffix}", out, audio=suffix == ".wav")
    if store is not None:
        async with store.transaction() as tx:
            out.index_rows += await tx.execute("DELETE FROM calls WHERE id = ?", [call_id])
            out.outbox_rows += await tx.execute(
                "DELETE FROM outbox WHERE call_id = ? AND type NOT LIKE ?", [call_id, KEPT_EVENTS + "%"]
            )
            out.attempt_rows += await tx.execute("DELETE FROM attempts WHERE call_id = ?", [call_id])
    return out


def _record_numbers(path: Path) -> set[str]:
    try:
        record = json.loads(path.read_text(errors="replace")) if path.suffix == ".json" else {}
    except (OSError, ValueError):
        return set()
    if path.suffix == ".jsonl":
        return set()
    meta = record.get("meta") or {}
    return {normalize_number(str(v)) for v in (meta.get("caller"), meta.get("called")) if v}


def _journal_numbers(path: Path) -> set[str]:
    try:
        with path.open(errors="replace") as f:
            first = json.loads(f.readline() or "{}")
    except (OSError, ValueError):
        return set()
    meta = first.get("meta") or {}
    return {normalize_number(str(v)) for v in (meta.get("caller"), meta.get("called")) if v}


async def delete_number(store: Any, record_dir: Path | None, number: str) -> Purged:
    """Remove one person's data: every call from or to `number` (index rows and record files, also those the
    index never saw), their outbox events and every other event whose data names the number (a `campaign.attempt`
    of a suppressed number has no call), and the number's campaign contacts and attempts. A do-not-call entry
    for the number stays, and so do its `dnc.*` events (`KEPT_EVENTS`)."""
    key = normalize_number(number)
    ids: set[str] = set()
    if store is not None:
        async with store.transaction() as tx:
            rows = await tx.fetchall("SELECT id, from_number, to_number FROM calls")
        ids |= {
            r["id"]
            for r in rows
            if key in {normalize_number(str(n)) for n in (r["from_number"], r["to_number"]) if n}
        }
    ids |= _folder_calls(record_dir, key)
    out = Purged()
    for call_id in sorted(ids):
        one = await delete_call(store, record_dir, call_id)
        for name in ("audio_files", "record_files", "bytes", "index_rows", "outbox_rows", "attempt_rows"):
            setattr(out, name, getattr(out, name) + getattr(one, name))
        out.calls.append(call_id)
    if store is not None:
        async with store.transaction() as tx:
            contacts = [r["id"] for r in await tx.fetchall("SELECT id, to_number FROM contacts")
                        if normalize_number(str(r["to_number"])) == key]  # fmt: skip
            for contact_id in contacts:
                out.attempt_rows += await tx.execute(
                    "DELETE FROM attempts WHERE contact_id = ?", [contact_id]
                )
                out.contact_rows += await tx.execute("DELETE FROM contacts WHERE id = ?", [contact_id])
            rows = await tx.fetchall("SELECT id, data FROM outbox WHERE type NOT LIKE ?", [KEPT_EVENTS + "%"])
            for row in rows:
                if key in _event_numbers(row["data"]):
                    out.outbox_rows += await tx.execute("DELETE FROM outbox WHERE id = ?", [row["id"]])
    return out


def _event_numbers(text: str | None) -> set[str]:
    try:
        data = json.loads(text) if text else None
    except ValueError:
        return set()
    if not isinstance(data, dict):
        return set()
    return {normalize_number(v) for k in NUMBER_FIELDS if isinstance(v := data.get(k), str) and v}


def cutoffs(
    retain_days: float | None, records_retain_days: float | None, now: float | None = None
) -> tuple[float | None, float | None]:
    """`(audio_before, records_before)` for the `[recording]` retention settings."""
    now = time.time() if now is None else now
    return (
        now - retain_days * DAY_S if retain_days else None,
        now - records_retain_days * DAY_S if records_retain_days else None,
    )


async def sweep_forever(
    store: Any, record_dir: Path | None, recording: Any, *, webhooks: Any = None, every_s: float = 3600.0
) -> None:
    """The sweeper: purge by the retention settings now and every `every_s`, logging what went; with
    `webhooks` and no `webhooks.urls`, also the undelivered outbox events past `webhooks.retry_for_s`."""
    while True:
        audio_before, records_before = cutoffs(recording.retain_days, recording.records_retain_days)
        nobody_sends = webhooks is not None and not webhooks.urls
        undelivered_before = time.time() - float(webhooks.retry_for_s) if nobody_sends else None
        try:
            out = await purge(store, record_dir, audio_before=audio_before, records_before=records_before,
                              undelivered_before=undelivered_before)  # fmt: skip
            if out.audio_files or out.record_files or out.index_rows or out.outbox_rows or out.contact_rows:
                log.info("retention sweep deleted %s", out)
        except Exception:
            log.exception("retention sweep failed (tried again in %.0f s)", every_s)
        await asyncio.sleep(every_s)


__all__ = ["KEPT_EVENTS", "Purged", "cutoffs", "delete_call", "delete_number", "purge", "sweep_forever"]
