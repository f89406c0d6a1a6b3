"""Full-Duplex-Bench v3 as published, and its scorers' numbers. The fixture
(tests/fixtures/fdb_v3/benchmark_sample.json, written for these tests in the benchmark's format) carries every
field the published file does: header statistics, `user_annotated`, `acting_notes`, a conditional call's
`note`, `state_rollback_details`, numbers and booleans where the tool schema says string, an expected argument
the schema does not declare, a `$RESULT_0...` reference, `num_expected_calls`, `latency_profile`.

The real command runs it in text mode against a scripted loopback LLM whose answers are known, exports
`--export-fdb DIR`, and every number of the benchmark's scorers (exact rule) is computed by hand below."""

from __future__ import annotations

import json
import os
import re

import pytest

from duetaspan.errors import ConfigError
from duetaspan.eval.fdb_export import asr_chunks, official_summary, sample_folder, speech_end_s
from duetaspan.eval.fdb_v3 import fdb_v3_suite, load_fdb_v3
from duetaspan.testing.llm import tool_call
from tests.eval.test_cli_text import ALREADY, NONE, run_eval
from tests.fakes.llm_server import ScriptedLLMServer
from tests.support import AUDIO_FIXTURES, REPO_ROOT

SAMPLE = REPO_ROOT / "tests" / "fixtures" / "fdb_v3" / "benchmark_sample.json"
FOLDER = re.compile(r"^(?P<id>[a-z]+_\d\d)_[0-9a-f]{24}$")


def test_the_published_format_loads_keeping_what_it_does_not_use_and_saying_what_it_cannot_honour(caplog):
    suite = load_fdb_v3(SAMPLE)
    assert len(suite.scenarios) == 9 and suite.format == "fdb-v3" and len(suite.tools) == 12
    assert suite.meta["statistics"]["total_scenarios"] == 9 and suite.meta["version"] == "2.0"
    assert "generated_at" in suite.meta and suite.name.startswith("duetaspan FDB-v3-format sample")
    s = {x.id: x for x in suite.scenarios}
    # what we use: the routed request, the context turn with its scripted reply, calls, self-correction
    travel = s["travel_01"]
    assert [(t.route, t.agent) for t in travel.turns] == [(False, "Hi! What can I do for you?"), (True, None)]
    assert travel.tags == ["FILLER", "PAUSE"] and not travel.self_correction
    # what we do not use is kept in meta, as published
    corrected = s["finance_01"]
    assert corrected.self_correction and corrected.splits == ["single-call", "self-correction"]
    assert corrected.meta["state_rollback_details"] == {
        "original_param": {"amount": 200}, "corrected_param": {"amount": 250}
    }  # fmt: skip
    assert corrected.meta["acting_notes"] == "Changes the amount mid-sentence."
    assert corrected.meta["latency_profile"] == "normal" and corrected.meta["num_expected_calls"] == 1
    assert corrected.meta["user_annotated"][1].startswith("Convert 200 euros, [SELF_CORRECTION]")
    assert corrected.meta["example_id"] == "finance_01"
    booking = s["travel_02"].expected_calls[1]
    assert (booking.tool, booking.note) == ("book_flight", "Only if the flight is under $300")
    assert s["housing_02"].expected_calls[1].args == {"filter_name": "pets_allowed", "value": True}
    # one warning line per kind of thing we cannot honour, naming where
    assert len(suite.warnings) == 4 and all("\n" not in w for w in suite.warnings)
    note, undeclared, mistyped, reference = suite.warnings
    assert "condition `note`" in note and "travel_02 book_flight" in note and "unconditionally" in note
    assert "search_apartments.pets_allowed" in undeclared and "the mock tools drop them" in undeclared
    assert "update_search_filter.value=1800 (schema: string)" in mistyped and "value=true" in mistyped
    assert "ecommerce_01: add_to_cart.product_id" in reference and "any value is accepted" in reference
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == suite.warnings


def _item(**over):
    base = {"id": "x_01", "dialogue": [{"user": "Hi.", "ai": "Hello."}, {"user": "Track order A1."}],
            "expected_tool_calls": [{"function": "track_order", "args": {"order_id": "A1"}}]}  # fmt: skip
    return {**base, **over}


def test_what_we_use_is_validated_with_a_clear_error_and_odd_extras_are_kept():
    for bad, message in [
        ({"id": None}, r"scenarios\[0\] has no `id`"),
        ({"dialogue": []}, r"'x_01': `dialogue` must be a non-empty list"),
        ({"dialogue": [{"ai": "hm"}]}, r"dialogue\[0\] must be an object with a `user` line"),
        ({"dialogue": [{"user": {"text": "hi"}}]}, r"dialogue\[0\].user must be text"),
        ({"expected_tool_calls": [{"args": {}}]}, r"expected_tool_calls\[0\] has no `function` name"),
        ({"expected_tool_calls": [{"function": "track_order", "args": ["A1"]}]}, r"`args` must be an object"),
        ({"state_rollback_test": "yes"}, r"`state_rollback_test` must be true or false"),
    ]:
        with pytest.raises(ConfigError, match=message):
            fdb_v3_suite({"scenarios": [_item(**bad)]})
    with pytest.raises(ConfigError, match="scenario id 'x_01' is used twice"):
        fdb_v3_suite({"scenarios": [_item(), _item()]})
    odd = fdb_v3_suite({"statistics": {"total_scenarios": 100}, "scenarios": [_item(
        expected_tool_calls=[
            {"function": "search_products", "args": {"query": "mug"}, "weight": 2},
            {"function": "add_to_cart", "args": {"product_id": "$RESULT_3.id", "quantity": 1}},
            {"function": "cancel_order", "args": {"order_id": "A1"}},
        ], num_expected_calls=2)]})  # fmt: skip
    (only,) = odd.scenarios
    assert only.meta["expected_call_fields"] == [{"weight": 2}, {}, {}]
    text = "\n".join(odd.warnings)
    assert "x_01 search_products: weight" in text and "kept in the scenario's meta" in text
    assert 'add_to_cart.product_id="$RESULT_3.id"' in text  # not an earlier call's result
    assert "x_01: cancel_order" in text and "can never be called" in text
    assert "x_01: 2 for 3" in text and "statistics count 100 scenarios, the file has 1" in text


def _row(sid, expected, actual, answer="", stream=None):
    return {"id": sid, "example_id": sid, "answer": answer, "stream": stream,
            "expected_calls": [{"tool": n, "args": a} for n, a in expected],
            "actual_calls": [{"tool": n, "args": a, "t": 1.0, "t_end": 1.1} for n, a in actual]}  # fmt: skip


def test_the_scorers_numbers_by_hand():
    flights = [("search_flights", {"destination": "London", "date": "August 20"}),
               ("book_flight", {"passenger_name": "Alice"})]  # fmt: skip
    rows = [
        # a: both calls, strings normalised ("LONDON ", "alice") -> F1 1, args 1, pass
        _row(
            "a",
            flights,
            [
                ("search_flights", {"destination": "LONDON ", "date": "august_20"}),
                ("book_flight", {"passenger_name": "alice"}),
            ],
            "Booked.",
        ),
        # b: the date differs -> F1 1, args 1/2 = 0.5, fail
        _row(
            "b",
            flights,
            [
                ("search_flights", {"destination": "London", "date": "2026-08-20"}),
                ("book_flight", {"passenger_name": "Alice"}),
            ],
            "Booked.",
        ),
        # c: one call twice, the other missing -> P 1/2, R 1/2, F1 0.5; FIFO: search ok, book missing: 0.5
        _row("c", flights, [flights[0], flights[0]], "Searching."),
        # d: an extra call -> P 2/3, R 1, F1 0.8; args 1 (extra calls do not lower it); fail
        _row("d", flights, [*flights, ("track_order", {"order_id": "Z"})], "Done."),
        # e: "500" is not 500, 500.0 is; True is true -> args 1/2 (two expected calls of the same tool, FIFO)
        _row(
            "e",
            [("update_search_filter", {"value": 500}), ("update_search_filter", {"value": True})],
            [("update_search_filter", {"value": "500"}), ("update_search_filter", {"value": True})],
        ),
        # f: a reference accepts any value but its key must be there -> args 0; F1 1
        _row(
            "f",
            [("add_to_cart", {"product_id": "$RESULT_0.products[0].product_id"})],
            [("add_to_cart", {"quantity": 1})],
            "Added.",
        ),
        # g: nothing expected, nothing called -> F1 1, args 1, pass (a silent agent)
        _row("g", [], []),
        # h: nothing expected, one call -> P 0, R 1: F1 0; args 1.0 (nothing expected); fail
        _row("h", [], [("track_order", {"order_id": "Q"})], "Tracking."),
        # i: expected, nothing called -> R 0, P 1: F1 0; args 0; fail
        _row("i", [("track_order", {"order_id": "Q"})], [], "Sorry."),
        # j: 500 == 500.0 -> pass
        _row(
            "j", [("get_exchange_rate", {"amount": 500})], [("get_exchange_rate", {"amount": 500.0})], "OK."
        ),
    ]
    s = official_summary(rows)
    f1 = [1, 1, 0.5, 0.8, 1, 1, 1, 0, 0, 1]
    acc = [1, 0.5, 0.5, 1, 0.5, 0, 1, 1, 0, 1]
    assert s["n"] == 10 and s["passed"] == 3  # a, g, j
    assert s["tool_selection_acc_all"] == round(sum(f1) / 10, 3) == 0.73  # 7.3 / 10
    assert s["argument_acc_all"] == round(sum(acc) / 10, 3) == 0.65  # 6.5 / 10
    assert s["overall_pass_rate"] == 0.3
    # turn-taken: a non-empty transcript (e and g have none) -> 8 samples
    taken = [i for i in range(10) if i not in (4, 6)]
    assert s["turn_taken"] == 8 and s["turn_take_rate"] == 0.8
    assert s["tool_selection_acc"] == round(sum(f1[i] for i in taken) / 8, 3) == 0.662  # 5.3 / 8 = 0.6625
    assert s["argument_acc"] == round(sum(acc[i] for i in taken) / 8, 3) == 0.625  # 5.0 / 8
    # per-sample rounding to 3 digits, as the scorers do: F1 2/3 counts as 0.667
    third = official_summary([_row("k", flights, [flights[0]], "x")] * 3)
    assert third["tool_selection_acc_all"] == 0.667 and third["argument_acc_all"] == 0.5
    # where it shows: F1 2/9 (4 expected, 5 called, 1 matched: P 1/5, R 1/4) twice and 4/7 (4 expected, 3
    # called, 2 matched: P 2/3, R 1/2). Exact mean (4/9 + 4/7) / 3 = 64/189 = 0.33862 -> 0.339; the scorers
    # round each first: (0.222 + 0.222 + 0.571) / 3 = 0.33833 -> 0.338
    four = [("t1", {}), ("t2", {}), ("t3", {}), ("t4", {})]
    low = _row("m", four, [("t1", {}), *[("x", {})] * 4], "x")
    mid = _row("o", four, [("t1", {}), ("t2", {}), ("y", {})], "x")
    assert official_summary([low, low, mid])["tool_selection_acc_all"] == 0.338
    # audio: ASR chunks make a sample turn-taken; latency = agent start - user end, negative = interruption
    audio = [
        _row("p", [], [], stream={"asr_chunks": [{"text": "hi", "timestamp": [3.0, 3.2]}],
                                  "user_speech_end_rel": 2.0, "audio_agent_speech_start": 3.0}),
        _row("q", [], [], stream={"asr_chunks": [{"text": "hm", "timestamp": [1.0, 1.1]}],
                                  "user_speech_end_rel": 2.0, "audio_agent_speech_start": 1.0}),
        _row("r", [], [], stream={"asr_chunks": [], "user_speech_end_rel": 2.0,
                                  "audio_agent_speech_start": None}),
    ]  # fmt: skip
    a = official_summary(audio)
    assert (a["turn_taken"], a["interruption_rate"], a["avg_response_latency_s"]) == (2, 0.5, 1.0)
    assert a["tool_selection_acc"] == 1.0 and a["overall_pass_rate"] == 1.0


def test_sample_folders_are_the_released_ones_or_a_stable_digest():
    hex24 = "0123456789abcdef01234567"
    assert sample_folder("travel_09", f"travel_09_{hex24}", "x") == f"travel_09_{hex24}"
    a = sample_folder("travel_09", "travel_09_speaker3", "audio-bytes")
    assert FOLDER.match(a) and a == sample_folder("travel_09", None, "audio-bytes")
    assert a != sample_folder("travel_09", None, "other-bytes") != sample_folder("travel_10", None, "text")


def test_the_users_speech_ends_before_the_first_long_silence():
    import numpy as np

    rate = 24_000
    pcm = np.zeros(rate * 8, np.float32)
    pcm[rate * 1 : rate * 2] = 0.2  # 1-2 s: the greeting
    pcm[int(rate * 2.5) : rate * 3] = 0.2  # a 0.5 s pause, then more: 3 s is the end of the first stretch
    pcm[rate * 6 : rate * 7] = 0.2  # after a 3 s gap
    assert speech_end_s(pcm, rate) == 3.0
    assert speech_end_s(pcm, rate, gap_s=5.0) == 7.0  # no gap that long: the last word's end
    assert speech_end_s(np.zeros(rate, np.float32), rate) is None


SCRIPT = {
    "rules": [  # first match wins, against the router's whole user message (context + question)
        {"match": [ALREADY, "add_to_cart("], "reply": NONE},
        {"match": [ALREADY, "search_products("], "reply": tool_call("add_to_cart", product_id="PROD1", quantity=1)},
        {"match": [ALREADY, 'track_order({"order_id": "K55"})'], "reply": NONE},
        {"match": [ALREADY, "track_order("], "reply": tool_call("track_order", order_id="K55")},  # an extra call
        {"match": ALREADY, "reply": NONE},
        {"match": "lisbon", "reply": tool_call("search_flights", destination="lisbon", date="March 3")},
        {"match": "oslo", "reply": tool_call("search_flights", destination="Oslo", date="May 9")},  # no booking
        {"match": "platinum", "reply": tool_call("get_card_benefits", card_type="Platinum")},
        {"match": "250 euros", "reply": tool_call("get_exchange_rate", amount=200, from_currency="EUR",
                                                  to_currency="USD")},  # misses the correction
        {"match": "austin", "reply": tool_call("search_apartments", city="Austin", bedrooms=2, max_price=2000.0,
                                               pets_allowed=True)},  # dropped: not in the signature
        {"match": "yoga mat", "reply": tool_call("search_products", query="Yoga_Mat", max_price=40.0)},
        {"match": "k-55", "reply": tool_call("track_order", order_id="K-55")},
    ],
    "default": NONE,  # finance_02 (nothing to do) and housing_02 (the router calls nothing)
}  # fmt: skip

# per sample, in file order: (tool-selection F1 as the scorers round it, argument accuracy, pass, turn taken)
BY_HAND = {
    "travel_01": (1.0, 1.0, True, True),  # "lisbon" == "Lisbon"
    "travel_02": (0.667, 0.5, False, True),  # the conditional booking was not made: R 1/2, P 1; 1 of 2 args
    "finance_03": (1.0, 1.0, True, True),  # "Platinum" == "platinum"
    "finance_01": (1.0, 0.0, False, True),  # amount 200, expected 250 (the correction)
    "finance_02": (1.0, 1.0, True, False),  # nothing expected, nothing called, nothing said
    "housing_01": (1.0, 0.0, False, True),  # pets_allowed: not in the signature, dropped by the tool
    "housing_02": (0.0, 0.0, False, False),  # two expected, none called: R 0, P 1 -> F1 0
    "ecommerce_01": (1.0, 1.0, True, True),  # "Yoga_Mat" == "yoga mat", 40.0 == 40, $RESULT_0 present
    "ecommerce_02": (0.667, 1.0, False, True),  # track_order twice: P 1/2, R 1; FIFO takes the right one
}
# tool_selection_acc_all = (1 + .667 + 1 + 1 + 1 + 1 + 0 + 1 + .667) / 9 = 7.334 / 9 = 0.8149 -> 0.815
# argument_acc_all       = (1 + .5 + 1 + 0 + 1 + 0 + 0 + 1 + 1) / 9      = 5.5 / 9   = 0.6111 -> 0.611
# pass rate              = 4 / 9 = 0.444 (travel_01, finance_03, finance_02, ecommerce_01)
# turn-taken (7: all but finance_02, housing_02): F1 6.334 / 7 = 0.9049 -> 0.905, args 4.5 / 7 = 0.6429 -> 0.643
OFFICIAL = {"n": 9, "turn_taken": 7, "turn_take_rate": 0.778, "tool_selection_acc_all": 0.815,
            "argument_acc_all": 0.611, "overall_pass_rate": 0.444, "passed": 4, "tool_selection_acc": 0.905,
            "argument_acc": 0.643}  # fmt: skip


async def test_text_eval_of_the_published_format_exports_the_scorers_layout_and_numbers(tmp_path):
    (tmp_path / "benchmark_data_v2.json").write_text(SAMPLE.read_text())
    llm = ScriptedLLMServer(SCRIPT)
    args = ("benchmark_data_v2.json", "--format", "fdb-v3", "--text", "--router-base-url", None,
            "--router-model", "scripted", "--report", "report.json", "--export-fdb", "fdb", "--jobs", "3")  # fmt: skip
    async with llm.serve() as url:
        argv = [url + "/v1" if a is None else a for a in args]
        rc, out, err = await run_eval(*argv, cwd=tmp_path)
        assert rc == 0, err
        report = json.loads((tmp_path / "report.json").read_text())
        first = sorted(p.relative_to(tmp_path) for p in (tmp_path / "fdb").rglob("*"))
        rc, _, err = await run_eval(*argv, "--provider", "other_prov", cwd=tmp_path)  # the same run again
        assert rc == 0, err
    assert "FDB-v3 data: 1 expected calls carry a condition `note`" in err  # the loader's warnings
    rows = {r["id"]: r for r in report["scenarios"]}
    assert rows["travel_02"]["expected_calls"][1]["note"] == "Only if the flight is under $300"
    assert rows["finance_01"]["meta"]["state_rollback_details"]["corrected_param"] == {"amount": 250}
    for sid, (f1, acc, passed, _) in BY_HAND.items():
        row = rows[sid]
        assert (round(row["tool_selection"]["f1"], 3), row["argument_accuracy"], row["passed"]) == (
            f1, acc, passed), (sid, row["reason"], row["actual_calls"])  # fmt: skip
    assert {k: report["fdb_v3"][k] for k in OFFICIAL} == OFFICIAL
    assert report["fdb_v3"]["headline"].startswith("text mode: pass_at_1, tool_selection_f1 and argument_accuracy "
                                                    "are the scorers' *_all means")  # fmt: skip
    # our headline numbers (text mode) are the scorers' *_all means, at 4 digits and without their
    # per-sample rounding: F1 (6 + 2 * 2/3) / 9 = 0.81481 over the 9 samples
    assert report["tool_selection_f1"] == pytest.approx((6 + 2 * 2 / 3) / 9, abs=1e-4)
    assert round(report["tool_selection_f1"], 3) == OFFICIAL["tool_selection_acc_all"]
    assert report["argument_accuracy"] == pytest.approx(5.5 / 9, abs=1e-4)
    assert report["pass_at_1"] == pytest.approx(4 / 9, abs=1e-4)
    assert (
        "all 9 samples (*_all): tool_selection_acc_all 0.815  argument_acc_all 0.611  pass rate 0.444" in out
    )
    assert "text mode: the table's numbers are these *_all means" in out

    # the layout, exactly: DIR/<example_id>_<24 hex>/result_<provider>.json, one folder per sample
    folders = sorted(p for p in (tmp_path / "fdb").iterdir())
    assert len(folders) == 9 and all(FOLDER.match(p.name) for p in folders)
    assert sorted(FOLDER.match(p.name)["id"] for p in folders) == sorted(BY_HAND)
    assert first == sorted([p.relative_to(tmp_path) for p in folders] + [
        (p / "result_duetaspan.json").relative_to(tmp_path) for p in folders])  # fmt: skip
    # the re-export wrote into the same folders (deterministic names), a second provider beside the first
    assert all(sorted(q.name for q in p.iterdir()) == ["result_duetaspan.json", "result_other_prov.json"]
               for p in folders)  # fmt: skip
    records = {}
    for p in folders:
        record = json.loads((p / "result_duetaspan.json").read_text())
        assert set(record) == {"example_id", "actual_tool_calls", "transcript"}  # text mode: no audio fields
        assert p.name.startswith(record["example_id"] + "_")
        for call in record["actual_tool_calls"]:
            assert set(call) == {"function", "args", "timestamp_start", "timestamp_end"}
            assert 0 <= call["timestamp_start"] <= call["timestamp_end"] < 60
        records[record["example_id"]] = record
    chain = records["ecommerce_01"]["actual_tool_calls"]
    assert [(c["function"], c["args"]) for c in chain] == [
        ("search_products", {"query": "Yoga_Mat", "max_price": 40.0}),
        ("add_to_cart", {"product_id": "PROD1", "quantity": 1}),
    ]
    assert chain[0]["timestamp_end"] <= chain[1]["timestamp_start"]
    assert records["finance_02"] == {"example_id": "finance_02", "actual_tool_calls": [], "transcript": ""}
    assert "Out for delivery" in records["ecommerce_02"]["transcript"]  # the reference lines, in text mode
    # as with the benchmark's agent, an argument outside the tool's signature never reaches the tool
    assert records["housing_01"]["actual_tool_calls"][0]["args"] == {"city": "Austin", "bedrooms": 2,
                                                                      "max_price": 2000.0}  # fmt: skip
    for sid, (*_, taken) in BY_HAND.items():
        assert bool(records[sid]["transcript"].strip()) == taken, sid


async def test_export_flags_are_checked_before_the_run(tmp_path):
    (tmp_path / "b.json").write_text(SAMPLE.read_text())
    rc, _, err = await run_eval("b.json", "--format", "fdb-v3", "--text", "--export-fdb", "x", "--provider",
                                "../evil", cwd=tmp_path)  # fmt: skip
    assert rc == 1 and "--provider '../evil': use letters, digits" in err
    (tmp_path / "file").write_text("")
    rc, _, err = await run_eval(
        "b.json", "--format", "fdb-v3", "--text", "--export-fdb", "file", cwd=tmp_path
    )
    assert rc == 1 and "--export-fdb file: exists and is not a folder" in err
    assert "x" not in os.listdir(tmp_path)  # nothing written


def test_the_agents_text_stream_becomes_asr_chunks_one_per_word():
    pieces = [(1.0, " Hel"), (1.03, "lo"), (1.06, " there"), (1.3, " "), (1.5, "ok"), (1.52, "ay.")]
    assert asr_chunks(pieces, frame_s=0.08) == [
        {"text": "Hello", "timestamp": [1.0, 1.06]},  # one frame after "lo" would overlap "there": cut there
        {"text": "there", "timestamp": [1.06, 1.14]},
        {"text": "okay.", "timestamp": [1.5, 1.6]},  # a piece without a space continues the word
    ]
    assert asr_chunks([], frame_s=0.08) == [] and asr_chunks([(0.5, "  ")], frame_s=0.08) == []


async def test_fdb_audio_dir_problems_are_errors_before_any_model_loads(tmp_path):
    (tmp_path / "b.json").write_text(SAMPLE.read_text())
    rc, _, err = await run_eval("b.json", "--format", "fdb-v3", "--audio-dir", "nowhere", cwd=tmp_path)
    assert rc == 1 and "--audio-dir nowhere: no such folder" in err
    (tmp_path / "empty").mkdir()
    rc, _, err = await run_eval("b.json", "--format", "fdb-v3", "--audio-dir", "empty", cwd=tmp_path)
    assert rc == 1 and "--audio-dir empty: no <id>_<speaker>/input.wav recordings" in err
    assert "FDB-v3 audio: 9 of 9 scenarios have no recording in empty" in err  # the warning said why


def test_our_own_format_exports_too_with_folders_named_by_the_recording(tmp_path):
    from duetaspan.eval.fdb_export import write_export
    from duetaspan.eval.scenario import load_suite

    (tmp_path / "a.wav").write_bytes((AUDIO_FIXTURES / "weather_sydney.wav").read_bytes())
    (tmp_path / "suite.yaml").write_text(
        "scenarios:\n"
        "  - {id: recorded, turns: [{text: hi, audio: a.wav}], expected_calls: [{tool: t, args: {x: 1}}]}\n"
        '  - {id: rendered, turns: ["What time is it?"]}\n'
    )
    suite = load_suite(tmp_path / "suite.yaml")
    call = {"tool": "t", "args": {"x": 1}, "t": 1.25, "t_end": 1.5}
    stream = {"asr_chunks": [{"text": "Sunny", "timestamp": [2.0, 2.4]}], "user_speech_end_rel": 1.1,
              "audio_agent_speech_start": 2.0}  # fmt: skip
    report = {"mode": "audio", "scenarios": [
        {"id": "recorded", "example_id": "recorded", "actual_calls": [call], "answer": "Sunny", "stream": stream},
        {"id": "rendered", "example_id": "rendered", "actual_calls": [], "answer": "", "stream": {}},
    ]}  # fmt: skip
    files = write_export(suite, report, tmp_path / "out", provider="mine")
    assert [f.name for f in files] == ["result_mine.json", "result_mine.json"]
    recorded, rendered = (json.loads(f.read_text()) for f in files)
    assert recorded == {"example_id": "recorded", "transcript": "Sunny", **stream, "actual_tool_calls": [
        {"function": "t", "args": {"x": 1}, "timestamp_start": 1.25, "timestamp_end": 1.5}]}  # fmt: skip
    assert rendered["asr_chunks"] == [] and rendered["audio_agent_speech_start"] is None
    # the folder follows the recording's bytes: a different recording is a different sample, the same one
    # (another run, another machine) the same folder
    again = write_export(suite, report, tmp_path / "out", provider="mine")
    assert again == files
    (tmp_path / "a.wav").write_bytes((AUDIO_FIXTURES / "time_tokyo.wav").read_bytes())
    moved = write_export(load_suite(tmp_path / "suite.yaml"), report, tmp_path / "out", provider="mine")
    assert moved[0].parent != files[0].parent and moved[1] == files[1]
