"""The tool registry: schemas from signatures and docstrings, validation, timeouts, failures, redaction."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, Field

from duetaspan.registry import (
    NO_INFO,
    CallContext,
    ToolArgumentsInvalid,
    ToolDefinitionError,
    ToolFailed,
    ToolNotFound,
    ToolRegistry,
    ToolResult,
    ToolSpec,
    ToolTimeout,
    tool,
)
from duetaspan.registry.tool import SchemaTool
from tests.support import has_card


class Address(BaseModel):
    street: str
    zip_code: str


@tool
def book_table(
    restaurant: str,
    party_size: int,
    when: Annotated[str, Field(description="ISO date and time")],
    ctx: CallContext,
    seating: Literal["indoor", "outdoor"] = "indoor",
    note: str | None = None,
) -> dict:
    """Book a table at a restaurant.

    Only for explicit requests.

    Args:
        restaurant: name of the restaurant
        party_size: number of guests
        when: ignored, the Annotated description wins
        seating: where to sit
    """
    return {"restaurant": restaurant, "party_size": party_size, "caller": ctx.caller, "seating": seating}


def test_schema_from_signature_and_docstring():
    spec = book_table.spec
    props = spec.parameters["properties"]
    assert spec.name == "book_table"
    assert spec.description == "Book a table at a restaurant.\n\nOnly for explicit requests."
    assert spec.parameters["type"] == "object"
    assert spec.parameters["required"] == ["restaurant", "party_size", "when"]
    assert "ctx" not in props  # injected, not an argument
    assert props["restaurant"] == {"description": "name of the restaurant", "type": "string"}
    assert props["party_size"]["type"] == "integer"
    assert props["when"]["description"] == "ISO date and time"
    assert props["seating"]["enum"] == ["indoor", "outdoor"] and props["seating"]["default"] == "indoor"
    assert "title" not in spec.parameters and "title" not in props["restaurant"]


def test_nested_model_and_google_style_numpy_docstrings():
    @tool(name="ship-parcel", description="Ship it.", timeout=2.0)
    async def ship(to: Address, weight_kg: float) -> str:
        """Ignored because description= is given.

        Parameters
        ----------
        weight_kg
            weight in kilograms
        """
        return f"shipped to {to.street}"

    spec = ship.spec
    assert spec.name == "ship-parcel" and spec.description == "Ship it." and spec.timeout == 2.0
    assert spec.parameters["properties"]["weight_kg"]["description"] == "weight in kilograms"
    assert "$defs" in spec.parameters and "Address" in spec.parameters["$defs"]


def test_openai_tools_shape_and_side_effect_note():
    reg = ToolRegistry([book_table])
    reg.add(tool(name="pay", side_effect=True)(lambda_free_pay))
    [plain, pay] = reg.openai_tools()
    assert plain == {
        "type": "function",
        "function": {
            "name": "book_table",
            "description": book_table.spec.description,
            "parameters": book_table.spec.parameters,
        },
    }
    assert pay["function"]["name"] == "pay" and "explicitly asks" in pay["function"]["description"]
    assert [s.name for s in reg.specs()] == ["book_table", "pay"]
    assert reg.openai_tools(["pay"]) == [pay]


def lambda_free_pay(amount: float, card: str) -> str:
    """Charge the card."""
    return "paid"


async def test_call_injects_context_and_renders_reference():
    reg = ToolRegistry([book_table])
    ctx = CallContext(call_id="CA1", caller="+15550001111")
    result = await reg.call(
        "book_table", {"restaurant": "Nopa", "party_size": "4", "when": "2026-05-06T19:00"}, ctx
    )
    assert result.ok, result.error
    assert result.data == {
        "restaurant": "Nopa",
        "party_size": 4,
        "caller": "+15550001111",
        "seating": "indoor",
    }
    assert (
        result.reference
        == "(tool result) restaurant: Nopa, party size: 4, caller: +15550001111, seating: indoor."
    )
    assert result.arguments["party_size"] == 4  # validated (coerced) arguments
    assert result.elapsed_ms >= 0


async def test_custom_render_and_direct_python_use():
    @tool(render=lambda r: f"It is {r['temp']} degrees in {r['city']}.")
    def weather(city: str) -> dict:
        """Weather."""
        return {"city": city, "temp": 21}

    assert weather("Oslo") == {"city": "Oslo", "temp": 21}  # still a plain function
    result = await ToolRegistry([weather]).call("weather", {"city": "Oslo"})
    assert result.reference == "(tool result) It is 21 degrees in Oslo."


async def test_unknown_tool_and_invalid_arguments_are_failed_results():
    reg = ToolRegistry([book_table])
    missing = await reg.call("book_flight", {})
    assert not missing.ok and isinstance(missing.exception, ToolNotFound)
    assert "book_flight" in missing.error and "book_table" in missing.error
    assert missing.reference == NO_INFO
    bad = await reg.call(
        "book_table", {"restaurant": "Nopa", "party_size": "many", "when": "x", "seating": "roof"}
    )
    assert not bad.ok and isinstance(bad.exception, ToolArgumentsInvalid)
    assert "'party_size'" in bad.error and "'seating'" in bad.error
    with pytest.raises(ToolArgumentsInvalid):
        bad.raise_for_error()
    not_object = await reg.call("book_table", ["Nopa"])  # type: ignore[arg-type]
    assert not not_object.ok and "JSON object" in not_object.error


async def test_raising_tool_and_speakable_failure():
    @tool
    def broken(x: int) -> int:
        """Always breaks."""
        return 1 // (x - x)

    @tool
    async def refuses(x: int) -> int:
        """Refuses politely."""
        raise ToolFailed("the booking system is closed")

    reg = ToolRegistry([broken, refuses])
    r1 = await reg.call("broken", {"x": 1})
    assert not r1.ok and "ZeroDivisionError" in r1.error and isinstance(r1.exception, ToolFailed)
    r2 = await reg.call("refuses", {"x": 1})
    assert r2.error == "the booking system is closed"


@pytest.mark.serial  # counts event-loop ticks in 0.3 s: CPU quiet
async def test_timeouts_async_and_sync_hanging_tools():
    started = threading.Event()

    @tool(timeout=0.2)
    async def hangs() -> str:
        """Never returns."""
        await asyncio.sleep(60)
        return "never"

    @tool
    def blocks() -> str:
        """Blocks a thread for a while."""
        started.set()
        time.sleep(1.0)
        return "late"

    reg = ToolRegistry([hangs, blocks], default_timeout=0.3)
    t0 = time.perf_counter()
    r = await reg.call("hangs", {})
    assert not r.ok and isinstance(r.exception, ToolTimeout) and "0.2 s" in r.error
    # the sync tool runs in a thread: the loop keeps ticking while it blocks
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    task = asyncio.create_task(ticker())
    r2 = await reg.call("blocks", {})
    task.cancel()
    assert not r2.ok and isinstance(r2.exception, ToolTimeout)
    assert started.is_set() and ticks >= 5
    assert time.perf_counter() - t0 < 1.0
    r3 = await reg.call("blocks", {}, timeout_s=2.0)
    assert r3.ok and r3.reference == "(tool result) late"


async def test_cancellation_propagates():
    @tool
    async def slow() -> str:
        """Slow."""
        await asyncio.sleep(10)
        return "x"

    task = asyncio.create_task(ToolRegistry([slow]).call("slow", {}))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_redaction_and_log_record():
    @tool(redact=["card_number"], side_effect=True)
    def pay_bill(amount: float, card_number: str) -> dict:
        """Pay."""
        return {"paid": amount}

    result = await ToolRegistry([pay_bill]).call("pay_bill", {"amount": 5, "card_number": "4111111111111111"})
    assert result.arguments["card_number"] == "4111111111111111"  # full, for the tool's own use
    assert result.redacted_arguments() == {"amount": 5.0, "card_number": "[redacted]"}
    log = result.to_log()
    assert (
        not has_card(repr(log))
        and log["side_effect"] is True
        and log["reference"] == "(tool result) paid: 5."
    )
    with pytest.raises(ToolDefinitionError, match="unknown arguments"):
        tool(redact=["pin"])(lambda_free_pay)


async def test_side_effect_policy_flag():
    @tool(side_effect=True)
    def transfer(to: str) -> str:
        """Transfer."""
        return "ok"

    reg = ToolRegistry([transfer])
    assert reg.specs()[0].side_effect
    denied = await reg.call("transfer", {"to": "sales"}, allow_side_effects=False)
    assert not denied.ok and "not explicitly requested" in denied.error


def test_names_duplicates_and_definition_errors():
    reg = ToolRegistry([book_table])
    with pytest.raises(ToolDefinitionError, match="already registered"):
        reg.add(tool(name="book_table")(lambda_free_pay))
    renamed = reg.add(book_table, name="book_table_2")
    assert renamed.name == "book_table_2" and "book_table" in reg and len(reg) == 2
    with pytest.raises(ToolDefinitionError, match="1-64"):
        tool(name="bad.name")(lambda_free_pay)

    def varargs(*items: str) -> None:
        """No."""

    with pytest.raises(ToolDefinitionError, match=r"\*items"):
        tool(varargs)
    assert reg.filtered(deny=["book_table"]).names() == ["book_table_2"]
    assert reg.filtered(allow=["book_table"]).names() == ["book_table"]


def test_add_module_registers_decorated_functions():
    reg = ToolRegistry()
    added = reg.add_module("tests.registry.sample_tools")
    assert sorted(t.name for t in added) == ["greet", "shout"]
    with pytest.raises(ToolDefinitionError, match="cannot import"):
        reg.add_module("tests.registry.no_such_module")


async def test_schema_tool_validates_with_jsonschema():
    async def handler(arguments, ctx):
        return {"balance": 12.5, "account": arguments["account"]}

    spec = ToolSpec(
        "balance",
        "Account balance.",
        {
            "type": "object",
            "properties": {"account": {"type": "string", "minLength": 3}},
            "required": ["account"],
        },
    )
    reg = ToolRegistry([SchemaTool(spec, handler)])
    ok = await reg.call("balance", {"account": "A123"})
    assert ok.ok and ok.reference == "(tool result) balance: 12.5, account: A123."
    bad = await reg.call("balance", {"account": "A"})
    assert not bad.ok and "'account'" in bad.error
    missing = await reg.call("balance", {})
    assert "'account' is a required property" in missing.error
    with pytest.raises(ToolDefinitionError, match="invalid JSON schema"):
        SchemaTool(ToolSpec("x", "", {"type": "nope"}), handler)


def test_call_context_actions():
    seen = []
    ctx = CallContext(call_id="CA9", on_action=seen.append)
    action = ctx.request_action("transfer_call", target="+15551234567", reason="billing")
    assert ctx.actions == [action] == seen and action.kind == "transfer_call"


def test_tool_result_raise_for_error_ok():
    r = ToolResult("x", {}, ok=True, reference="(tool result) y")
    assert r.raise_for_error() is r
