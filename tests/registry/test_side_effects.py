"""Side effects survive the deadline (issue 23 point 4), in the registry's tool execution path: a side-effect
call that has started runs to completion when its caller is cancelled (the 2.5 s retrieval deadline), within
its own timeout; its late result reaches `CallContext.on_late_result`; the same call with the same arguments
runs once per call (joined while running, answered from the ledger after); tools get the idempotency key
(call id + tool + arguments) as an `idempotency_key` parameter or from `current_idempotency_key()`.

The call-level version (a live Twilio call, the router and the Context DB) is in
tests/reliability/test_faults.py (`test_a_booking_that_answers_after_the_deadline_is_recorded_once`)."""

from __future__ import annotations

import asyncio

import pytest

from duetaspan.registry import (
    CallContext,
    ToolRegistry,
    ToolResult,
    current_idempotency_key,
    idempotency_key,
    tool,
)


class Bookings:
    """A booking API that commits at 2.4 s and answers at 2.6 s (or as told)."""

    def __init__(self, commit_s: float = 2.4, answer_s: float = 2.6, timeout: float = 10.0) -> None:
        self.commit_s, self.answer_s = commit_s, answer_s
        self.committed: list[tuple[str, str | None]] = []
        self.keys: list[str | None] = []
        self.fail_next = False

        @tool(side_effect=True, timeout=timeout)
        async def book_table(party: int, time: str, idempotency_key: str | None = None) -> str:
            """Book a table.

            Args:
                party: how many people
                time: when
            """
            self.keys.append(idempotency_key)
            await asyncio.sleep(self.commit_s)
            if self.fail_next:
                self.fail_next = False
                raise RuntimeError("the booking system is down")
            self.committed.append((f"{party}@{time}", idempotency_key))
            await asyncio.sleep(self.answer_s - self.commit_s)
            return f"Table for {party} booked at {time}, confirmation B-{len(self.committed):03d}."

        self.tool = book_table


async def test_a_side_effect_call_survives_the_deadline_and_its_late_result_is_reported():
    api = Bookings()
    registry = ToolRegistry([api.tool])
    late: list[ToolResult] = []
    got_late = asyncio.Event()

    def on_late(result: ToolResult) -> None:
        late.append(result)
        got_late.set()

    ctx = CallContext(call_id="CA-book", on_late_result=on_late)
    args = {"party": 4, "time": "8 pm"}
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(2.5):  # the retrieval deadline
            await registry.call("book_table", args, ctx)
    assert api.committed and not late  # committed at 2.4 s, the answer still on its way
    await asyncio.wait_for(got_late.wait(), 10)
    [result] = late
    assert result.ok and "confirmation B-001" in result.reference and not result.replayed
    key = idempotency_key("CA-book", "book_table", {"party": 4, "time": "8 pm"})
    assert result.idempotency_key == key and api.committed == [("4@8 pm", key)]

    again = await registry.call("book_table", args, ctx)  # the caller's next <ret> asks again
    assert again.ok and again.replayed and again.reference == result.reference
    assert len(api.committed) == 1 and api.keys == [key]  # never booked twice

    other = await registry.call("book_table", {"party": 2, "time": "8 pm"}, ctx)  # another booking runs
    assert other.ok and not other.replayed and len(api.committed) == 2
    assert other.idempotency_key != key
    fresh = await registry.call("book_table", args, CallContext(call_id="CA-other"))  # another call's
    assert fresh.ok and not fresh.replayed and fresh.idempotency_key != key


async def test_concurrent_asks_join_the_running_call_and_a_failed_one_may_be_tried_again():
    api = Bookings(commit_s=0.2, answer_s=0.3)
    registry = ToolRegistry([api.tool])
    ctx = CallContext(call_id="CA-join")
    args = {"party": 3, "time": "7 pm"}
    first, second = await asyncio.gather(
        registry.call("book_table", args, ctx), registry.call("book_table", args, ctx)
    )
    assert first.ok and second.ok and first.reference == second.reference
    assert len(api.committed) == 1 and len(api.keys) == 1  # one run, two answers

    api.fail_next = True
    args2 = {"party": 5, "time": "9 pm"}
    failed = await registry.call("book_table", args2, ctx)
    assert not failed.ok and "booking system is down" in (failed.error or "")
    retried = await registry.call("book_table", args2, ctx)
    assert retried.ok and not retried.replayed and api.keys[-1] == api.keys[-2]  # same key both times


async def test_a_side_effect_call_keeps_its_own_timeout_when_shielded():
    api = Bookings(commit_s=5.0, answer_s=5.0, timeout=1.0)
    registry = ToolRegistry([api.tool])
    late: list[ToolResult] = []
    done = asyncio.Event()
    ctx = CallContext(call_id="CA-slow", on_late_result=lambda r: (late.append(r), done.set()))
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await registry.call("book_table", {"party": 1, "time": "noon"}, ctx)
    await asyncio.wait_for(done.wait(), 10)
    assert not late[0].ok and "did not finish within 1 s" in (late[0].error or "") and not api.committed


async def test_a_plain_tool_is_still_cancelled_with_its_caller_and_sync_tools_get_the_key():
    state = {"finished": False}

    @tool(timeout=10.0)
    async def lookup(item: str) -> str:
        """Look something up."""
        await asyncio.sleep(1.0)
        state["finished"] = True
        return "found"

    @tool(side_effect=True)
    def send_text(to: str) -> str:
        """Send a text message."""
        return f"sent with key {current_idempotency_key()}"

    registry = ToolRegistry([lookup, send_text])
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await registry.call("lookup", {"item": "x"}, CallContext())
    await asyncio.sleep(1.2)
    assert not state["finished"]  # no side effect: the deadline still cancels it
    ctx = CallContext(call_id="CA-sms")
    sent = await registry.call("send_text", {"to": "+15550001111"}, ctx)
    key = idempotency_key("CA-sms", "send_text", {"to": "+15550001111"})
    assert sent.reference == f"(tool result) sent with key {key}"
    assert list(Bookings().tool.spec.parameters["properties"]) == [
        "party",
        "time",
    ]  # the key is not the LLM's
