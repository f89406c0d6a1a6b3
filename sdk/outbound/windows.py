"""Calling windows in the callee's local time: a number's time zones (the row's `timezone`, else the maintained
`phonenumbers` library's zones for the number), and the next moment the call is allowed.

A number whose zone is ambiguous (`+1 800 ...`, an area code over two zones) gets the narrowest window of its
zones: only the hours that are inside the window in every one of them. A `sip:` row whose user is not an E.164
number has no zone of its own: the server's local time is used. Zones that share no hour of the window on any
of the allowed days in the next `HORIZON_DAYS` days (`09:00-12:00` in Tokyo and New York) can never be called:
`next_allowed` says `NEVER`, and the number ends with the final outcome `no_window` when its turn comes.

Example:
    >>> number_timezones("+442079460000", None)
    ['Europe/London']
    >>> import datetime as dt
    >>> monday_8am = dt.datetime(2026, 3, 2, 8, 0, tzinfo=ZoneInfo("Europe/London")).timestamp()
    >>> wait = next_allowed(monday_8am, ["Europe/London"], "09:00-20:00", ["mon"])
    >>> wait - monday_8am
    3600.0
"""

from __future__ import annotations

import datetime as dt
import math
import re
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import phonenumbers
from phonenumbers import timezone as pn_timezone

from duetaspan.config.store import DAYS

_SIP_USER = re.compile(r"^sips?:(\+\d{6,15})@", re.I)
HORIZON_DAYS = 9  # how far ahead a window is looked for (a week and more: every allowed day is in it)
NEVER = math.inf  # `next_allowed` for zones that share no window at all


def valid_timezone(name: str) -> bool:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


def number_timezones(to: str, row_timezone: str | None) -> list[str]:
    """The callee's zones: `[row_timezone]`, else the number's (E.164, or a `sip:+E164@host` user); [] when
    unknown (the server's local time is used)."""
    if row_timezone:
        return [row_timezone]
    m = _SIP_USER.match(to)
    number = m[1] if m else to
    if not number.startswith("+"):
        return []
    try:
        parsed = phonenumbers.parse(number, None)
    except phonenumbers.NumberParseException:
        return []
    zones = [z for z in pn_timezone.time_zones_for_number(parsed) if z != pn_timezone.UNKNOWN_TIMEZONE]
    return sorted(z for z in zones if valid_timezone(z))


def _parse_window(window: str) -> tuple[dt.time, int]:
    """Start time and length in minutes of `HH:MM-HH:MM`."""
    start, end = window.split("-")
    h1, m1 = (int(x) for x in start.split(":"))
    h2, m2 = (int(x) for x in end.split(":"))
    return dt.time(h1, m1), (h2 * 60 + m2) - (h1 * 60 + m1)


def _intervals(now: float, zone: ZoneInfo | None, window: str, days: list[str]) -> list[tuple[float, float]]:
    """Allowed [start, end) intervals in epoch seconds, from the day before `now` to HORIZON_DAYS after."""
    start, minutes = _parse_window(window)
    today = dt.datetime.fromtimestamp(now, zone).date()
    out = []
    for offset in range(-1, HORIZON_DAYS):
        day = today + dt.timedelta(days=offset)
        if DAYS[day.weekday()] not in days:
            continue
        opens = dt.datetime.combine(day, start, tzinfo=zone) if zone else dt.datetime.combine(day, start).astimezone()
        out.append((opens.timestamp(), (opens + dt.timedelta(minutes=minutes)).timestamp()))
    return out


def _intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out = []
    for s1, e1 in a:
        for s2, e2 in b:
            s, e = max(s1, s2), min(e1, e2)
            if s < e:
                out.append((s, e))
    return sorted(out)


def next_allowed(now: float, zones: list[str], window: str, days: list[str]) -> float | None:
    """None when a call is allowed at `now` in every zone, else the earliest later time it is (the narrowest
    window of the zones); `NEVER` when the zones share no window in the next `HORIZON_DAYS` days."""
    allowed = _intervals(now, None, window, days) if not zones else None
    for name in zones:
        mine = _intervals(now, ZoneInfo(name), window, days)
        allowed = mine if allowed is None else _intersect(allowed, mine)
    for start, end in allowed or []:
        if start <= now < end:
            return None
        if start > now:
            return start
    return NEVER


__all__ = ["HORIZON_DAYS", "NEVER", "next_allowed", "number_timezones", "valid_timezone"]
