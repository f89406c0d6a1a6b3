"""`duetaspan eval --text` end to end: the real command (`python -m duetaspan eval`) routes hand-made
scenarios through the real router against a scripted loopback LLM whose answers are known, so every score
of the report is known too: passes, a self-correction the LLM gets wrong, a chain of two calls, an extra
call, a forbidden word, a side-effect call the policy refuses, an LLM that fails and one that times out."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from duetaspan.testing import tool_call
from tests.fakes.llm_server import ScriptedLLMServer
from tests.support import REPO_ROOT

ALREADY = "TOOL CALLS ALREADY MADE"
NONE = {"content": "NONE"}

SUITE = """
name: hand-made
tools:
  - name: get_weather
    description: The current weather in a city.
    parameters: {city: string}
    result: {forecast: "sunny, 24 C"}
  - name: search_flights
    description: Flights to a destination on a date.
    parameters: {destination: string, date: string}
    result: {flights: [{flight_id: FL1, price: 450}]}
  - name: book_flight
    description: Book the flight found for a passenger.
    parameters: {passenger_name: string}
    result: {booking_ref: B789}
    side_effect: true
  - name: track_order
    description: The shipping status of an order.
    parameters: {order_id: string}
    result: {shipping_status: out for delivery}
scenarios:
  - id: weather
    turns: ["Hi! What's the weather in Sydney?"]
    expected_calls: [{tool: get_weather, args: {city: Sydney}}]
    expect_words: [sunny]
  - id: corrected_city
    turns: ["What's the weather in Paris, no wait, actually make that Melbourne."]
    expected_calls: [{tool: get_weather, args: {city: Melbourne}}]
    self_correction: true
  - id: flight_chain
    turns:
      - {text: "Hello, I'm planning a trip.", route: false, agent: "Happy to help, where to?"}
      - "Find me a flight to Berlin on September 10 and book it for Ada Lovelace."
    expected_calls:
      - {tool: search_flights, args: {destination: Berlin, date: September 10}}
      - {tool: book_flight, args: {passenger_name: Ada Lovelace}}
  - id: order_extra_call
    turns: ["Where is my order? It's ABC 123."]
    expected_calls: [{tool: track_order, args: {order_id: ABC 123}}]
  - id: thanks
    turns: ["Thanks, that's all."]
  - id: oslo_forbidden_word
    turns: ["And the weather in Oslo?"]
    expected_calls: [{tool: get_weather, args: {city: Oslo}}]
    forbid_words: [sunny]
  - id: refused_booking
    turns: ["Can you check flights for Ada?"]
  - id: llm_down
    turns: ["Simulate a failure now."]
    expected_calls: [{tool: get_weather, args: {city: London}}]
  - id: llm_slow
    turns: ["Answer me slowly."]
    expected_calls: [{tool: get_weather, args: {city: London}}]
"""

SCRIPT = {
    "rules": [  # first match wins, against the router's whole user message (context + question)
        {"match": [ALREADY, "book_flight("], "reply": NONE},
        {"match": [ALREADY, "get_weather("], "reply": NONE},
        {
            "match": [ALREADY, "search_flights("],
            "reply": tool_call("book_flight", passenger_name="Ada Lovelace"),
        },
        {"match": [ALREADY, "track_order("], "reply": tool_call("get_weather", city="Springfield")},
        {"match": ALREADY, "reply": NONE},
        {"match": "sydney", "reply": tool_call("get_weather", city="Sydney")},
        {"match": "melbourne", "reply": tool_call("get_weather", city="Paris")},  # misses the correction
        {"match": "berlin", "reply": tool_call("search_flights", destination="Berlin", date="September 10")},
        {"match": "my order", "reply": tool_call("track_order", order_id="abc_123")},
        {"match": "oslo", "reply": tool_call("get_weather", city="Oslo")},
        {"match": "failure", "reply": {"status": 500}},
        {"match": "slowly", "reply": {"delay_s": 4, "content": "NONE"}},
        {"match": "flights for ada", "reply": tool_call("book_flight", passenger_name="Ada")},
    ],
    "default": NONE,
}

# (passed, tool precision, recall, argument accuracy) per scenario: the known right answers
EXPECTED = {
    "weather": (True, 1.0, 1.0, 1.0),
    "corrected_city": (False, 1.0, 1.0, 0.0),
    "flight_chain": (True, 1.0, 1.0, 1.0),
    "order_extra_call": (False, 0.5, 1.0, 1.0),
    "thanks": (True, 1.0, 1.0, 1.0),
    "oslo_forbidden_word": (False, 1.0, 1.0, 1.0),
    "refused_booking": (True, 1.0, 1.0, 1.0),
    "llm_down": (False, 1.0, 0.0, 0.0),
    "llm_slow": (False, 1.0, 0.0, 0.0),
}


async def run_eval(*args: str, cwd: Path, within_s: float = 240.0) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "duetaspan", "eval", *args,
        cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), within_s)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_text_eval_scores_hand_made_scenarios_exactly(tmp_path):
    (tmp_path / "suite.yaml").write_text(SUITE)
    (tmp_path / "agent.toml").write_text('[router]\napi_key_env = ""\ntimeout_s = 1.5\n')
    llm = ScriptedLLMServer(SCRIPT)
    async with llm.serve() as url:
        rc, out, err = await run_eval(
            "suite.yaml", "--text", "--config", "agent.toml",
            "--router-base-url", f"{url}/v1", "--router-model", "scripted-router",
            "--report", "out/report.json", "--html", "out/report.html", "--jobs", "3",
            cwd=tmp_path,
        )  # fmt: skip
    assert rc == 0, err  # the run completed: scores and per-scenario LLM failures are not errors
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    rows = {r["id"]: r for r in report["scenarios"]}
    assert [r["id"] for r in report["scenarios"]] == list(EXPECTED)  # file order, whatever the jobs
    for sid, (passed, precision, recall, accuracy) in EXPECTED.items():
        row = rows[sid]
        got = (row["passed"], row["tool_selection"]["precision"], row["tool_selection"]["recall"],
               row["argument_accuracy"])  # fmt: skip
        assert got == (passed, precision, recall, accuracy), (sid, row["reason"], row["actual_calls"])

    # the calls themselves, as the router made them through the real registry and policy
    chain = rows["flight_chain"]
    assert [(c["tool"], c["args"]) for c in chain["actual_calls"]] == [
        ("search_flights", {"destination": "Berlin", "date": "September 10"}),
        ("book_flight", {"passenger_name": "Ada Lovelace"}),
    ]
    assert chain["expected_calls"][1] == {"tool": "book_flight", "args": {"passenger_name": "Ada Lovelace"}}
    assert chain["splits"] == ["multi-call"] and chain["latency_s"] is not None
    assert [c["tool"] for c in rows["order_extra_call"]["actual_calls"]] == ["track_order", "get_weather"]
    assert rows["order_extra_call"]["tool_selection"]["unexpected"] == ["get_weather"]
    assert (
        rows["corrected_city"]["arguments"][0]["why"] == "argument 'city': expected 'Melbourne', got 'Paris'"
    )
    assert rows["oslo_forbidden_word"]["forbidden_words"] == ["sunny"]
    assert "sunny" in rows["weather"]["answer"]
    assert rows["refused_booking"]["actual_calls"] == []
    assert rows["refused_booking"]["trace"][0]["decision"] == "refused"
    assert "HTTP 500" in rows["llm_down"]["error"]
    assert "no answer within 1.5 s" in rows["llm_slow"]["error"]
    assert not rows["thanks"]["error"] and rows["thanks"]["splits"] == ["no-call"]

    # run-level metrics are the means of the per-scenario scores
    n = len(EXPECTED)
    assert report["pass_at_1"] == pytest.approx(4 / n, abs=1e-4)
    assert report["passed"] == 4 and report["n"] == n and report["errors"] == 2
    f1 = [1, 1, 1, 2 / 3, 1, 1, 1, 0, 0]
    assert report["tool_selection_f1"] == pytest.approx(sum(f1) / n, abs=1e-4)
    assert report["argument_accuracy"] == pytest.approx(6 / n, abs=1e-4)
    splits = report["splits"]
    assert splits["single-call"]["n"] == 6 and splits["single-call"]["pass_at_1"] == pytest.approx(
        1 / 6, abs=1e-4
    )
    assert splits["multi-call"]["pass_at_1"] == 1.0 and splits["no-call"]["pass_at_1"] == 1.0
    assert splits["self-correction"] == {**splits["self-correction"], "n": 1, "pass_at_1": 0.0}
    assert report["mode"] == "text" and report["settings"]["router"]["model"] == "scripted-router"

    # the router saw the agent's context: the scripted reply of the context turn, the tools with schemas
    chain_requests = [r for r in llm.requests if "berlin" in json.dumps(r).lower()]
    assert "Happy to help, where to?" in chain_requests[0]["messages"][-1]["content"]
    assert {t["function"]["name"] for t in chain_requests[0]["tools"]} == {
        "get_weather", "search_flights", "book_flight", "track_order"
    }  # fmt: skip
    assert all(r["model"] == "scripted-router" for r in llm.requests)

    html = (tmp_path / "out" / "report.html").read_text()
    assert "flight_chain" in html and "pass@1 <b>0.444</b>" in html
    assert "pass@1" in out and "self-correction" in out  # the summary table


FDB = {
    "benchmark_name": "Full-Duplex-Bench-v3",
    "version": "2",
    "scenarios": [
        {"id": "travel_01", "domain": "travel_identity", "difficulty": "easy", "title": "Flight search",
         "dialogue": [{"user": "Hi, um, I need a flight.", "ai": "Sure! Where to?"},
                      {"user": "Uh, to Rome on July 15 please.", "ai": "Searching flights to Rome."}],
         "expected_tool_calls": [{"function": "search_flights", "args": {"destination": "Rome", "date": "July 15"}}],
         "num_expected_calls": 1, "state_rollback_test": False, "disfluency_features": ["FILLER"],
         "latency_profile": "normal"},
        {"id": "travel_09", "domain": "travel_identity", "difficulty": "medium", "title": "Self-correction",
         "dialogue": [{"user": "Hello.", "ai": "Hi, how can I help?"},
                      {"user": "Flights to Paris, no, scratch that, Berlin on September 10th.",
                       "ai": "Searching flights to Berlin."}],
         "expected_tool_calls": [{"function": "search_flights", "args": {"destination": "Berlin", "date": "September 10"}}],
         "num_expected_calls": 1, "state_rollback_test": True, "disfluency_features": ["SELF_CORRECTION"],
         "latency_profile": "fast"},
        {"id": "ecommerce_03", "domain": "ecommerce_support", "difficulty": "hard", "title": "Search and add",
         "dialogue": [{"user": "Hi there.", "ai": "Hello!"},
                      {"user": "Find wireless headphones and add two to my cart.", "ai": "Added two to your cart."}],
         "expected_tool_calls": [{"function": "search_products", "args": {"query": "wireless headphones"}},
                                 {"function": "add_to_cart", "args": {"product_id": "$RESULT_0.products[0].product_id", "quantity": 2}}],
         "num_expected_calls": 2, "state_rollback_test": False, "disfluency_features": [],
         "latency_profile": "normal"},
    ],
}  # fmt: skip

FDB_SCRIPT = {
    "rules": [
        {"match": [ALREADY, "add_to_cart("], "reply": NONE},
        {
            "match": [ALREADY, "search_products("],
            "reply": tool_call("add_to_cart", product_id="PROD1", quantity=2),
        },
        {"match": ALREADY, "reply": NONE},
        {"match": "rome", "reply": tool_call("search_flights", destination="Rome", date="July 15")},
        {
            "match": "berlin",
            "reply": tool_call("search_flights", destination="Berlin", date="September 10th"),
        },
        {"match": "headphones", "reply": tool_call("search_products", query="Wireless Headphones")},
    ],
    "default": NONE,
}


async def test_fdb_v3_text_eval_uses_the_benchmarks_tools_and_scoring(tmp_path):
    (tmp_path / "benchmark_data_v2.json").write_text(json.dumps(FDB))
    llm = ScriptedLLMServer(FDB_SCRIPT)
    async with llm.serve() as url:
        rc, _, err = await run_eval(
            "benchmark_data_v2.json", "--format", "fdb-v3", "--text",
            "--router-base-url", f"{url}/v1", "--router-model", "scripted", "--report", "fdb.json",
            cwd=tmp_path,
        )  # fmt: skip
    assert rc == 0, err
    report = json.loads((tmp_path / "fdb.json").read_text())
    rows = {r["id"]: r for r in report["scenarios"]}
    assert report["format"] == "fdb-v3" and len(llm.requests[0]["tools"]) == 12  # the benchmark's 12 tools
    assert rows["travel_01"]["passed"]
    # "September 10th" is not "September 10" under the deterministic rule (a judge may accept it)
    assert not rows["travel_09"]["passed"] and rows["travel_09"]["argument_accuracy"] == 0.0
    assert rows["travel_09"]["splits"] == ["single-call", "self-correction"]
    chained = rows["ecommerce_03"]
    assert chained["passed"], chained["reason"]  # `$RESULT_0...` accepts the id the chain passed on
    assert [c["tool"] for c in chained["actual_calls"]] == ["search_products", "add_to_cart"]
    # the mock tool's documented result reached the router as the chain's context
    second = next(r for r in llm.requests if "search_products(" in r["messages"][-1]["content"])
    assert "Wireless Headphones Premium" in second["messages"][-1]["content"]
    assert report["pass_at_1"] == pytest.approx(2 / 3, abs=1e-4)
    assert report["splits"]["self-correction"]["pass_at_1"] == 0.0
    assert report["splits"]["multi-call"]["pass_at_1"] == 1.0
    # only the request turn is routed; the context turn and its scripted reply are context
    first = llm.requests[0]["messages"][-1]["content"]
    assert "Sure! Where to?" in first and first.rstrip().endswith("Uh, to Rome on July 15 please.")

    # with the optional LLM judge, the argument the exact rule rejected is judged (and here accepted)
    judge = ScriptedLLMServer(
        {"rules": [{"match": '"date": "September 10th"', "reply": {"content": '{"correct": true, "explanation": "same date"}'}}],
         "default": {"content": '{"correct": false, "explanation": "differs"}'}}
    )  # fmt: skip
    llm = ScriptedLLMServer(FDB_SCRIPT)
    async with llm.serve() as url, judge.serve() as judge_url:
        rc, _, err = await run_eval(
            "benchmark_data_v2.json", "--format", "fdb-v3", "--text",
            "--router-base-url", f"{url}/v1", "--router-model", "scripted", "--report", "judged.json",
            "--judge-base-url", f"{judge_url}/v1", "--judge-model", "judge-model",
            cwd=tmp_path,
        )  # fmt: skip
    assert rc == 0, err
    judged = json.loads((tmp_path / "judged.json").read_text())
    rows = {r["id"]: r for r in judged["scenarios"]}
    assert judged["judge"] and rows["travel_09"]["passed"] and judged["pass_at_1"] == 1.0
    assert rows["travel_09"]["arguments"][0]["why"] == "judge: same date"
    assert len(judge.requests) == 1 and judge.requests[0]["model"] == "judge-model"  # only the mismatch


async def test_eval_errors_exit_non_zero_with_a_clear_message(tmp_path):
    rc, _, err = await run_eval("missing.yaml", "--text", cwd=tmp_path)
    assert rc == 1 and "missing.yaml: no such scenario file" in err
    (tmp_path / "bad.yaml").write_text("scenarios: [{id: a}]\n")
    rc, _, err = await run_eval("bad.yaml", "--text", cwd=tmp_path)
    assert rc == 1 and "scenarios.0.turns: Field required" in err
    (tmp_path / "ok.yaml").write_text("scenarios: [{id: a, turns: [hello]}]\n")
    rc, _, err = await run_eval("ok.yaml", cwd=tmp_path)  # audio mode without audio or a TTS command
    assert rc == 1 and "has no audio" in err and "--tts-command" in err
