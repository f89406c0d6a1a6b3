"""`scripted_call` on a user's agent (`Agent(tools=[...])` with `@tool`s, the plugin's fixtures): text said
through the scripted ASR, a shipped phrase by path, DTMF reaching the tools, a side effect the policy refuses,
several tool calls in one router reply, a late span, the call's artifact afterwards, and failure messages that
show the question heard, the router's decision and the tool's arguments."""

from __future__ import annotations

import asyncio
import os
import shutil

import pytest

from duetaspan import Agent, CallContext, tool
from duetaspan.testing import scripted_call, tool_call, tool_calls
from duetaspan.testing.audio import DEFAULT_TTS, phrase_path


@tool(side_effect=True)
def book_table(people: int, time: str) -> str:
    """Book a table tonight. Only when the caller asks to book.

    Args:
        people: party size
        time: e.g. "7 PM"
    """
    return f"Booked a table for {people} at {time} tonight."


@tool
def typed_digits(ctx: CallContext) -> str:
    """The digits the caller typed on the keypad."""
    return f"You typed {ctx.dtmf or 'nothing'}."


@tool
async def slow_menu() -> str:
    """Tonight's menu (slow to look up)."""
    await asyncio.sleep(10.0)  # cut by the deadline
    return "Risotto."


@tool
def opening_hours() -> str:
    """When the restaurant is open."""
    return "Open 5 PM to 10 PM."


async def test_a_call_books_refuses_and_reads_the_keypad(tiny_engine, scripted_llm, scripted_asr, tmp_path):
    # rules are checked in order against the router's user message: the question plus earlier context
    scripted_llm.on("just type", tool_call("typed_digits"))
    scripted_llm.on("how about", tool_call("book_table", people=4, time="8 PM"))  # nobody asked to book
    scripted_llm.on("please book", tool_call("book_table", people=4, time="7 PM"))
    agent = Agent(tools=[book_table, typed_digits], engine=tiny_engine, seed=0, record_dir=tmp_path)
    async with scripted_call(agent, "+15550001111", llm=scripted_llm, asr=scripted_asr) as call:
        assert agent.started
        await call.say("Please book a table for four at 7 PM.")
        booked = await call.ask()
        await call.say(phrase_path("greeting"), heard="Hmm, and how about eight?")  # an audio file's path
        refused = await call.ask()
        await call.press("1234#")
        await call.say("What did I just type?")
        typed = await call.ask()
        call_id = call.session.call.call_id
    assert not agent.started  # scripted_call started it, so it stopped it

    booked.expect_tool("book_table", people=4, time="7 PM").expect_span(contains="7 PM")
    assert booked.question == "Please book a table for four at 7 PM."
    # the line went on carrying the caller's silence after the words, so the voice detection ended the
    # utterance: the question is that utterance, not a window transcribed after the capture's wait ran out
    assert booked._of("question")[0]["how"] in ("final", "wait"), booked._of("question")
    assert booked.decision == "tool" and booked.arguments == {"people": 4, "time": "7 PM"}
    refused.expect_refused(reason="did not ask", tool="book_table").expect_no_tool().expect_no_span()
    typed.expect_tool("typed_digits").expect_span(contains="You typed 1234#")

    # what went wrong is in the message: the question heard, the router's decision, the tool's arguments
    with pytest.raises(AssertionError) as wrong_args:
        booked.expect_tool("book_table", people=5)
    message = str(wrong_args.value)
    assert "tool 'book_table' ran, but not with {'people': 5} (got {'people': 4})" in message
    assert "question heard: 'Please book a table for four at 7 PM.'" in message
    assert "router: tool (book_table)" in message
    assert "tool book_table({'people': 4, 'time': '7 PM'}) ok" in message
    assert "scripted LLM replied: book_table({'people': 4, 'time': '7 PM'})" in message
    # a refused call never ran: what the LLM asked for is in the message all the same
    assert "scripted LLM replied: book_table({'people': 4, 'time': '8 PM'})" in refused.describe()
    with pytest.raises(AssertionError, match=r"(?s)expected tool 'book_table' to run, but no tool ran.*"
                       r"router: refused \(book_table, the caller did not ask"):  # fmt: skip
        refused.expect_tool("book_table")
    with pytest.raises(AssertionError, match="expected the refusal to say 'too late'"):
        refused.expect_refused(reason="too late")
    with pytest.raises(AssertionError, match="expected no tool call, got typed_digits"):
        typed.expect_no_tool()
    with pytest.raises(AssertionError, match=r"(?s)expected the span to contain 'nine'.*outcome: span"):
        booked.expect_span(contains="nine")

    # afterwards: the call's artifact, its spans and tool calls
    assert call.record is not None and call.record["complete"] and call.record["call_id"] == call_id
    assert call.record["meta"]["caller"] == "+15550001111"
    assert (tmp_path / f"{call_id}.json").is_file()
    assert [s["reference"] for s in call.spans] == [booked.reference, typed.reference]
    assert [(c["tool"], c["arguments"]) for c in call.tool_calls] == [
        ("book_table", {"people": 4, "time": "7 PM"}),
        ("typed_digits", {}),
    ]
    assert len(call.record["rets"]) == 3 and call.outcomes == [booked, refused, typed]
    assert scripted_asr.requests and all(r["model"] == "scripted" for r in scripted_llm.requests)


async def test_parallel_tool_calls_a_late_span_and_waiting_for_one(tiny_engine, scripted_llm, scripted_asr):
    scripted_llm.on("menu", tool_call("slow_menu"))
    scripted_llm.on("open", tool_calls(tool_call("opening_hours"), tool_call("opening_hours")))
    agent = Agent(tools=[slow_menu, opening_hours], engine=tiny_engine, seed=0)  # deadline 2.5 s
    async with scripted_call(agent, llm=scripted_llm, asr=scripted_asr) as call:
        await call.say("When are you open?")
        hours = await call.ask()
        await call.say("What's on the menu tonight?")
        late = await call.ask()
        with pytest.raises(AssertionError, match=r"no retrieval outcome within 0.5 s \(spans so far: 1"):
            await call.wait_for_span(timeout=0.5)  # nothing more comes: the model never asks on its own
    # the reply held two tool calls (OpenAI's parallel shape, see test_servers); the router ran the first at least
    hours.expect_tool("opening_hours").expect_span(contains="5 PM to 10 PM")
    late.expect_late().expect_no_span()
    with pytest.raises(AssertionError, match="expected a span, got late"):
        late.expect_span()
    assert call.record is not None and len(call.record["late_spans"]) == 1  # a temporary record dir


@pytest.mark.skipif(
    shutil.which("espeak-ng") is None, reason="espeak-ng is not installed (apt install espeak-ng)"
)
async def test_text_spoken_by_a_tts_command_is_a_real_utterance(tiny_engine, scripted_llm, scripted_asr):
    scripted_llm.on("open", tool_call("opening_hours"))
    agent = Agent(tools=[opening_hours], engine=tiny_engine, seed=0)
    async with scripted_call(agent, llm=scripted_llm, asr=scripted_asr, tts_command=DEFAULT_TTS) as call:
        await call.say("When are you open tonight?")
        outcome = await call.ask()
    outcome.expect_tool("opening_hours").expect_span(contains="5 PM")
    # voice detection cut the synthesized speech into an utterance the ASR was sent (about 1.5 s of it)
    assert scripted_asr.requests and 0.8 < scripted_asr.requests[0]["seconds"] < 4.0
    assert (
        call.record is not None
        and call.record["caller_utterances"][0]["text"] == "When are you open tonight?"
    )


async def test_the_twilio_transport_is_a_real_signed_media_stream(tiny_engine, scripted_llm, scripted_asr,
                                                                  monkeypatch):  # fmt: skip
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", "the-users-own-token")  # left as it was after the call
    monkeypatch.delenv("TWILIO_ACCOUNT_SID", raising=False)
    scripted_llm.on("type", tool_call("typed_digits"))
    agent = Agent(tools=[typed_digits], engine=tiny_engine, seed=0)
    async with scripted_call(agent, "+15550004444", transport="twilio", llm=scripted_llm,
                             asr=scripted_asr) as call:  # fmt: skip
        assert (
            os.environ["TWILIO_AUTH_TOKEN"] == "the-users-own-token"
        )  # the test account only while planning
        await call.press("42#")
        await call.say("What did I type?")
        typed = await call.ask()
    typed.expect_tool("typed_digits").expect_span(contains="You typed 42#")
    assert typed._of("question")[0]["how"] in ("final", "wait")  # Twilio streams the silence too
    assert os.environ["TWILIO_AUTH_TOKEN"] == "the-users-own-token" and "TWILIO_ACCOUNT_SID" not in os.environ
    events = [m["event"] for m in call.received]
    assert "media" in events and "mark" in events  # the agent's audio came back as mu-law media messages
    assert call.line.closed and not agent.started  # hung up with Twilio's stop; the server and agent stopped
    assert call.record is not None and call.record["meta"] == {
        "caller": "+15550004444",
        "called": "+15552223333",
        "transport": "twilio",
    }
