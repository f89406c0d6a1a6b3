"""A campaign's contact list: CSV with a `to` column (E.164 `+15551234567` or a `sip:` URI) and optional
`name`, `timezone` (an IANA zone such as `America/Chicago`) and any other columns, each of which becomes a
variable of the call (`{name}`, `{appointment_time}` in the persona prompt; the router sees them in the
caller profile).

Bad rows fail the whole upload with their line numbers (nothing half-imported); a number listed twice is
called once (the first row wins).

Example:
    >>> rows = parse_contacts("to,name,appointment_time\\n+15551230001,Ann,3 pm\\nsip:7002@127.0.0.1\\n")
    >>> [(r["to"], r["variables"]) for r in rows]
    [('+15551230001', {'name': 'Ann', 'appointment_time': '3 pm'}), ('sip:7002@127.0.0.1', {})]
"""

from __future__ import annotations

import csv
import io
import re
from typing import Any

from duetaspan.errors import DuetaspanError
from duetaspan.outbound.windows import number_timezones, valid_timezone
from duetaspan.store.campaigns import normalize_number

E164 = re.compile(r"^\+[1-9]\d{6,14}$")
SIP_URI = re.compile(r"^sips?:[^\s<>\"]{1,250}$")
MAX_CONTACTS = 100_000
_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class ContactsError(DuetaspanError, ValueError):
    """The contact list cannot be used: the message says which lines and why."""


def parse_contacts(text: str) -> list[dict[str, Any]]:
    """The contacts of a CSV text: `{"to", "variables", "timezones"}` each (see the module docstring)."""
    reader = csv.DictReader(io.StringIO(text.lstrip("\ufeff")))
    fields = [f.strip() for f in reader.fieldnames or []]
    if "to" not in fields:
        raise ContactsError("the CSV needs a header row with a `to` column (E.164 number or sip: URI)")
    bad_names = [f for f in fields if f not in ("to", "timezone") and not _VARIABLE.match(f)]
    if bad_names:
        raise ContactsError(f"column names {bad_names}: letters, digits and _ only (they become {{variables}})")
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    seen: set[str] = set()
    for line, raw in enumerate(reader, start=2):
        row = {(k or "").strip(): (v or "").strip() for k, v in raw.items() if k is not None}
        to = row.pop("to", "")
        zone = row.pop("timezone", "") or None
        if not to and not any(row.values()):
            continue  # a blank line
        if to.startswith("+") and E164.match(re.sub(r"[\s().-]", "", to)):
            to = re.sub(r"[\s().-]", "", to)  # `+1 (555) 123-0001` is `+15551230001`
        if not (E164.match(to) or SIP_URI.match(to)):
            errors.append(f"line {line}: to {to!r} is neither E.164 (+15551234567) nor a sip: URI")
            continue
        if zone is not None and not valid_timezone(zone):
            errors.append(f"line {line}: timezone {zone!r} is not an IANA zone (e.g. America/Chicago)")
            continue
        key = normalize_number(to)
        if key in seen:
            continue
        seen.add(key)
        rows.append({"to": to, "variables": {k: v for k, v in row.items() if v != ""},
                     "timezones": number_timezones(to, zone)})
        if len(rows) > MAX_CONTACTS:
            raise ContactsError(f"more than {MAX_CONTACTS} contacts: split the list into several campaigns")
    if errors:
        more = f" (and {len(errors) - 10} more)" if len(errors) > 10 else ""
        raise ContactsError("; ".join(errors[:10]) + more)
    if not rows:
        raise ContactsError("the CSV has no contacts")
    return rows


def contacts_from_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same from Python dicts (`agent.campaign([{"to": "+1555...", "name": "Ann"}])`)."""
    out = io.StringIO()
    names = ["to", *sorted({k for r in rows for k in r if k != "to"})]
    writer = csv.DictWriter(out, fieldnames=names)
    writer.writeheader()
    for r in rows:
        writer.writerow({k: "" if r.get(k) is None else str(r.get(k)) for k in names})
    return parse_contacts(out.getvalue())


__all__ = ["E164", "SIP_URI", "ContactsError", "contacts_from_rows", "parse_contacts"]
