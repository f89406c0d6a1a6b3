"""The scoring rules of `duetaspan eval` on hand-made calls whose right scores are known: multiset tool
selection, FIFO argument matching with the deterministic normalisation, the optional judge, strict pass@1,
and the per-split aggregates; plus the scenario-file loader and FDB-v3's mock tools."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from duetaspan.adapters.llm import ChatClient
from duetaspan.errors import ConfigError
from duetaspan.eval.fdb_v3 import fdb_v3_suite, mock_result
from duetaspan.eval.result import ScenarioRun
from duetaspan.eval.run import llm_judge, scenario_row
from duetaspan.eval.scenario import Scenario, Suite, load_suite
from duetaspan.eval.scoring import args_match, check_arguments, score_scenario, summarize, tool_selection
from duetaspan.eval.tools import ActualCall
from tests.fakes.llm_server import ScriptedLLMServer


def test_tool_selection_is_f1_over_multisets():
    s = tool_selection(["search_flights", "book_flight"], ["search_flights", "search_flights"])
    assert (s.precision, s.recall) == (0.5, 0.5) and s.f1 == pytest.approx(0.5)
    assert s.missing == ["book_flight"] and s.unexpected == ["search_flights"]
    extra = tool_selection(["track_order"], ["track_order", "get_weather"])
    assert (extra.precision, extra.recall, extra.f1) == (0.5, 1.0, pytest.approx(2 / 3))
    assert tool_selection([], []).f1 == 1.0  # nothing expected, nothing called
    assert tool_selection([], ["x"]).f1 == 0.0 and tool_selection(["x"], []).f1 == 0.0


def test_argument_rule_normalises_strings_skips_references_and_needs_every_key():
    assert args_match({"doc_type": "driver_license"}, {"doc_type": " Driver License"})[0]
    assert args_match({"flight_id": "$RESULT_0.flights[0].flight_id"}, {"flight_id": "anything"})[0]
    assert args_match({"amount": 100}, {"amount": 100.0, "extra": "ignored"})[0]
    ok, why = args_match({"flight_id": "$RESULT_0.id"}, {})
    assert not ok and "missing argument 'flight_id'" in why
    ok, why = args_match({"date": "August 20"}, {"date": "2026-08-20"})
    assert not ok and "expected 'August 20'" in why
    assert not args_match({"bedrooms": "2"}, {"bedrooms": 2})[0]  # no type coercion, as the benchmark


async def test_arguments_are_matched_first_in_first_out_per_tool():
    expected = [("search_flights", {"destination": "Paris"}), ("search_flights", {"destination": "Berlin"})]
    in_order = [("search_flights", {"destination": "Paris"}), ("search_flights", {"destination": "Berlin"})]
    swapped = list(reversed(in_order))
    assert [c.ok for c in await check_arguments(expected, in_order)] == [True, True]
    # FIFO, not best matching: the first Berlin call is paired with the expected Paris call
    assert [c.ok for c in await check_arguments(expected, swapped)] == [False, False]
    checks = await check_arguments([("book_flight", {"passenger_name": "Ada"})], [])
    assert checks[0].why == "not called" and checks[0].actual is None


async def test_strict_pass_needs_every_tool_argument_and_word():
    exp = [("get_weather", {"city": "Sydney"})]
    good = await score_scenario(
        exp, exp, answer="It is sunny.", expect_words=["sunny"], forbid_words=["rain"]
    )
    assert good.passed and good.argument_accuracy == 1.0 and good.reason == ""
    wrong_arg = await score_scenario(exp, [("get_weather", {"city": "Paris"})])
    assert not wrong_arg.passed and wrong_arg.selection.f1 == 1.0 and wrong_arg.argument_accuracy == 0.0
    assert wrong_arg.reason == "wrong arguments for get_weather"
    words = await score_scenario(
        exp, exp, answer="Sunny and rainy", expect_words=["cloudy"], forbid_words=["rainy"]
    )
    assert not words.passed and words.missing_words == ["cloudy"] and words.forbidden_words == ["rainy"]
    # a word must be a whole word: "sun" is not in "sunny"
    assert (await score_scenario([], [], answer="sunny", expect_words=["sun"])).missing_words == ["sun"]
    errored = await score_scenario(exp, exp, error="router LLM failed: HTTP 500")
    assert not errored.passed and errored.reason.startswith("error: router LLM failed")


async def test_an_llm_judge_can_accept_what_the_exact_rule_rejects():
    judge_server = ScriptedLLMServer(
        {
            "rules": [
                {
                    "match": 'Actual arguments: {"date": "2026-08-20"}',
                    "reply": {"content": '```json\n{"correct": true, "explanation": "same day"}\n```'},
                }
            ],
            "default": {"content": "not json"},
        }
    )
    async with judge_server.serve() as url:
        client = ChatClient(f"{url}/v1", "judge")
        try:
            judge = llm_judge(client)
            checks = await check_arguments(
                [("search_flights", {"date": "August 20"}), ("book_flight", {"passenger_name": "Ada"})],
                [("search_flights", {"date": "2026-08-20"}), ("book_flight", {"passenger_name": "Bob"})],
                judge,
            )
        finally:
            await client.aclose()
    assert checks[0].ok and checks[0].why == "judge: same day"
    # the judge's unusable reply leaves the deterministic verdict
    assert not checks[1].ok and "judge failed" in checks[1].why
    assert len(judge_server.requests) == 2  # only the mismatches were judged


async def test_report_rows_and_split_aggregates():
    single = Scenario(id="one", turns=["a"], expected_calls=[{"tool": "t", "args": {"x": 1}}])
    chained = Scenario(id="two", turns=["b"], self_correction=True,
                       expected_calls=[{"tool": "t", "args": {"x": 1}}, {"tool": "u", "args": {}}])  # fmt: skip
    quiet = Scenario(id="none", turns=["c"])
    rows = [
        await scenario_row(
            single, ScenarioRun("one", calls=[ActualCall("t", {"x": 1}, 0.2)], latency_s=0.2), fdb_v3=False
        ),
        await scenario_row(
            chained, ScenarioRun("two", calls=[ActualCall("t", {"x": 2}, 0.4)], latency_s=0.4), fdb_v3=False
        ),
        await scenario_row(quiet, ScenarioRun("none", calls=[ActualCall("t", {}, 0.1)]), fdb_v3=False),
    ]
    assert [r["passed"] for r in rows] == [True, False, False]
    assert rows[1]["expected_calls"] == [{"tool": "t", "args": {"x": 1}}, {"tool": "u", "args": {}}]
    assert rows[1]["actual_calls"][0]["tool"] == "t" and rows[1]["actual_calls"][0]["args"] == {"x": 2}
    report = summarize(rows)
    assert report["pass_at_1"] == pytest.approx(1 / 3, abs=1e-4)
    # F1: 1, (P 1, R .5 -> 2/3), (P 0 -> 0)
    assert report["tool_selection_f1"] == pytest.approx((1 + 2 / 3 + 0) / 3, abs=1e-4)
    assert report["argument_accuracy"] == pytest.approx((1 + 0 + 1) / 3, abs=1e-4)
    assert report["latency_s"] == pytest.approx(0.3)
    assert set(report["splits"]) == {"single-call", "multi-call", "no-call", "self-correction"}
    assert report["splits"]["single-call"]["pass_at_1"] == 1.0
    assert report["splits"]["multi-call"]["pass_at_1"] == 0.0
    assert report["splits"]["self-correction"]["n"] == 1
    assert report["splits"]["no-call"]["tool_precision"] == 0.0


def test_scenario_files_load_from_yaml_and_json_and_say_what_is_wrong(tmp_path):
    yaml_file = tmp_path / "s.yaml"
    yaml_file.write_text(
        'tools:\n  - name: get_weather\n    parameters: {city: string, days: "integer?"}\n    result: {sky: clear}\n'
        'scenarios:\n  - id: w\n    turns: ["Weather in Oslo?", {text: more, audio: w.wav, route: false}]\n'
        "    expect_calls: [{function: get_weather, arguments: {city: Oslo}}]\n"
    )
    suite = load_suite(yaml_file)
    assert suite.tools[0].parameters == {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]
    }  # fmt: skip
    s = suite.scenarios[0]
    assert s.expected_calls[0].tool == "get_weather" and s.expected_calls[0].args == {"city": "Oslo"}
    assert suite.resolve(s.turns[1].audio) == tmp_path / "w.wav" and not s.turns[1].route
    yaml_file.write_text("tools: [{name: t, parameters: {properties: {x: {type: string}}}}]\nscenarios: []")
    assert load_suite(yaml_file).tools[0].parameters == {
        "type": "object",
        "properties": {"x": {"type": "string"}},
    }
    json_file = tmp_path / "s.json"
    json_file.write_text(json.dumps([{"id": "a", "turns": ["hi"]}]))
    assert load_suite(json_file).scenarios[0].splits == ["no-call"]
    for text, message in [
        ("scenarios: [{id: a, turns: [x]}, {id: a, turns: [y]}]", "used twice"),
        ("scenarios: [{id: a, turns: []}]", "at least one caller turn"),
        ("tools: [{name: t, parameters: {x: str}}]\nscenarios: []", "short-form types"),
        ("scenarios: [{id: a, turns: [x], expected: []}]", "Extra inputs are not permitted"),
        ("scenarios: [\n", "not valid YAML"),
    ]:
        yaml_file.write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_suite(yaml_file)


def test_fdb_v3_data_becomes_a_suite_with_the_twelve_mock_tools():
    data = {
        "benchmark_name": "FDB-v3",
        "scenarios": [
            {"id": "travel_09", "domain": "travel_identity", "difficulty": "medium", "title": "t",
             "dialogue": [{"user": "Hi, I need a flight.", "ai": "Where to?"},
                          {"user": "Paris, no, Berlin on September 10th.", "ai": "Searching Berlin."}],
             "expected_tool_calls": [{"function": "search_flights",
                                      "args": {"destination": "Berlin", "date": "September 10"}}],
             "disfluency_features": ["SELF_CORRECTION"], "state_rollback_test": True, "latency_profile": "fast"},
        ],
    }  # fmt: skip
    suite = fdb_v3_suite(data)
    assert suite.format == "fdb-v3" and len(suite.tools) == 12
    s = suite.scenarios[0]
    assert [t.route for t in s.turns] == [False, True] and s.turns[0].agent == "Where to?"
    assert (
        s.self_correction and s.splits == ["single-call", "self-correction"] and s.tags == ["SELF_CORRECTION"]
    )
    assert s.meta["domain"] == "travel_identity" and s.meta["reference_answer"] == "Searching Berlin."
    with pytest.raises(ConfigError, match="scenarios"):
        fdb_v3_suite({"items": []})


def test_fdb_v3_mock_tools_answer_as_documented():
    assert mock_result("search_flights", {"destination": "Berlin", "date": "May 1"})["flights"] == [
        {"flight_id": "FL123", "destination": "Berlin", "date": "May 1", "price": 450.0}
    ]
    assert mock_result("book_flight", {"passenger_name": "Ada"}) == {
        "status": "success",
        "booking_ref": "B789",
        "passenger": "Ada",
    }
    assert (
        mock_result("update_identity_doc", {"doc_type": "passport", "doc_number": "X1234567"})[
            "masked_number"
        ]
        == "4567"
    )
    assert (
        mock_result("get_exchange_rate", {"amount": 200, "from_currency": "USD", "to_currency": "EUR"})[
            "converted_amount"
        ]
        == 180.0
    )
    assert (
        mock_result("search_apartments", {"city": "Austin", "bedrooms": 2, "max_price": 2000})["results"][0][
            "price"
        ]
        == 1900.0
    )
    assert (
        mock_result("calculate_commute", {"origin_address": "a", "destination_address": "b"})["mode"]
        == "driving"
    )
    assert (
        mock_result("search_products", {"query": "headphones"})["products"][0]["name"] == "headphones Premium"
    )
    assert mock_result("add_to_cart", {"product_id": "PROD1", "quantity": 2})["cart_total"] == 199.98
    assert mock_result("track_order", {"order_id": "1"}) == {
        "status": "success",
        "shipping_status": "Out for delivery",
    }
    with pytest.raises(KeyError):
        mock_result("nope", {})


def test_fdb_v3_audio_is_found_in_the_released_folder_layout(tmp_path):
    (tmp_path / "travel_09_spk3").mkdir()
    (tmp_path / "travel_09_spk3" / "input.wav").write_bytes(b"RIFF")
    data = {"scenarios": [
        {"id": "travel_09", "dialogue": [{"user": "a", "ai": "b"}, {"user": "c", "ai": "d"}]},
        {"id": "travel_10", "dialogue": [{"user": "a", "ai": "b"}, {"user": "c", "ai": "d"}]},
    ]}  # fmt: skip
    suite = fdb_v3_suite(data, audio_dir=tmp_path)
    assert suite.scenarios[0].audio == tmp_path / "travel_09_spk3" / "input.wav"
    assert suite.scenarios[1].audio is None


async def test_audio_runner_reads_recordings_renders_text_and_reports_bad_audio(tmp_path):
    from duetaspan.config import AgentConfig
    from duetaspan.eval.audio import AudioRunner, CallerAudioError
    from tests.support import AUDIO_FIXTURES

    (tmp_path / "tts.py").write_text(
        "import shutil, sys\nif 'fail' in sys.argv[1]: sys.exit('no voice for that')\n"
        f"shutil.copy({str(AUDIO_FIXTURES / 'greeting.wav')!r}, sys.argv[2])\n"
    )
    s = Suite.model_validate({"scenarios": [
        {"id": "rec", "turns": [{"text": "hi", "audio": str(AUDIO_FIXTURES / "time_tokyo.wav")}, {"text": "more", "route": False}]},
        {"id": "broken", "turns": ["please fail"]},
    ]})  # fmt: skip
    with pytest.raises(ConfigError, match="scenario 'rec' turn 2 has no audio"):
        AudioRunner(AgentConfig(), s).check_audio()
    runner = AudioRunner(
        AgentConfig(), s, tts_command=f"{sys.executable} {tmp_path / 'tts.py'} {{text}} {{out}}"
    )
    runner.check_audio()
    try:
        segments = await runner.segments(s.scenarios[0])
        assert [routed for _, routed in segments] == [True, False]
        assert all(pcm.dtype == np.float32 and pcm.size > 24000 for pcm, _ in segments)  # > 1 s at 24 kHz
        with pytest.raises(CallerAudioError, match="no voice for that"):
            await runner.segments(s.scenarios[1])
    finally:
        await runner.close()
    missing = Suite.model_validate(
        {"scenarios": [{"id": "m", "turns": [{"text": "x", "audio": "nope.wav"}]}]}
    )
    with pytest.raises(ConfigError, match=r"nope\.wav not found"):
        AudioRunner(AgentConfig(), missing).check_audio()
