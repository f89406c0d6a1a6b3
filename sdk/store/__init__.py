"""`duetaspan.store`: one durable store for what must outlive a process: the call index, campaigns (contacts,
attempts, leases), the do-not-call list and the event outbox. SQLite by default (a file in the server's
data folder), PostgreSQL for several servers (`[store] url`). See docs/store.md.

Example:
    >>> import asyncio, tempfile, os
    >>> async def demo():
    ...     store = await open_store(os.path.join(tempfile.mkdtemp(), "s.sqlite3"))
    ...     async with store.transaction() as tx:
    ...         await tx.index_call(CallEntry("CA1", transport="sip", outcome="answered"))
    ...         await tx.emit("call.ended", call_id="CA1", data={"outcome": "answered"})
    ...     async with store.transaction() as tx:
    ...         calls, events = await tx.calls(), await tx.events()
    ...     await store.close()
    ...     return calls[0].outcome, events[0].type
    >>> asyncio.run(demo())
    ('answered', 'call.ended')
"""

from __future__ import annotations

from pathlib import Path

from duetaspan.store.backfill import index_folder
from duetaspan.store.base import CLOCK_FILE_ENV, Clock, StoreError
from duetaspan.store.calls import CallEntry, entry_from_record
from duetaspan.store.campaigns import Campaign, Claim, Contact, normalize_number
from duetaspan.store.db import (
    SQLITE_NAME,
    PostgresStore,
    SqliteStore,
    Store,
    Tx,
    migrate,
    migration_names,
    open_store,
)
from duetaspan.store.outbox import Event

STORE_URL_ENV = "DUETASPAN_STORE_URL"


def store_target(
    url: str | None, path: Path | None, data_dir: Path, env: dict[str, str] | None = None
) -> str:
    """Where the store is: `$DUETASPAN_STORE_URL` (a PostgreSQL URL or a SQLite file path), else `[store] url`,
    else `[store] path`, else the SQLite file in the data folder."""
    import os

    env_url = (os.environ if env is None else env).get(STORE_URL_ENV)
    return env_url or url or str(path or Path(data_dir) / SQLITE_NAME)


__all__ = [
    "CLOCK_FILE_ENV",
    "SQLITE_NAME",
    "STORE_URL_ENV",
    "CallEntry",
    "Campaign",
    "Claim",
    "Clock",
    "Contact",
    "Event",
    "PostgresStore",
    "SqliteStore",
    "Store",
    "StoreError",
    "Tx",
    "entry_from_record",
    "index_folder",
    "migrate",
    "migration_names",
    "normalize_number",
    "open_store",
    "store_target",
]
