"""The keyword check on requests said as their own details ("two people tomorrow at eight thirty, the name's
Alvarez") and on what only looks like one: a story about the past, something said of someone else, a
question without its question mark, the tool's object noun used as a noun ("order 31877 is for my mom")."""

from __future__ import annotations

import pytest

from duetaspan.registry import ToolSpec
from duetaspan.router import explicit_request
from duetaspan.router.lexicon import compact

SPECS = {
    "book_table": ToolSpec(
        "book_table",
        "Reserve a table at the restaurant.",
        {"type": "object", "properties": {"party_size": {"type": "integer"}, "date": {"type": "string"},
                                          "time": {"type": "string"}, "name": {"type": "string"}}},
        side_effect=True,
    ),
    "change_plan": ToolSpec(
        "change_plan",
        "Switch the caller's subscription plan.",
        {"type": "object", "properties": {"plan": {"type": "string", "enum": ["basic", "standard", "premium"]}}},
        side_effect=True,
    ),
    "modify_autopay": ToolSpec(
        "modify_autopay",
        "Turn on automatic payment of a bill from a source account.",
        {"type": "object", "properties": {"bill_type": {"type": "string"}, "source_account": {"type": "string"}}},
        side_effect=True,
    ),
    "cancel_order": ToolSpec(
        "cancel_order",
        "Cancel an order that has not shipped yet.",
        {"type": "object", "properties": {"order_id": {"type": "string"}}},
        side_effect=True,
    ),
    "update_search_filter": ToolSpec(
        "update_search_filter",
        "Change one filter of the current search (e.g. max_price, bedrooms, pets).",
        {"type": "object", "properties": {"filter_name": {"type": "string"}, "value": {"type": "string"}}},
        side_effect=True,
    ),
    "update_identity_doc": ToolSpec(
        "update_identity_doc",
        "Update an identity document on the caller's profile (passport, driver license, ...).",
        {"type": "object", "properties": {"doc_type": {"type": "string"}, "doc_number": {"type": "string"}}},
        side_effect=True,
    ),
    "schedule_appointment": ToolSpec(
        "schedule_appointment",
        "Schedule a service appointment.",
        {"type": "object", "properties": {"service": {"type": "string"}, "date": {"type": "string"},
                                          "time": {"type": "string"}}},
        side_effect=True,
    ),
}  # fmt: skip
TABLE = {"party_size": 2, "date": "tomorrow", "time": "8:30 PM", "name": "Alvarez"}
FOUR = {"party_size": 4, "date": "Friday", "time": "7 PM", "name": "Nguyen"}


def decide(tool: str, arguments: dict, question: str) -> tuple[bool, str]:
    return explicit_request(SPECS[tool], arguments, question, [])


@pytest.mark.parametrize(
    ("tool", "arguments", "question"),
    [
        ("book_table", TABLE, "two people tomorrow at eight thirty, the name's Alvarez"),
        ("book_table", TABLE, "tomorrow eight thirty two people Alvarez"),
        ("change_plan", {"plan": "basic"}, "honestly I barely use it, drop me down to the basic one"),
        ("update_search_filter", {"filter_name": "max_price", "value": "2200"},
         "you can bump the budget up to twenty two hundred"),
        ("update_search_filter", {"filter_name": "max_price", "value": "1500"}, "mm can you cap the rent at fifteen hundred"),
    ],
)  # fmt: skip
def test_a_request_said_as_its_own_details_is_asked(tool, arguments, question):
    assert decide(tool, arguments, question) == (True, "explicit")


@pytest.mark.parametrize(
    ("tool", "arguments", "question"),
    [
        # a story about the past, with every value of the call in it
        ("book_table", FOUR, "we were there last Friday at seven, party of four under Nguyen, and the food was cold"),
        ("modify_autopay", {"bill_type": "water", "source_account": "savings"},
         "last month the water bill came out of savings and I was overdrawn"),
        # said of someone else
        ("change_plan", {"plan": "premium"}, "my sister has premium and loves it"),
        ("modify_autopay", {"bill_type": "cable", "source_account": "checking"},
         "my husband set the cable bill to come out of checking"),
        # questions, with or without their question mark
        ("cancel_order", {"order_id": "K-4417"}, "has K four four one seven shipped yet"),
        ("update_search_filter", {"filter_name": "pets_allowed", "value": "true"}, "is Portland generally pet friendly"),
        # "change" is a noun in "oil change": a story with the call's values, not "change it to Wednesday"
        ("schedule_appointment", {"service": "oil change", "date": "Wednesday", "time": "11 AM"},
         "my last oil change was a Wednesday at eleven and it took two hours"),
        ("change_plan", {"plan": "premium"}, "tell me what premium includes"),
        ("book_table", TABLE, "two people tomorrow at eight thirty, the name's Alvarez?"),
        # the tool's object is a noun here, not the verb "to order"
        ("cancel_order", {"order_id": "31877"}, "order three one eight seven seven is for my mom's birthday"),
        # a value said in a doubt
        ("book_table", TABLE, "not sure yet, two people tomorrow at eight thirty, Alvarez"),
    ],
)  # fmt: skip
def test_what_only_looks_like_a_request_is_refused(tool, arguments, question):
    allowed, reason = decide(tool, arguments, question)
    assert not allowed and "did not ask" in reason


def test_a_request_said_as_details_still_needs_the_values_said():
    # one of four values said is not a request said as its details
    assert not decide("book_table", TABLE, "tomorrow works for us")[0]
    # every value said, but the name is not the caller's: the argument check refuses it
    allowed, reason = decide("book_table", {**TABLE, "name": "Smith"}, "two people tomorrow at eight thirty")
    assert not allowed and "'name' was not given" in reason


def test_the_tools_own_word_for_a_value_and_spelled_letters():
    # the caller says "license", the LLM writes the tool's "driver license" (in its description)
    assert decide(
        "update_identity_doc",
        {"doc_type": "driver license", "doc_number": "L7712005"},
        "could you update the license to L seven seven one two zero zero five",
    ) == (True, "explicit")
    # a word the description does not name is still made up
    assert not decide(
        "update_identity_doc",
        {"doc_type": "military id", "doc_number": "L7712005"},
        "could you update the id to L seven seven one two zero zero five",
    )[0]
    assert compact("X as in x-ray four four seven") == "x447"
