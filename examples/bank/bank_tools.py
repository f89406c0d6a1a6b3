"""Harbor Bank's phone line: tools over a SQLite ledger, gated by caller verification.

A caller is verified when the number they call from (`ctx.caller`, Twilio's `From`) belongs to an account
AND the PIN they typed on the keypad (`ctx.dtmf`, digits before a `#`) matches it. The PIN never goes through
speech recognition, the LLM or the call's transcript: tools read the keypad digits from the call context.

The database is `BANK_DB` (default `bank.sqlite3` in the working directory), created with one demo account on
first use: +15550001111, Sam Carter, PIN 2468, card ending 4242.

Example:
    >>> import asyncio, os, tempfile
    >>> from duetaspan.registry import CallContext, ToolRegistry
    >>> os.environ["BANK_DB"] = os.path.join(tempfile.mkdtemp(), "bank.sqlite3")
    >>> registry = ToolRegistry([verify_caller, get_balance, recent_transactions, lock_card])
    >>> ctx = CallContext(caller="+15550001111", dtmf="2468#")
    >>> asyncio.run(registry.call("get_balance", {}, ctx)).reference
    '(tool result) Sam Carter, checking balance: $1,234.56.'
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from duetaspan.registry import CallContext, ToolFailed, tool

DB_ENV = "BANK_DB"
ASK_FOR_PIN = (
    "Not verified yet: ask the caller to type their four-digit PIN on the keypad, then the pound key."
)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS accounts (
    id INTEGER PRIMARY KEY, phone TEXT UNIQUE NOT NULL, name TEXT NOT NULL,
    pin_salt TEXT NOT NULL, pin_hash TEXT NOT NULL, balance_cents INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS transactions (
    id INTEGER PRIMARY KEY, account_id INTEGER NOT NULL, day TEXT NOT NULL, payee TEXT NOT NULL,
    amount_cents INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS cards (
    last4 TEXT NOT NULL, account_id INTEGER NOT NULL, locked INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (account_id, last4));
"""
_DEMO_TRANSACTIONS = [
    ("2026-03-02", "Harbor Coffee", -475),
    ("2026-03-01", "City Power", -8912),
    ("2026-02-28", "Payroll", 210000),
]


def database_path() -> Path:
    return Path(os.environ.get(DB_ENV) or "bank.sqlite3")


def pin_hash(pin: str, salt: str) -> str:
    return hashlib.pbkdf2_hmac("sha256", pin.encode(), salt.encode(), 10_000).hex()


@contextlib.contextmanager
def connect(path: Path | None = None) -> Iterator[sqlite3.Connection]:
    """The ledger (created with the demo account when missing); commits on success."""
    db = sqlite3.connect(path or database_path())
    db.row_factory = sqlite3.Row
    try:
        db.executescript(_SCHEMA)
        if db.execute("SELECT COUNT(*) FROM accounts").fetchone()[0] == 0:
            salt = os.urandom(8).hex()
            db.execute(
                "INSERT INTO accounts (id, phone, name, pin_salt, pin_hash, balance_cents) VALUES (1, ?, ?, ?, ?, ?)",
                ("+15550001111", "Sam Carter", salt, pin_hash("2468", salt), 123456),
            )
            db.executemany(
                "INSERT INTO transactions (account_id, day, payee, amount_cents) VALUES (1, ?, ?, ?)",
                _DEMO_TRANSACTIONS,
            )
            db.execute("INSERT INTO cards (last4, account_id) VALUES ('4242', 1)")
        yield db
        db.commit()
    finally:
        db.close()


def typed_pin(dtmf: str) -> str | None:
    """The last PIN typed on the keypad: the digits before the last `#` ("12#2468#" -> "2468")."""
    if "#" not in dtmf:
        return None
    return re.sub(r"\D", "", dtmf.rsplit("#", 1)[0].rsplit("#", 1)[-1]) or None


def verified_account(db: sqlite3.Connection, ctx: CallContext) -> sqlite3.Row | None:
    """The caller's account when caller ID and the typed PIN both match, else None."""
    row = db.execute("SELECT * FROM accounts WHERE phone = ?", (ctx.caller or "",)).fetchone()
    pin = typed_pin(ctx.dtmf)
    if row is None or pin is None:
        return None
    return row if hmac.compare_digest(pin_hash(pin, row["pin_salt"]), row["pin_hash"]) else None


def _money(cents: int) -> str:
    return f"{'-' if cents < 0 else ''}${abs(cents) / 100:,.2f}"


def _sentence(result: dict) -> str:
    return result["sentence"]


@tool(render=_sentence)
def verify_caller(ctx: CallContext) -> dict:
    """Check the caller's identity (caller ID and the PIN typed on the keypad) before account questions."""
    with connect() as db:
        if db.execute("SELECT 1 FROM accounts WHERE phone = ?", (ctx.caller or "",)).fetchone() is None:
            return {"verified": False, "sentence": "No account uses this phone number; offer a transfer."}
        account = verified_account(db, ctx)
    if account is None:
        return {"verified": False, "sentence": ASK_FOR_PIN}
    return {"verified": True, "sentence": f"Verified: {account['name']}."}


@tool(render=_sentence)
def get_balance(ctx: CallContext) -> dict:
    """The verified caller's checking balance."""
    with connect() as db:
        account = verified_account(db, ctx)
    if account is None:
        return {"verified": False, "sentence": ASK_FOR_PIN}
    balance = _money(account["balance_cents"])
    return {
        "verified": True,
        "balance": balance,
        "sentence": f"{account['name']}, checking balance: {balance}.",
    }


@tool(render=_sentence)
def recent_transactions(ctx: CallContext, count: int = 3) -> dict:
    """The verified caller's most recent transactions, newest first.

    Args:
        count: how many (1 to 5)
    """
    with connect() as db:
        account = verified_account(db, ctx)
        if account is None:
            return {"verified": False, "sentence": ASK_FOR_PIN}
        rows = db.execute(
            "SELECT day, payee, amount_cents FROM transactions WHERE account_id = ? ORDER BY day DESC LIMIT ?",
            (account["id"], max(1, min(count, 5))),
        ).fetchall()
    items = [f"{r['payee']} {_money(r['amount_cents'])} on {r['day']}" for r in rows]
    return {"verified": True, "transactions": [dict(r) for r in rows], "sentence": "; ".join(items) + "."}


@tool(side_effect=True, redact=["last4"], render=_sentence)
def lock_card(last4: str, ctx: CallContext) -> dict:
    """Lock (freeze) one of the verified caller's cards. Only when the caller asks to lock it.

    Args:
        last4: the last four digits of the card
    """
    digits = re.sub(r"\D", "", last4)
    with connect() as db:
        account = verified_account(db, ctx)
        if account is None:
            return {"locked": False, "sentence": ASK_FOR_PIN}
        cur = db.execute(
            "UPDATE cards SET locked = 1 WHERE account_id = ? AND last4 = ?", (account["id"], digits)
        )
        if cur.rowcount == 0:
            raise ToolFailed("no card with those last four digits on this account")
    return {"locked": True, "sentence": "The card is locked; no new payments will go through."}
