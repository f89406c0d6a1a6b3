"""A real recorded call for the viewer tests: a tiny-random agent on CPU, a scripted caller over the in-process
transport, the scripted router and ASR servers on loopback. The caller asks two questions: the first lands a
`get_time` span, the second gets no span (the router abstains), so the record holds words, utterances,
`<ret>`s, a landed span and a miss, next to its stereo wav."""

from __future__ import annotations

from pathlib import Path

from duetaspan.agent import Agent
from duetaspan.model.engine import DuplexEngine, SamplingParams
from duetaspan.pipeline.session import CallInfo
from examples.testing import LoopbackCaller, run_loopback_call, tool_call
from tests.fakes.asr_server import ScriptedASRServer
from tests.fakes.llm_server import ScriptedLLMServer

CALL_ID = "CA-view-0001"
HEARD = ["What time is it in Tokyo?", "Thanks, and can you sing me a song?"]
# one reply per router request, in order: a tool call, then nothing to look up
LLM_SCRIPT = {"steps": [tool_call("get_time", place="Tokyo"), {"content": '{"none": true}'}]}


async def record_call(record_dir: Path) -> Path:
    """Run the call; returns the path of its consolidated `.json` (the `.wav` sits next to it)."""
    engine = DuplexEngine.load(
        "tiny-random", device="cpu", max_slots=1, seed=0, sampling=SamplingParams(allow_ret=False)
    )
    llm, asr = ScriptedLLMServer(LLM_SCRIPT), ScriptedASRServer()

    async def caller(c: LoopbackCaller) -> None:
        for text, phrase in zip(HEARD, ("time_tokyo", "greeting"), strict=True):
            asr.default = text
            await c.say(phrase, seconds=1.5, silence_s=1.5)
            await c.ask()

    async with llm.serve() as llm_url, asr.serve() as asr_url:
        agent = Agent(
            engine=engine,
            max_calls=1,
            seed=0,
            router={"base_url": f"{llm_url}/v1", "model": "scripted", "api_key_env": None},
            asr={"kind": "transcribe", "url": f"{asr_url}/transcribe"},
            record_dir=record_dir,
        )
        async with agent:
            await run_loopback_call(agent, CallInfo(CALL_ID, caller="+15550001111"), caller)
    return record_dir / f"{CALL_ID}.json"
