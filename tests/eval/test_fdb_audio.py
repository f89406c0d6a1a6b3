"""`duetaspan eval --format fdb-v3` in audio mode on CPU (`tiny-random`, `--force-ret`): a scenario with a
recording in the benchmark's released layout (`<audio-dir>/<id>_<24 hex>/input.wav`, one recording of the
whole caller side) and one without, rendered turn by turn by `--tts-command`; `--export-fdb` then carries the
audio fields the benchmark's scorers read (`asr_chunks`, `user_speech_end_rel`, `audio_agent_speech_start`),
on one clock with the tool calls' timestamps."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from duetaspan.eval.audio import read_wav
from duetaspan.eval.fdb_export import speech_end_s
from duetaspan.model.convention import SAMPLE_RATE
from duetaspan.testing.llm import tool_call
from tests.eval.test_cli_text import run_eval
from tests.fakes.asr_server import ScriptedASRServer
from tests.fakes.llm_server import ScriptedLLMServer
from tests.support import AUDIO_FIXTURES

pytestmark = pytest.mark.slow

HEX = "5eed0f1e2d3c4b5a69788796"
DATA = {
    "benchmark_name": "duetaspan audio sample (FDB-v3 format, written for these tests)",
    "statistics": {"total_scenarios": 2},
    "scenarios": [
        {"id": "ecommerce_05", "domain": "ecommerce_support", "title": "Where is my order", "difficulty": "easy",
         "dialogue": [{"user": "Hello? Hi, who am I speaking with?", "ai": "This is the store's assistant."},
                      {"user": "Where is my order? The number is A B C one two three.", "ai": "It is on its way."}],
         "acting_notes": "Spells the number.", "disfluency_features": [],
         "expected_tool_calls": [{"function": "track_order", "args": {"order_id": "ABC123"}}],
         "num_expected_calls": 1, "state_rollback_test": False, "latency_profile": "instant"},
        {"id": "travel_07", "domain": "travel_identity", "title": "Flights to Tokyo", "difficulty": "easy",
         "dialogue": [{"user": "Hi there.", "ai": "Hello!"},
                      {"user": "Any flights to Tokyo on June 1?", "ai": "Searching flights to Tokyo."}],
         "expected_tool_calls": [{"function": "search_flights", "args": {"destination": "Tokyo", "date": "June 1"}}],
         "num_expected_calls": 1, "state_rollback_test": True,
         "state_rollback_details": {"original_param": {}, "corrected_param": {}}},
    ],
}  # fmt: skip

TTS = f"""
import shutil, sys
shutil.copy({str(AUDIO_FIXTURES / "time_tokyo.wav")!r}, sys.argv[2])
"""

# one forced <ret> per routed turn, one more while a tool keeps running (--jobs 1: file order)
LLM_STEPS = [
    tool_call("track_order", order_id="ABC123"),
    {"content": "NONE"},
    tool_call("search_flights", destination="Tokyo", date="June 1"),
    {"content": "NONE"},
]


async def test_fdb_v3_audio_eval_runs_recordings_and_tts_and_exports_the_audio_fields(tmp_path):
    (tmp_path / "benchmark_data_v2.json").write_text(json.dumps(DATA))
    released = tmp_path / "audio" / f"ecommerce_05_{HEX}"
    released.mkdir(parents=True)
    shutil.copy(AUDIO_FIXTURES / "order_status.wav", released / "input.wav")
    (tmp_path / "tts.py").write_text(TTS)
    llm = ScriptedLLMServer({"steps": LLM_STEPS, "default": {"content": "NONE"}})
    asr = ScriptedASRServer({"default": "a question from the caller"})
    async with llm.serve() as llm_url, asr.serve() as asr_url:
        (tmp_path / "agent.toml").write_text(
            f'[router]\nbase_url = "{llm_url}/v1"\nmodel = "scripted"\napi_key_env = ""\n'
            f'[asr]\nkind = "transcribe"\nurl = "{asr_url}/transcribe"\n[model]\ndevice = "cpu"\n'
        )
        rc, out, err = await run_eval(
            "benchmark_data_v2.json", "--format", "fdb-v3", "--audio-dir", "audio", "--config", "agent.toml",
            "--model", "tiny-random", "--force-ret", "--tts-command", f"{sys.executable} tts.py {{text}} {{out}}",
            "--gap", "1", "--tail", "1", "--report", "report.json", "--export-fdb", "fdb",
            cwd=tmp_path, within_s=400,
        )  # fmt: skip
    assert rc == 0, err[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    rows = {r["id"]: r for r in report["scenarios"]}
    assert set(rows) == {f"ecommerce_05_{HEX}", "travel_07"}  # each recording is a sample of its own
    assert all(r["passed"] for r in rows.values()), [(r["id"], r["reason"]) for r in rows.values()]
    assert "FDB-v3 audio: 1 of 2 scenarios have no recording" in err

    folders = {p.name: p for p in (tmp_path / "fdb").iterdir()}
    assert f"ecommerce_05_{HEX}" in folders and len(folders) == 2  # the released folder name is kept
    (tts_folder,) = [n for n in folders if n.startswith("travel_07_")]
    assert len(tts_folder) == len("travel_07_") + 24
    keys = {"example_id", "actual_tool_calls", "transcript", "asr_chunks", "user_speech_end_rel",
            "audio_agent_speech_start"}  # fmt: skip
    recorded = json.loads((folders[f"ecommerce_05_{HEX}"] / "result_duetaspan.json").read_text())
    rendered = json.loads((folders[tts_folder] / "result_duetaspan.json").read_text())
    assert set(recorded) == keys and set(rendered) == keys
    assert (recorded["example_id"], rendered["example_id"]) == ("ecommerce_05", "travel_07")

    # one clock, from the stream start: the recording starts at 0, so its speech ends where the wav's does
    wav = read_wav(AUDIO_FIXTURES / "order_status.wav")
    assert recorded["user_speech_end_rel"] == speech_end_s(wav, SAMPLE_RATE)
    (call,) = recorded["actual_tool_calls"]
    assert (call["function"], call["args"]) == ("track_order", {"order_id": "ABC123"})
    # the forced <ret> comes 0.7 s after the caller's audio ends: the call is after the speech, within the call
    assert recorded["user_speech_end_rel"] < call["timestamp_start"] <= call["timestamp_end"]
    assert call["timestamp_start"] < wav.size / SAMPLE_RATE + 1 + 1 + 30
    # rendered turns: the greeting, a 1 s gap, then the request; its speech ends after the greeting's audio
    tokyo = read_wav(AUDIO_FIXTURES / "time_tokyo.wav").size / SAMPLE_RATE
    assert tokyo + 1 < rendered["user_speech_end_rel"] <= 2 * tokyo + 1 + 0.5
    assert rendered["actual_tool_calls"][0]["timestamp_start"] > rendered["user_speech_end_rel"]
    for record in (recorded, rendered):
        chunks = record["asr_chunks"]
        for chunk, after in zip(chunks, [*chunks[1:], None], strict=True):  # tiny-random's words, in order
            assert set(chunk) == {"text", "timestamp"} and chunk["text"].strip()
            assert 0 <= chunk["timestamp"][0] <= chunk["timestamp"][1]
            assert after is None or chunk["timestamp"][1] <= after["timestamp"][0]
        start = record["audio_agent_speech_start"]  # the agent's first word (from the request's start on)
        assert start is None or any(c["timestamp"][0] <= start <= c["timestamp"][1] for c in chunks)
    # audio mode reports the scorers' turn-taken means and the *_all ones
    assert report["fdb_v3"]["n"] == 2 and report["fdb_v3"]["tool_selection_acc_all"] == 1.0
    assert "turn-taken" in out and "*_all" in out
    assert report["fdb_v3"]["headline"].startswith("audio mode: the scorers' headline is tool_selection_acc")
