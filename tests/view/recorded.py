"""A real recorded call for the viewer tests: a tiny-random agent on CPU, a scripted caller over the in-process
transport (`duetaspan.testing.scripted_call`), the scripted router and ASR servers on loopback. The caller
asks two questions: the first lands a `get_time` span, the second gets no span (the router abstains), so the
record holds words, utterances, `<ret>`s, a landed span and a miss, next to its stereo wav."""

from __future__ import annotations

from pathlib import Path

from duetaspan.agent import Agent
from duetaspan.testing import ScriptedASR, ScriptedLLM, content, scripted_call, tool_call
from duetaspan.testing.plugin import load_tiny_engine

CALL_ID = "CA-view-0001"
HEARD = ["What time is it in Tokyo?", "Thanks, and can you sing me a song?"]
# one reply per router request, in order: a tool call, then nothing to look up
LLM_SCRIPT = {"steps": [tool_call("get_time", place="Tokyo"), content('{"none": true}')]}


async def record_call(record_dir: Path) -> Path:
    """Run the call; returns the path of its consolidated `.json` (the `.wav` sits next to it)."""
    agent = Agent(engine=load_tiny_engine(max_slots=1), max_calls=1, seed=0, record_dir=record_dir)
    llm, asr = ScriptedLLM(LLM_SCRIPT), ScriptedASR()
    async with llm, asr, scripted_call(agent, llm=llm, asr=asr, call_id=CALL_ID) as call:
        for text, phrase in zip(HEARD, ("time_tokyo", "greeting"), strict=True):
            await call.say(phrase, heard=text, seconds=1.5, silence_s=1.5)
            await call.ask()
    return record_dir / f"{CALL_ID}.json"
