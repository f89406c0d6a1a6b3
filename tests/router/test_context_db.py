"""Context DB: explicit facts only, bounded recent turns, CallContext sync."""

from __future__ import annotations

import pytest

from duetaspan.registry import CallContext
from duetaspan.router import CallerProfile, ContextDB
from duetaspan.router.context_db import extract_city, extract_name


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("Hi, my name is Ada.", "Ada"),
        ("my name is ada", "Ada"),
        ("you can call me Grace and I need help", "Grace"),
        ("i'm feeling tired", None),
        ("I'm Ada", None),  # too ambiguous ("I'm fine", "I'm calling") to take as a name
        ("my name is not important", None),
        ("my name is on the booking somewhere", None),
        ("this is about my order", None),
    ],
)
def test_names_only_from_explicit_statements(text, name):
    assert extract_name(text) == name


@pytest.mark.parametrize(
    ("text", "city"),
    [
        ("I'm in Sydney right now", ("Sydney", "Australia/Sydney")),
        ("i am calling from new york", ("New York", "America/New_York")),
        ("I live in Tokyo.", ("Tokyo", "Asia/Tokyo")),
        ("i'm in a meeting", None),
        ("I'm in trouble", None),
    ],
)
def test_city_only_when_known(text, city):
    assert extract_city(text) == city


def test_profile_turns_and_context_sync():
    ctx = CallContext(caller="+15551234567", profile={"timezone": "America/New_York"})
    db = ContextDB(ctx=ctx)
    assert db.profile.caller_number == "+15551234567" and db.profile.timezone == "America/New_York"
    db.add_utterance("Hello, my name is Ada and I'm in Sydney.", t=1.0)
    db.add_utterance("hello, my name is ada and i'm in sydney.", t=2.0)  # ASR repeat: ignored
    db.add_utterance("i'm feeling tired", t=3.0)
    db.add_tool_turn("get_weather", {"city": "Sydney"}, "(tool result) Sydney: 21°C.", t=4.0)
    assert db.profile.name == "Ada" and ctx.profile["city"] == "Sydney"
    assert ctx.profile["timezone"] == "Australia/Sydney"
    assert db.caller_utterances() == ["Hello, my name is Ada and I'm in Sydney.", "i'm feeling tired"]
    assert [t.role for t in ctx.transcript] == ["user", "user", "tool"]


def test_recent_is_bounded():
    db = ContextDB(CallerProfile(), max_turns=50)
    for i in range(80):
        db.add_utterance(f"utterance number {i} " + "x" * 100)
    assert len(db.turns) == 50 and db.turns[0].text.startswith("utterance number 30")
    recent = db.recent(max_turns=10, max_chars=600)
    assert 1 <= len(recent) <= 5 and recent[-1].text.startswith("utterance number 79")
    db.add_agent_text("a" * 3000)
    assert len(db.agent_text) == 2000
