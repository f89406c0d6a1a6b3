"""Tolerant reply parsing and tool-name repair."""

from __future__ import annotations

import pytest

from duetaspan.router.parse import canonical_tool_name, find_json_object, parse_reply


@pytest.mark.parametrize(
    ("reply", "kind", "name", "arguments"),
    [
        (
            '{"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}',
            "call",
            "get_time",
            {"timezone": "Asia/Tokyo"},
        ),
        (
            '```json\n{"tool_name": "get_time", "params": "{\\"timezone\\": \\"UTC\\"}"}\n```',
            "call",
            "get_time",
            {"timezone": "UTC"},
        ),
        ('I will call it: {"function": {"name": "f", "arguments": {"a": 1,}}} ok', "call", "f", {"a": 1}),
        ('{"tool_calls": [{"name": "f", "args": {}}]}', "call", "f", {}),
        ("{'call': 'f', 'args': {'x': True}}", "call", "f", {"x": True}),
        ('{"none": true}', "none", None, {}),
        ("NONE", "none", None, {}),
        ("", "none", None, {}),
        ('{"answer": "(no information found)"}', "abstain", None, {}),
        ("Sorry, I couldn't find that.", "abstain", None, {}),
        ('{"name": "f", "arguments": "not json"}', "invalid", "f", {}),
        ('{"weird": 1}', "invalid", None, {}),
        ("{oops", "invalid", None, {}),
        ("x7 ;; 0x", "invalid", None, {}),
    ],
)
def test_parse_reply(reply, kind, name, arguments):
    parsed = parse_reply(reply)
    assert parsed.kind == kind
    assert parsed.name == name
    if kind == "call":
        assert parsed.arguments == arguments


def test_answer_keeps_sentence():
    parsed = parse_reply('{"response": "The Eiffel Tower is 330 metres tall."}')
    assert parsed.kind == "answer" and parsed.answer == "The Eiffel Tower is 330 metres tall."


def test_find_json_object_is_string_aware():
    assert find_json_object('say {"a": "}{"} then') == '{"a": "}{"}'
    assert find_json_object("no braces") is None


def test_canonical_tool_name():
    names = ["get_weather", "get_time", "track_order"]
    assert canonical_tool_name("get_weather", names) == "get_weather"
    assert canonical_tool_name("GetWeather", names) == "get_weather"
    assert canonical_tool_name("functions.track_order", names) == "track_order"
    assert canonical_tool_name("get_wether", names) == "get_weather"
    assert canonical_tool_name("book_hotel", names) is None
