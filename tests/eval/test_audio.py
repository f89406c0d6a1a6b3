"""`duetaspan eval` in audio mode end to end on CPU: the real command plays a recorded caller turn and a
turn rendered by a TTS command into the full agent on `tiny-random` (VAD question capture, the scripted ASR
server, the router on a scripted LLM, mock tools, Context Spans into the model, its text stream). `--force-ret`
makes the harness ask where a trained model would; the report scores what the agent's tools received."""

from __future__ import annotations

import json
import sys

import pytest

from duetaspan.testing import tool_call
from tests.eval.test_cli_text import run_eval
from tests.fakes.asr_server import ScriptedASRServer
from tests.fakes.llm_server import ScriptedLLMServer
from tests.support import AUDIO_FIXTURES

pytestmark = pytest.mark.slow

SUITE = f"""
tools:
  - name: get_weather
    parameters: {{city: string}}
    result: {{forecast: sunny}}
  - name: get_time
    parameters: {{city: string}}
    result: {{time: "9:05 PM"}}
scenarios:
  - id: weather_recorded
    turns: [{{text: "Hi, what's the weather like in Sydney right now?", audio: {AUDIO_FIXTURES / "weather_sydney.wav"}}}]
    expected_calls: [{{tool: get_weather, args: {{city: Sydney}}}}]
  - id: time_rendered
    turns: ["What time is it in Tokyo at the moment?"]
    expected_calls: [{{tool: get_time, args: {{city: Tokyo}}}}]
  - id: router_down
    turns: [{{text: "Where is my order?", audio: {AUDIO_FIXTURES / "order_status.wav"}}}]
    expected_calls: [{{tool: get_time, args: {{city: Tokyo}}}}]
"""

TTS = f"""
import shutil, sys
from pathlib import Path
text, out = sys.argv[1], sys.argv[2]
Path("tts.log").open("a").write(text + "\\n")
shutil.copy({str(AUDIO_FIXTURES / "time_tokyo.wav")!r}, out)
"""

# one forced <ret> per turn, then one more while a tool keeps running: tool, NONE per scenario (in file
# order: --jobs 1)
LLM_STEPS = [
    tool_call("get_weather", city="Sydney"),
    {"content": "NONE"},
    tool_call("get_time", city="Kyoto"),  # the wrong city: this scenario must fail on its argument
    {"content": "NONE"},
    {"status": 500},  # the router's LLM fails: recorded for that scenario, the run goes on
]


async def test_audio_eval_on_tiny_random_plays_calls_into_the_full_agent(tmp_path):
    (tmp_path / "suite.yaml").write_text(SUITE)
    (tmp_path / "tts.py").write_text(TTS)
    llm = ScriptedLLMServer({"steps": LLM_STEPS, "default": {"content": "NONE"}})
    asr = ScriptedASRServer({"default": "a question from the caller"})
    async with llm.serve() as llm_url, asr.serve() as asr_url:
        (tmp_path / "agent.toml").write_text(
            f'[router]\nbase_url = "{llm_url}/v1"\nmodel = "scripted"\napi_key_env = ""\n'
            f'[asr]\nkind = "transcribe"\nurl = "{asr_url}/transcribe"\n[model]\ndevice = "cpu"\n'
        )
        rc, _, err = await run_eval(
            "suite.yaml", "--config", "agent.toml", "--model", "tiny-random", "--force-ret",
            "--tts-command", f"{sys.executable} tts.py {{text}} {{out}}", "--gap", "1", "--tail", "1",
            "--report", "report.json", "--html", "report.html",
            cwd=tmp_path, within_s=400,
        )  # fmt: skip
    assert rc == 0, err[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    rows = {r["id"]: r for r in report["scenarios"]}
    assert report["mode"] == "audio" and report["settings"]["model"] == "tiny-random"
    weather, tokyo = rows["weather_recorded"], rows["time_rendered"]
    assert weather["passed"], (weather["reason"], weather["trace"])
    assert [(c["tool"], c["args"]) for c in weather["actual_calls"]] == [("get_weather", {"city": "Sydney"})]
    assert not tokyo["passed"] and tokyo["argument_accuracy"] == 0.0 and tokyo["tool_selection"]["f1"] == 1.0
    down = rows["router_down"]
    assert not down["passed"] and down["actual_calls"] == [] and "HTTP 500" in down["error"]
    assert down["error"].startswith("retrieval failed at router")
    assert report["pass_at_1"] == pytest.approx(1 / 3, abs=1e-4) and report["errors"] == 1
    # the TTS command rendered the text turn; the ASR heard both calls' audio
    assert (tmp_path / "tts.log").read_text().splitlines() == ["What time is it in Tokyo at the moment?"]
    assert len(asr.requests) >= 3 and all(r["seconds"] > 0.3 for r in asr.requests)
    # the retrieval went the live way: <ret>, the question from the ASR, the tool, a span into the model
    kinds = [e["kind"] for e in weather["trace"]]
    for kind in ("ret", "question", "router", "tool", "reference", "delivered"):
        assert kind in kinds, kinds
    question = next(e for e in weather["trace"] if e["kind"] == "question")
    assert question["text"] == "a question from the caller"
    # the call's time: the tool ran after the caller's turn ended (forced <ret> 0.7 s later)
    assert weather["latency_s"] is not None and 0.5 < weather["latency_s"] < 10
    assert isinstance(weather["answer"], str)  # tiny-random's text stream (random words)
    assert "time_rendered" in (tmp_path / "report.html").read_text()
