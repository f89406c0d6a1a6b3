"""The keyword check on requests said as their own details ("two people tomorrow at eight thirty, the name's
Alvarez") and on what only looks like one: a story about the past, something said of someone else, a
question without its question mark, the tool's object noun used as a noun ("order 31877 is for my mom")."""

from __future__ import annotations

import pytest

from duetaspan.registry import ToolSpec
from duetaspan.router import explicit_request
from duetaspan.router.lexicon import compact


def tool(tool_name: str, description: str, /, **properties: dict) -> ToolSpec:
    return ToolSpec(tool_name, description, {"type": "object", "properties": properties}, side_effect=True)


S, INT = {"type": "string"}, {"type": "integer"}
SPECS = {
    spec.name: spec
    for spec in (
        tool("book_table", "Reserve a table at the restaurant.", party_size=INT, date=S, time=S, name=S),
        tool("change_plan", "Switch the caller's subscription plan.",
             plan={"type": "string", "enum": ["basic", "standard", "premium"]}),
        tool("modify_autopay", "Turn on automatic payment of a bill from a source account.",
             bill_type=S, source_account=S),
        tool("cancel_order", "Cancel an order that has not shipped yet.", order_id=S),
        tool("update_search_filter", "Change one filter of the current search (e.g. max_price, bedrooms, pets).",
             filter_name=S, value=S),
        tool("update_identity_doc",
             "Update an identity document on the caller's profile (passport, driver license, ...).",
             doc_type=S, doc_number=S),
        tool("schedule_appointment", "Schedule a service appointment.", service=S, date=S, time=S),
    )
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
