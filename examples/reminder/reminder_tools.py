"""Harbor Dental's appointment book (SQLite) as tools for an outbound reminder call.

On an outbound call placed by `duetaspan call`, the person the agent talks to is the number that was dialled
(`ctx.called`, Twilio's `To`); if they call back, it is the caller (`ctx.caller`). The tools find the
appointment by that number, so the agent never asks who it is talking to.

The database is `REMINDER_DB` (default `reminders.sqlite3`), created on first use with one appointment:
Jordan Lee (+15551234567), cleaning, Tuesday at 10 AM; open slots on Wednesday and Thursday.

Example:
    >>> import asyncio, os, tempfile
    >>> from duetaspan.registry import CallContext, ToolRegistry
    >>> os.environ["REMINDER_DB"] = os.path.join(tempfile.mkdtemp(), "r.sqlite3")
    >>> registry = ToolRegistry([get_appointment, confirm_appointment, update_appointment, open_slots])
    >>> ctx = CallContext(caller="+15552223333", called="+15551234567")
    >>> asyncio.run(registry.call("get_appointment", {}, ctx)).reference
    '(tool result) Jordan Lee has a cleaning at Harbor Dental on Tuesday at 10 AM, not yet confirmed.'
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from duetaspan.registry import CallContext, ToolFailed, tool

DB_ENV = "REMINDER_DB"
CLINIC_NUMBERS: frozenset[str] = frozenset({"+15552223333"})  # our own lines: never a patient
_SCHEMA = """
CREATE TABLE IF NOT EXISTS appointments (
    id INTEGER PRIMARY KEY, phone TEXT UNIQUE NOT NULL, name TEXT NOT NULL, what TEXT NOT NULL,
    day TEXT NOT NULL, time TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending');
CREATE TABLE IF NOT EXISTS open_slots (day TEXT NOT NULL, time TEXT NOT NULL, PRIMARY KEY (day, time));
"""
_SLOTS = [("Wednesday", "9 AM"), ("Wednesday", "2 PM"), ("Thursday", "11 AM"), ("Thursday", "3 PM")]


def database_path() -> Path:
    return Path(os.environ.get(DB_ENV) or "reminders.sqlite3")


@contextlib.contextmanager
def connect(path: Path | None = None) -> Iterator[sqlite3.Connection]:
    """The appointment book (created with the demo appointment when missing); commits on success."""
    db = sqlite3.connect(path or database_path())
    db.row_factory = sqlite3.Row
    try:
        db.executescript(_SCHEMA)
        db.execute(
            "INSERT OR IGNORE INTO appointments (id, phone, name, what, day, time) VALUES (1, ?, ?, ?, ?, ?)",
            ("+15551234567", "Jordan Lee", "cleaning", "Tuesday", "10 AM"),
        )
        db.executemany("INSERT OR IGNORE INTO open_slots (day, time) VALUES (?, ?)", _SLOTS)
        yield db
        db.commit()
    finally:
        db.close()


def _patient_number(ctx: CallContext) -> str:
    for number in (ctx.called, ctx.caller):
        if number and number not in CLINIC_NUMBERS:
            return number
    raise ToolFailed("I cannot tell which patient this call is for")


def _appointment(db: sqlite3.Connection, ctx: CallContext) -> sqlite3.Row:
    row = db.execute("SELECT * FROM appointments WHERE phone = ?", (_patient_number(ctx),)).fetchone()
    if row is None:
        raise ToolFailed("there is no appointment for this phone number")
    return row


def _norm_time(text: str) -> str:
    """'3 pm', '3PM', '3:00 p.m.' -> '3 PM' (the book's spelling)."""
    t = text.strip().upper().replace(".", "").replace(":00", "").replace(" ", "")
    return t[:-2] + " " + t[-2:] if t.endswith(("AM", "PM")) else t


def _sentence(result: dict) -> str:
    return result["sentence"]


@tool(render=_sentence)
def get_appointment(ctx: CallContext) -> dict:
    """The appointment of the person on the line: what, which day, what time, confirmed or not."""
    with connect() as db:
        a = _appointment(db, ctx)
    state = "confirmed" if a["status"] == "confirmed" else "not yet confirmed"
    sentence = f"{a['name']} has a {a['what']} at Harbor Dental on {a['day']} at {a['time']}, {state}."
    return {"name": a["name"], "what": a["what"], "day": a["day"], "time": a["time"], "status": a["status"],
            "sentence": sentence}  # fmt: skip


@tool(render=_sentence)
def open_slots(day: str | None = None) -> dict:
    """Free appointment times, on one day or all week.

    Args:
        day: a weekday name, e.g. "Thursday" (omit for all free times)
    """
    with connect() as db:
        rows = db.execute("SELECT day, time FROM open_slots").fetchall()
    slots = [f"{r['day']} {r['time']}" for r in rows if day is None or r["day"].lower() == day.lower()]
    return {"slots": slots, "sentence": ("Free: " + ", ".join(slots) + ".") if slots else "No free times."}


@tool(side_effect=True, render=_sentence)
def confirm_appointment(ctx: CallContext) -> dict:
    """Mark the appointment as confirmed. Only when the person says they confirm it."""
    with connect() as db:
        a = _appointment(db, ctx)
        db.execute("UPDATE appointments SET status = 'confirmed' WHERE id = ?", (a["id"],))
    return {"confirmed": True, "sentence": f"Confirmed: {a['what']} on {a['day']} at {a['time']}."}


@tool(side_effect=True, render=_sentence)
def update_appointment(day: str, time: str, ctx: CallContext) -> dict:
    """Reschedule the appointment to a free time. Only when the person asks to change or move it.

    Args:
        day: weekday name, e.g. "Thursday"
        time: e.g. "3 PM"
    """
    day, time = day.strip().capitalize(), _norm_time(time)
    with connect() as db:
        a = _appointment(db, ctx)
        if db.execute("DELETE FROM open_slots WHERE day = ? AND time = ?", (day, time)).rowcount == 0:
            raise ToolFailed(f"{day} at {time} is not free")
        db.execute("INSERT OR IGNORE INTO open_slots (day, time) VALUES (?, ?)", (a["day"], a["time"]))
        db.execute(
            "UPDATE appointments SET day = ?, time = ?, status = 'confirmed' WHERE id = ?",
            (day, time, a["id"]),
        )
    return {"day": day, "time": time, "sentence": f"Moved the {a['what']} to {day} at {time}, confirmed."}
