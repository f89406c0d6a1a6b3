"""The text runner's guards, in process against a scripted LLM: a router that repeats the same call or never
stops calling tools ends its chain (the repeat is recognised before it runs: a booking never runs twice),
a reply with several calls runs them all, a scenario that runs too long is stopped and recorded, a runner that
raises fails its own scenario only, and a long run shows a progress bar on stderr."""

from __future__ import annotations

import pytest

from duetaspan.config import AgentConfig
from duetaspan.eval.result import ScenarioRun
from duetaspan.eval.run import run_suite
from duetaspan.eval.scenario import Suite
from duetaspan.eval.text import TextRunner
from duetaspan.testing import tool_call
from tests.fakes.llm_server import ScriptedLLMServer

TOOLS = [
    {"name": "lookup", "parameters": {"key": "string"}, "result": {"value": 1}},
    {
        "name": "book_flight",
        "description": "Book a flight for a passenger.",
        "parameters": {"passenger_name": "string"},
        "result": {"booking_ref": "B789"},
        "side_effect": True,
    },
]


def suite(*scenarios: dict) -> Suite:
    return Suite.model_validate({"tools": TOOLS, "scenarios": list(scenarios)})


def config(url: str, **router: object) -> AgentConfig:
    return AgentConfig.model_validate(
        {"router": {"base_url": f"{url}/v1", "model": "scripted", "api_key_env": None, **router}}
    )


async def test_a_repeated_call_ends_the_chain_and_max_chain_caps_it():
    # the LLM asks for the same lookup forever: the repeat is seen before it runs and ends the chain
    same = ScriptedLLMServer({"default": tool_call("lookup", key="a")})
    s = suite(
        {"id": "loop", "turns": ["look up a"], "expected_calls": [{"tool": "lookup", "args": {"key": "a"}}]}
    )
    async with same.serve() as url, TextRunner(config(url), s, max_chain=10) as runner:
        run = await runner.run(s.scenarios[0])
    assert [c.args for c in run.calls] == [{"key": "a"}]
    assert len(same.requests) == 2 and [t["decision"] for t in run.trace] == ["tool", "repeat"]
    # new arguments every time: max_chain is the limit
    steps = [tool_call("lookup", key=str(i)) for i in range(10)]
    fresh = ScriptedLLMServer({"steps": steps})
    async with fresh.serve() as url, TextRunner(config(url), s, max_chain=3) as runner:
        run = await runner.run(s.scenarios[0])
    assert [c.args["key"] for c in run.calls] == ["0", "1", "2"] and len(fresh.requests) == 3


async def test_a_provoked_booking_repeat_never_runs_and_is_not_scored():
    book = tool_call("book_flight", passenger_name="Ada Lovelace")
    server = ScriptedLLMServer({"default": book})
    s = suite(
        {
            "id": "book",
            "turns": ["yes please book it for ada lovelace"],
            "expected_calls": [{"tool": "book_flight", "args": {"passenger_name": "Ada Lovelace"}}],
        }
    )
    async with server.serve() as url, TextRunner(config(url), s) as runner:
        run = await runner.run(s.scenarios[0])
    assert [(c.tool, c.args) for c in run.calls] == [("book_flight", {"passenger_name": "Ada Lovelace"})]
    assert len(server.requests) == 2 and run.trace[1]["calls"][0]["decision"] == "repeat"
    assert run.answer_parts == ["(tool result) booking ref: B789."]
    # a later turn ("great, thanks", a yes to the booking) provokes the same booking again: it does not run
    server = ScriptedLLMServer({"default": book})
    s = suite({"id": "two", "turns": ["book it for ada lovelace", "great, thanks"]})
    async with server.serve() as url, TextRunner(config(url), s) as runner:
        run = await runner.run(s.scenarios[0])
    assert [c.tool for c in run.calls] == ["book_flight"]
    assert [t["decision"] for t in run.trace] == ["tool", "repeat", "repeat"]


async def test_parallel_calls_run_and_only_new_calls_continue_the_chain():
    two = {
        "tool_calls": [
            {"name": "lookup", "arguments": {"key": "a"}},
            {"name": "lookup", "arguments": {"key": "b"}},
        ]
    }
    again = {
        "tool_calls": [
            {"name": "lookup", "arguments": {"key": "a"}},
            {"name": "lookup", "arguments": {"key": "c"}},
        ]
    }
    server = ScriptedLLMServer({"steps": [two, again, again]})
    s = suite({"id": "p", "turns": ["look up a and b"]})
    async with server.serve() as url, TextRunner(config(url), s) as runner:
        run = await runner.run(s.scenarios[0])
    assert [c.args["key"] for c in run.calls] == ["a", "b", "c"] and len(server.requests) == 3
    assert [c["decision"] for c in run.trace[1]["calls"]] == ["repeat", "tool"]


async def test_a_scenario_that_runs_too_long_is_stopped_and_recorded():
    slow = ScriptedLLMServer({"default": {"delay_s": 5, "content": "NONE"}})
    s = suite({"id": "slow", "turns": ["anything"]})
    async with slow.serve() as url, TextRunner(config(url, timeout_s=30), s, timeout_s=0.5) as runner:
        run = await runner.run(s.scenarios[0])
    assert run.error == "timed out after 0.5 s" and run.calls == []


class Broken:
    async def run(self, scenario):
        if scenario.id == "bad":
            raise RuntimeError("runner bug")
        return ScenarioRun(scenario.id)


async def test_a_runner_exception_fails_one_scenario_and_long_runs_show_progress(capsys):
    s = suite(*({"id": sid, "turns": ["hi"]} for sid in ("a", "bad", "c", "d", "e")))
    report = await run_suite(Broken(), s, jobs=2)
    rows = {r["id"]: r for r in report["scenarios"]}
    assert rows["bad"]["error"] == "RuntimeError: runner bug" and not rows["bad"]["passed"]
    assert report["passed"] == 4 and report["pass_at_1"] == pytest.approx(0.8) and report["errors"] == 1
    assert "5/5" in capsys.readouterr().err  # tqdm's bar on stderr (more than three scenarios)
