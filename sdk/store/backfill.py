"""Indexing an old record folder: a server started on a folder of call records written before the store
existed (or by a server without one) indexes them once; later calls are indexed as they end."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

from duetaspan.pipeline.artifacts import load_call_record
from duetaspan.store.calls import CallEntry, entry_from_record
from duetaspan.store.db import Store

log = logging.getLogger("duetaspan.store")


def _read_records(folder: Path, known: set[str]) -> list[CallEntry]:
    entries: list[CallEntry] = []
    if not folder.is_dir():
        return entries
    stems = {p.stem for p in folder.glob("*.json")} | {p.stem for p in folder.glob("*.jsonl")}
    for stem in sorted(stems - known):
        try:
            record = load_call_record(folder, stem)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            log.warning("call index: %s/%s is not a readable call record; skipped", folder, stem)
            continue
        if not isinstance(record, dict) or "frames" not in record:
            continue
        record["call_id"] = record.get("call_id") or stem
        entries.append(entry_from_record(record, folder))
    return entries


async def index_folder(store: Store, folder: Path) -> int:
    """Index every record in `folder` not indexed yet, once per folder (the store remembers it did); the number
    of calls added."""
    folder = await asyncio.to_thread(Path(folder).resolve)
    key = f"indexed_folder:{folder}"
    async with store.transaction() as tx:
        if await tx.meta_value(key) is not None:
            return 0
        known = await tx.indexed_ids()
    entries = await asyncio.to_thread(_read_records, folder, known)
    async with store.transaction() as tx:
        for entry in entries:
            await tx.index_call(entry)
        await tx.set_meta_value(key, str(time.time()))
    if entries:
        log.info("call index: indexed %d calls of the old record folder %s", len(entries), folder)
    return len(entries)


__all__ = ["index_folder"]
