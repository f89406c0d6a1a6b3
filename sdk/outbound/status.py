"""A campaign's status (what `campaign status`, the progress bar and `GET /admin/campaigns/NAME` show) and
its export (one CSV row per number: `to`, `attempts`, `outcome`, `last_attempt_at`)."""

from __future__ import annotations

import csv
import datetime as dt
import io
from typing import Any

from duetaspan.store.campaigns import Campaign
from duetaspan.store.db import Tx

EXPORT_COLUMNS = ("to", "attempts", "outcome", "last_attempt_at")


async def campaign_status(tx: Tx, camp: Campaign) -> dict[str, Any]:
    counts = await tx.counts(camp.id)
    total = sum(counts.values())
    left = counts.get("pending", 0) + counts.get("dialling", 0)
    attempts = await tx.attempt_count(camp.id)
    return {"name": camp.name, "id": camp.id, "state": camp.state, "created": camp.created, "total": total,
            "done": total - left, "attempts": attempts, "counts": counts, "settings": camp.settings}


def _iso(t: float | None) -> str:
    return "" if t is None else dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="seconds")


async def export_csv(tx: Tx, camp: Campaign) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(EXPORT_COLUMNS)
    for c in await tx.contacts(camp.id):
        outcome = c.outcome or ("dialling" if c.state == "dialling" else "not_called")
        writer.writerow([c.to, c.attempts, outcome, _iso(c.last_attempt_at)])
    return out.getvalue()


def status_line(status: dict[str, Any]) -> str:
    """`name: running, 12/100 done (answered 9, busy 2, dnc 1), 4 dialling`."""
    counts = status["counts"]
    done = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if k not in ("pending", "dialling"))
    return (f"{status['name']}: {status['state']}, {status['done']}/{status['total']} done"
            + (f" ({done})" if done else "") + f", {counts.get('dialling', 0)} dialling, "
            f"{counts.get('pending', 0)} pending, {status['attempts']} attempts")


__all__ = ["EXPORT_COLUMNS", "campaign_status", "export_csv", "status_line"]
