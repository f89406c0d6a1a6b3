"""Real-router mode (`DUETASPAN_TEST_ROUTER=real`: the agent's own router, the scripted ASR) and the LLM judge
(`outcome.judge(...)`), each skipped with a clear reason when its key is missing. The "real" router and the
judge here are loopback `ScriptedLLM`s standing in for the configured endpoints."""

from __future__ import annotations

import json

import pytest

from duetaspan import Agent, tool
from duetaspan.testing import ScriptedLLM, content, scripted_call, tool_call
from duetaspan.testing.judge import parse_verdict, router_mode
from duetaspan.testing.outcome import Outcome


@tool(side_effect=True)
def book_table(people: int, time: str) -> str:
    """Book a table tonight. Only when the caller asks to book.

    Args:
        people: party size
        time: e.g. "7 PM"
    """
    return f"Booked a table for {people} at {time} tonight."


def test_verdicts_are_parsed_leniently():
    assert parse_verdict('```json\n{"pass": true, "reason": "it booked"}\n```') == (True, "it booked")
    assert parse_verdict("no idea")[0] is False and "not a verdict" in parse_verdict("no idea")[1]


async def test_judge_without_a_key_is_skipped_saying_which_variable(monkeypatch):
    monkeypatch.delenv("DUETASPAN_JUDGE_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(pytest.skip.Exception, match="set DUETASPAN_JUDGE_API_KEY or OPENAI_API_KEY"):
        await Outcome(kind="no_span").judge("books a table")


async def test_real_mode_without_the_routers_key_is_skipped(monkeypatch, scripted_llm, tiny_engine):
    monkeypatch.setenv("DUETASPAN_TEST_ROUTER", "real")
    monkeypatch.delenv("MY_ROUTER_KEY", raising=False)
    assert router_mode() == "real"
    agent = Agent(engine=tiny_engine, router={"base_url": "https://llm.example.test/v1", "model": "big",
                                              "api_key_env": "MY_ROUTER_KEY"})  # fmt: skip
    with pytest.raises(
        pytest.skip.Exception, match=r"https://llm.example.test/v1, model big\) needs \$MY_ROUTER_KEY"
    ):
        async with scripted_call(agent, llm=scripted_llm):
            pass
    assert not agent.started


async def test_real_mode_uses_the_agents_router_and_the_judge_decides(monkeypatch, tiny_engine, scripted_llm,
                                                                      scripted_asr):  # fmt: skip
    configured = ScriptedLLM(
        {"book": tool_call("book_table", people=4, time="7 PM")}
    )  # the agent's "real" LLM
    judge = ScriptedLLM({"steps": [content('{"pass": true, "reason": "booked for four"}'),
                                   content('{"pass": false, "reason": "it booked for four, not six"}')]})  # fmt: skip
    monkeypatch.setenv("DUETASPAN_TEST_ROUTER", "real")
    monkeypatch.setenv("MY_ROUTER_KEY", "sk-router")
    monkeypatch.setenv("DUETASPAN_JUDGE_API_KEY", "sk-judge")
    async with configured, judge:
        monkeypatch.setenv("DUETASPAN_JUDGE_BASE_URL", judge.base_url)
        monkeypatch.setenv("DUETASPAN_JUDGE_MODEL", "judge-model")
        agent = Agent(tools=[book_table], engine=tiny_engine, seed=0,
                      router={"base_url": configured.base_url, "model": "big", "api_key_env": "MY_ROUTER_KEY"})  # fmt: skip
        async with scripted_call(agent, llm=scripted_llm, asr=scripted_asr) as call:
            await call.say("Please book a table for four at 7 PM.")
            outcome = await call.ask()
        outcome.expect_tool("book_table", people=4)
        await outcome.judge("books a table for four")
        with pytest.raises(
            AssertionError, match="did not 'books a table for six': it booked for four, not six"
        ):
            await outcome.judge("books a table for six")
    assert scripted_llm.requests == []  # the scripted router was not used ...
    assert [r["model"] for r in configured.requests] == ["big"]  # ... the agent's own one was
    asked = judge.requests[0]
    assert asked["model"] == "judge-model"
    step = asked["messages"][-1]["content"]
    assert "Criterion: books a table for four" in step and "question heard: 'Please book a table" in step
    assert "tool book_table({'people': 4, 'time': '7 PM'}) ok" in step
    assert json.dumps(asked).count("sk-") == 0  # keys travel in headers, never in the prompt
