"""What every store backend shares: the SQL runner a transaction is (`SqlTx`), ids, JSON and the clock.

Queries are written once, in the SQL both SQLite (3.35+) and PostgreSQL accept, with `?` placeholders; the
PostgreSQL transaction turns them into `%s`. The one thing that differs is row locking: PostgreSQL locks
the rows a claim reads (`FOR UPDATE SKIP LOCKED`, `lock_suffix`), SQLite takes the whole database for the
transaction (`BEGIN IMMEDIATE`), so claims are serialised either way.
"""

from __future__ import annotations

import json
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from duetaspan.errors import DuetaspanError

Row = dict[str, Any]
CLOCK_FILE_ENV = "DUETASPAN_TEST_CLOCK_FILE"


class StoreError(DuetaspanError):
    """The store cannot be opened or migrated (a path that is not writable, a database that refuses us, a
    driver that is not installed)."""


def new_id(prefix: str) -> str:
    """A unique id that sorts by creation time: `evt_0017f...-a1b2c3d4`."""
    return f"{prefix}_{time.time_ns():016x}{os.urandom(4).hex()}"


def dumps(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)


def loads(text: str | None) -> Any:
    return json.loads(text) if text else None


class Clock:
    """Wall-clock seconds for everything the store and the scheduler decide on time (windows, retries,
    pacing, leases), plus an offset: `offset_s`, or the number in the file `$DUETASPAN_TEST_CLOCK_FILE`
    (re-read when it changes) so that a test can move the clock of a `serve` process it cannot patch."""

    def __init__(self, offset_s: float = 0.0, file: str | None = None) -> None:
        self.offset_s = offset_s
        self.file = file if file is not None else os.environ.get(CLOCK_FILE_ENV) or None
        self._stamp: float | None = None
        self._file_offset = 0.0

    def _read_file(self) -> float:
        if not self.file:
            return 0.0
        try:
            stamp = os.stat(self.file).st_mtime_ns
            if stamp != self._stamp:
                with open(self.file, encoding="utf-8") as f:
                    self._file_offset = float(f.read().strip() or 0.0)
                self._stamp = stamp
        except (OSError, ValueError):
            pass
        return self._file_offset

    def now(self) -> float:
        return time.time() + self.offset_s + self._read_file()


class SqlTx(ABC):
    """One open transaction: statements with `?` placeholders, rows as dicts."""

    dialect: str = "sqlite"
    lock_suffix: str = ""  # appended to SELECTs whose rows a claim takes

    @abstractmethod
    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; the number of rows it changed."""

    @abstractmethod
    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """Run one query; its rows."""

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    async def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        row = await self.fetchone(sql, params)
        return next(iter(row.values())) if row else None


__all__ = ["CLOCK_FILE_ENV", "Clock", "Row", "SqlTx", "StoreError", "dumps", "loads", "new_id"]
