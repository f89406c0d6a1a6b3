"""Calling windows in the callee's local time, contact lists, and the opt_out tool on a real store."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from duetaspan.agent.stored import attach_store, fill_variables
from duetaspan.outbound.contacts import ContactsError, parse_contacts
from duetaspan.outbound.windows import NEVER, next_allowed, number_timezones
from duetaspan.registry import CallContext, ToolRegistry
from duetaspan.tools.opt_out import opt_out

UTC = dt.UTC


def ts(*args, tz=UTC) -> float:
    return dt.datetime(*args, tzinfo=tz).timestamp()


def test_number_zones_and_the_row_timezone():
    assert number_timezones("+12125551234", None) == ["America/New_York"]
    assert number_timezones("sip:+12125551234@trunk.example", None) == ["America/New_York"]
    assert number_timezones("+12125551234", "Europe/Paris") == ["Europe/Paris"]
    assert number_timezones("sip:7001@pbx.example", None) == []  # no zone: the server's local time
    assert len(number_timezones("+18005550100", None)) > 5  # toll-free: every NANP zone


def test_window_days_and_the_narrowest_window_of_ambiguous_zones():
    window, weekdays = "09:00-20:00", ["mon", "tue", "wed", "thu", "fri"]
    ny = ["America/New_York"]
    assert next_allowed(ts(2026, 3, 2, 15, 0), ny, window, weekdays) is None  # Monday 10:00 in New York
    assert next_allowed(ts(2026, 3, 2, 13, 0), ny, window, weekdays) == ts(2026, 3, 2, 9, 0, tz=ZoneInfo(ny[0]))
    # Friday 20:30 in New York: next Monday 09:00 (no weekend days)
    friday_late = ts(2026, 3, 6, 20, 30, tz=ZoneInfo(ny[0]))
    assert next_allowed(friday_late, ny, window, weekdays) == ts(2026, 3, 9, 9, 0, tz=ZoneInfo(ny[0]))
    # New York and Los Angeles: only 12:00-20:00 New York time is inside 09:00-20:00 in both
    both = ["America/New_York", "America/Los_Angeles"]
    assert next_allowed(ts(2026, 3, 2, 10, 30, tz=ZoneInfo(ny[0])), both, window, weekdays) == ts(
        2026, 3, 2, 12, 0, tz=ZoneInfo(ny[0]))
    assert next_allowed(ts(2026, 3, 2, 19, 0, tz=ZoneInfo(ny[0])), both, window, weekdays) is None
    # zones that share no window: never (the campaign ends the number as `no_window`), not a date 9 days on
    far = ["Asia/Tokyo", "America/New_York"]  # 09:00-12:00 in Tokyo is 19:00-23:00 in New York
    t = ts(2026, 3, 2, 12, 0)
    assert next_allowed(t, far, "09:00-12:00", weekdays) == NEVER
    assert next_allowed(t, far, "09:00-23:00", weekdays) is not None  # a shared hour: a time, not never


def test_contact_lists_fail_with_line_numbers_and_keep_variables():
    rows = parse_contacts("to,name,timezone,appointment_time\n+15551230001,Ann,America/Chicago,3 pm\n"
                          "+1 555 123 0001,dup,,\n\nsip:+12125550002@trunk.example,Bo,,\n")
    assert [(r["to"], r["timezones"], r["variables"]) for r in rows] == [
        ("+15551230001", ["America/Chicago"], {"name": "Ann", "appointment_time": "3 pm"}),
        ("sip:+12125550002@trunk.example", ["America/New_York"], {"name": "Bo"}),
    ]
    with pytest.raises(ContactsError, match=r"line 2: to '5551230001'.*line 3: timezone 'Mars/Base'"):
        parse_contacts("to,timezone\n5551230001,\n+15551230003,Mars/Base\n")
    with pytest.raises(ContactsError, match="`to` column"):
        parse_contacts("number\n+15551230001\n")


def test_persona_variables_are_filled_from_the_row():
    text = "You call {name} about {appointment_time}. Keep {braces} you did not define."
    assert fill_variables(text, {"name": "Ann", "appointment_time": "Tuesday 3 pm"}) == (
        "You call Ann about Tuesday 3 pm. Keep {braces} you did not define.")


async def test_opt_out_adds_the_number_and_ends_the_call(store):
    ctx = CallContext(call_id="CA1", called="7002", metadata={"campaign_to": "sip:+15551230009@trunk.example"})
    attach_store(store, ctx, None)
    result = await ToolRegistry([opt_out]).call("opt_out", {"reason": "stop calling me"}, ctx)
    assert "will not be called again" in result.reference
    assert [(a.kind, a.reason) for a in ctx.actions] == [("end_call", "opt-out: stop calling me")]
    async with store.transaction() as tx:
        assert await tx.dnc_has("+15551230009")
        rows, events = await tx.dnc_list(), await tx.events(type="dnc.added")
    assert rows[0]["source"] == "opt_out" and events[0].call_id == "CA1"
    bare = CallContext(caller="+15551230010")  # a server without a store: the tool says so, promises nothing
    failed = await ToolRegistry([opt_out]).call("opt_out", {}, bare)
    assert not failed.ok and "no do-not-call list" in (failed.error or "") and bare.actions == []
