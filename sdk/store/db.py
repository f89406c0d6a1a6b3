"""Opening the store: SQLite (WAL, one file) or PostgreSQL (psycopg 3, a connection pool), migrated forward
to the newest schema with yoyo-migrations, and the transaction every change goes through.

    store = await open_store(url_or_path)
    async with store.transaction() as tx:     # one database transaction: all of it or none of it
        await tx.index_call(entry)
        await tx.emit("call.ended", call_id=entry.id, data={...})
    await store.close()

SQLite runs on one worker thread of its own (the event loop never waits on the disk); a transaction is
`BEGIN IMMEDIATE` ... `COMMIT`, so two servers on one file serialise (busy timeout 10 s). PostgreSQL
transactions take a pooled connection each; claims lock rows with `FOR UPDATE SKIP LOCKED`.

Migrations: the SQL files of `duetaspan/store/migrations` (`0001_initial.sql`, `0002_...`), applied in order
by yoyo under its lock (several servers starting at once apply each migration once). yoyo needs no ORM
(Alembic would bring SQLAlchemy Core for a schema of plain SQL); see docs/store.md.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from duetaspan.store.base import Clock, Row, StoreError
from duetaspan.store.calls import CallIndexOps
from duetaspan.store.campaigns import CampaignOps

log = logging.getLogger("duetaspan.store")
MIGRATIONS = Path(__file__).with_name("migrations")
SQLITE_NAME = "duetaspan.sqlite3"
POSTGRES_PACKAGE = "psycopg"


class Tx(CallIndexOps, CampaignOps):
    """A transaction with every statement of the store (the call index, the outbox, campaigns, DNC)."""


def migration_names() -> list[str]:
    return sorted(p.stem for p in MIGRATIONS.glob("*.sql"))


def _yoyo_uri(target: str) -> str:
    if target.startswith(("postgres://", "postgresql://")):
        return "postgresql+psycopg://" + target.split("://", 1)[1]
    return "sqlite:///" + quote(str(Path(target).resolve()))


def migrate(target: str, *, up_to: str | None = None) -> list[str]:
    """Apply the migrations not applied yet to `target` (a SQLite path or a PostgreSQL URL), in order, up to
    and including `up_to` (None: all); the ids applied."""
    from yoyo import get_backend, read_migrations  # type: ignore[import-untyped]

    if not target.startswith(("postgres://", "postgresql://")):
        try:
            Path(target).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"store {target}: cannot create its folder: {exc.strerror or exc}") from exc
    try:
        backend = get_backend(_yoyo_uri(target))
    except Exception as exc:
        raise StoreError(f"store {_safe(target)}: cannot connect to migrate it: {exc}") from exc
    migrations = read_migrations(str(MIGRATIONS))
    if up_to is not None:
        names = migration_names()
        keep = set(names[: names.index(up_to) + 1])
        migrations = migrations.filter(lambda m: m.id in keep)
    try:
        with backend.lock():
            todo = backend.to_apply(migrations)
            backend.apply_migrations(todo)
    finally:
        backend.connection.close()
    if not target.startswith(("postgres://", "postgresql://")):
        Path(target).chmod(0o600)  # call numbers and outcomes: the owner's only
    return [m.id for m in todo]


def _safe(target: str) -> str:
    """A URL without its password, for messages."""
    if "://" in target and "@" in target.split("://", 1)[1].split("/", 1)[0]:
        scheme, rest = target.split("://", 1)
        creds, host = rest.split("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}" if ":" in creds else target
    return target


class Store:
    """The durable store. Build it with `open_store`; every change is a `transaction()`."""

    kind = "base"

    def __init__(self, *, clock: Clock | None = None, server_id: str | None = None) -> None:
        import os
        import socket

        self.clock = clock or Clock()
        self.server_id = server_id or f"{socket.gethostname()}:{os.getpid()}"
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, work: Any) -> None:
        """Run a coroutine of store writes in the background (e.g. indexing a call as it ends, from a sync
        callback); `close()` waits for them."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("store: a background write failed: %s", task.exception())

    async def drain(self) -> None:
        """Wait for the background writes."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def transaction(self, *, snapshot: bool = False) -> Any:  # an async context manager yielding a Tx
        """One database transaction. `snapshot`: every read in it sees the database at one moment (a status
        made of several queries); SQLite's `BEGIN IMMEDIATE` always does, PostgreSQL's default (READ COMMITTED)
        gives each statement its own moment, so there it asks for REPEATABLE READ."""
        raise NotImplementedError

    async def close(self) -> None:
        """Close the connections (idempotent)."""


def _rollback(conn: sqlite3.Connection) -> None:
    """End the connection's open transaction, if any (none when BEGIN failed or COMMIT went through)."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")


class _SqliteTx(Tx):
    dialect = "sqlite"

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self.server_id = store.server_id

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return await self._store._run(lambda c: c.execute(sql, tuple(params)).rowcount)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return await self._store._run(lambda c: [dict(r) for r in c.execute(sql, tuple(params)).fetchall()])


class SqliteStore(Store):
    """SQLite in WAL mode, on a worker thread of its own."""

    kind = "sqlite"

    def __init__(self, path: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.path = path
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="duetaspan-store")
        self._lock = asyncio.Lock()
        self._conn: sqlite3.Connection | None = None

    def _connect(self) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10.0)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        self._conn = conn

    async def _run(self, fn: Any) -> Any:
        def call() -> Any:
            if self._conn is None:
                self._connect()
            return fn(self._conn)

        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    @asynccontextmanager
    async def transaction(self, *, snapshot: bool = False) -> AsyncIterator[Tx]:
        async with self._lock:
            try:
                # BEGIN inside the try: a task cancelled while BEGIN waits for another process's write lock (the
                # busy timeout) stops waiting, but the worker thread still runs BEGIN; the rollback queued behind
                # it on that one thread ends what BEGIN (or a failed COMMIT) left open
                await self._run(lambda c: c.execute("BEGIN IMMEDIATE"))
                yield _SqliteTx(self)
                await self._run(lambda c: c.execute("COMMIT"))
            except BaseException:
                await asyncio.shield(self._run(_rollback))
                raise

    async def close(self) -> None:
        await self.drain()
        if self._conn is not None:
            await self._run(lambda c: c.close())
            self._conn = None
        self._pool.shutdown(wait=False)


class _PgTx(Tx):
    dialect = "postgresql"
    lock_suffix = " FOR UPDATE SKIP LOCKED"
    row_lock = " FOR UPDATE"

    def __init__(self, conn: Any, server_id: str) -> None:
        self._conn = conn
        self.server_id = server_id

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        cur = await self._conn.execute(sql.replace("?", "%s"), tuple(params))
        return int(cur.rowcount)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        cur = await self._conn.execute(sql.replace("?", "%s"), tuple(params))
        return list(await cur.fetchall())


class PostgresStore(Store):
    """PostgreSQL through psycopg 3's async connection pool."""

    kind = "postgresql"

    def __init__(self, url: str, pool: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.url = url
        self._pool = pool

    @asynccontextmanager
    async def transaction(self, *, snapshot: bool = False) -> AsyncIterator[Tx]:
        async with self._pool.connection() as conn, conn.transaction():
            if snapshot:  # the transaction's first statement: its reads then share one snapshot
                await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            yield _PgTx(conn, self.server_id)

    async def close(self) -> None:
        await self.drain()
        await self._pool.close()


async def open_store(
    target: str | Path, *, clock: Clock | None = None, server_id: str | None = None, pool_size: int = 4
) -> Store:
    """The store at `target`: a `postgresql://` URL, else a SQLite file path (its folder is created);
    migrated to the newest schema first."""
    target = str(target)
    postgres = target.startswith(("postgres://", "postgresql://"))
    if postgres:
        try:
            import psycopg  # noqa: F401
            from psycopg_pool import AsyncConnectionPool
        except ImportError as exc:
            raise StoreError(
                f"[store] url is PostgreSQL but the driver is missing ({exc.name}): "
                "pip install 'duetaspan[postgres]' (psycopg, psycopg-pool)"
            ) from None
    try:
        applied = await asyncio.to_thread(migrate, target)
    except StoreError:
        raise
    except Exception as exc:
        raise StoreError(f"store {_safe(target)}: migration failed: {exc}") from exc
    if applied:
        log.info("store %s: applied migrations %s", _safe(target), ", ".join(applied))
    if not postgres:
        return SqliteStore(Path(target), clock=clock, server_id=server_id)
    from psycopg.rows import dict_row

    pool = AsyncConnectionPool(
        target,
        min_size=1,
        max_size=pool_size,
        open=False,
        kwargs={"row_factory": dict_row, "autocommit": True},
    )
    try:
        await pool.open(wait=True, timeout=15.0)
    except Exception as exc:
        await pool.close()
        raise StoreError(f"store {_safe(target)}: cannot connect: {exc}") from exc
    return PostgresStore(target, pool, clock=clock, server_id=server_id)


__all__ = [
    "MIGRATIONS",
    "POSTGRES_PACKAGE",
    "SQLITE_NAME",
    "PostgresStore",
    "SqliteStore",
    "Store",
    "Tx",
    "migrate",
    "migration_names",
    "open_store",
]
