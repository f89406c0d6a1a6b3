"""Luigi's reservations: tables and bookings in SQLite, exposed to the agent as `@tool` functions.

The database is the file named by `RESTAURANT_DB` (default `restaurant.sqlite3` in the working directory),
created and seeded with the dining room on first use. Bookings are for tonight's service (5 PM to 10 PM, on
the hour) and are keyed by the caller's phone number, which the tools take from the call context: callers
never have to say it, and the router never sees it as an argument.

Example:
    >>> import asyncio, os, tempfile
    >>> from duetaspan.registry import CallContext, ToolRegistry
    >>> os.environ["RESTAURANT_DB"] = os.path.join(tempfile.mkdtemp(), "r.sqlite3")
    >>> registry = ToolRegistry([check_availability, book_table, cancel_booking, find_booking])
    >>> ctx = CallContext(caller="+15550001111")
    >>> asyncio.run(registry.call("book_table", {"people": 4, "time": "7 PM"}, ctx)).reference
    '(tool result) Booked a table for 4 at 7 PM tonight, confirmation L-0001.'
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from duetaspan.registry import CallContext, ToolFailed, tool

DB_ENV = "RESTAURANT_DB"
TABLES = {1: 2, 2: 2, 3: 4, 4: 4, 5: 6}  # table number -> seats
FIRST_SEATING, LAST_SEATING = 17, 21  # hours (24 h clock) a table can be booked for
_SCHEMA = """
CREATE TABLE IF NOT EXISTS tables (id INTEGER PRIMARY KEY, seats INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS bookings (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    phone TEXT NOT NULL,
    table_id INTEGER NOT NULL REFERENCES tables(id),
    people INTEGER NOT NULL,
    day TEXT NOT NULL,
    hour INTEGER NOT NULL,
    status TEXT NOT NULL DEFAULT 'booked'
);
"""


def database_path() -> Path:
    return Path(os.environ.get(DB_ENV) or "restaurant.sqlite3")


@contextlib.contextmanager
def connect(path: Path | None = None) -> Iterator[sqlite3.Connection]:
    """A connection to the reservations database (created and seeded when missing); commits on success."""
    db = sqlite3.connect(path or database_path())
    db.row_factory = sqlite3.Row
    try:
        db.executescript(_SCHEMA)
        db.executemany("INSERT OR IGNORE INTO tables (id, seats) VALUES (?, ?)", TABLES.items())
        yield db
        db.commit()
    finally:
        db.close()


def parse_hour(text: str) -> int:
    """'7 PM', '7pm', '7:00 p.m.', '19:00' or '19' -> 19. Raises `ToolFailed` outside tonight's seatings."""
    match = re.fullmatch(r"\s*(\d{1,2})(?::(\d{2}))?\s*([ap])?\.?\s*m?\.?\s*", text.lower())
    if not match:
        raise ToolFailed(f"I did not understand the time {text!r}; say for example 7 PM")
    hour, minutes, half = int(match[1]), int(match[2] or 0), match[3]
    if half == "p" and hour < 12:
        hour += 12
    elif half is None and hour < 12:
        hour += 12  # "at seven" means the evening: the restaurant only serves dinner
    if minutes or not FIRST_SEATING <= hour <= LAST_SEATING:
        raise ToolFailed("we seat guests on the hour from 5 PM to 9 PM")
    return hour


def spoken_hour(hour: int) -> str:
    return f"{hour - 12 if hour > 12 else hour} PM"


def _free_table(db: sqlite3.Connection, people: int, day: str, hour: int) -> int | None:
    row = db.execute(
        """SELECT id FROM tables WHERE seats >= ? AND id NOT IN (
               SELECT table_id FROM bookings WHERE day = ? AND hour = ? AND status = 'booked')
           ORDER BY seats, id LIMIT 1""",
        (people, day, hour),
    ).fetchone()
    return None if row is None else int(row["id"])


def _caller(ctx: CallContext) -> str:
    if not ctx.caller:
        raise ToolFailed("I cannot see the number you are calling from, so I cannot hold a booking")
    return ctx.caller


def _today() -> str:
    return dt.date.today().isoformat()


def _tonights_bookings(db: sqlite3.Connection, phone: str) -> list[sqlite3.Row]:
    """The live bookings for tonight under `phone`."""
    return db.execute(
        "SELECT id, people, hour FROM bookings WHERE phone = ? AND day = ? AND status = 'booked'",
        (phone, _today()),
    ).fetchall()


def _party(people: int) -> int:
    if not 1 <= people <= max(TABLES.values()):
        raise ToolFailed(f"our largest table seats {max(TABLES.values())}")
    return people


@tool(render=lambda r: r["sentence"])
def check_availability(people: int, time: str) -> dict:
    """Whether a table for a party is free tonight at a time, with the nearest free times if not.

    Args:
        people: party size
        time: the time the caller wants, e.g. "7 PM"
    """
    hour, people, day = parse_hour(time), _party(people), _today()
    with connect() as db:
        if _free_table(db, people, day, hour) is not None:
            sentence = f"Yes, a table for {people} is free at {spoken_hour(hour)} tonight."
            return {"available": True, "time": spoken_hour(hour), "people": people, "sentence": sentence}
        others = [
            h for h in range(FIRST_SEATING, LAST_SEATING + 1) if _free_table(db, people, day, h) is not None
        ]
    others.sort(key=lambda h: abs(h - hour))
    times = [spoken_hour(h) for h in others[:2]]
    sentence = f"No table for {people} at {spoken_hour(hour)}" + (
        f"; free instead at {' or '.join(times)}." if times else "; tonight is fully booked."
    )
    return {"available": False, "time": spoken_hour(hour), "people": people, "alternatives": times,
            "sentence": sentence}  # fmt: skip


@tool(side_effect=True, render=lambda r: r["sentence"])
def book_table(people: int, time: str, ctx: CallContext) -> dict:
    """Book a table for tonight under the caller's phone number. Only when the caller asks to book.

    Args:
        people: party size
        time: e.g. "7 PM"
    """
    hour, people, day, phone = parse_hour(time), _party(people), _today(), _caller(ctx)
    with connect() as db:
        table = _free_table(db, people, day, hour)
        if table is None:
            raise ToolFailed(f"no table for {people} is free at {spoken_hour(hour)}")
        cur = db.execute(
            "INSERT INTO bookings (phone, table_id, people, day, hour) VALUES (?, ?, ?, ?, ?)",
            (phone, table, people, day, hour),
        )
        booking = int(cur.lastrowid or 0)
    confirmation = f"L-{booking:04d}"
    sentence = f"Booked a table for {people} at {spoken_hour(hour)} tonight, confirmation {confirmation}."
    return {"booked": True, "confirmation": confirmation, "people": people, "time": spoken_hour(hour),
            "table": table, "sentence": sentence}  # fmt: skip


@tool(side_effect=True, render=lambda r: r["sentence"])
def cancel_booking(ctx: CallContext) -> dict:
    """Cancel the caller's bookings for tonight. Only when the caller asks to cancel."""
    phone = _caller(ctx)
    with connect() as db:
        rows = _tonights_bookings(db, phone)
        db.executemany("UPDATE bookings SET status = 'cancelled' WHERE id = ?", [(r["id"],) for r in rows])
    if not rows:
        return {"cancelled": 0, "sentence": "There is no booking under this number for tonight."}
    what = ", ".join(f"{r['people']} at {spoken_hour(r['hour'])}" for r in rows)
    return {"cancelled": len(rows), "sentence": f"Cancelled the booking for {what} tonight."}


@tool(render=lambda r: r["sentence"])
def find_booking(ctx: CallContext) -> dict:
    """The caller's bookings for tonight (looked up by the number they call from)."""
    phone = _caller(ctx)
    with connect() as db:
        rows = _tonights_bookings(db, phone)
    if not rows:
        return {"bookings": [], "sentence": "There is no booking under this number for tonight."}
    what = "; ".join(f"{r['people']} at {spoken_hour(r['hour'])}, confirmation L-{r['id']:04d}" for r in rows)
    return {"bookings": [dict(r) for r in rows], "sentence": f"Booked tonight: {what}."}
