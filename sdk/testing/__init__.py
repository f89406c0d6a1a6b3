"""Test your own agent in pytest: a scripted caller on a real call, scripted LLM and ASR servers, and
assertions that read like the call. The guide is docs/testing.md.

    from duetaspan import Agent, tool
    from duetaspan.testing import scripted_call, tool_call

    @tool(side_effect=True)
    def book_table(people: int, time: str) -> str:
        \"\"\"Book a table tonight. Only when the caller asks to book.\"\"\"
        return f"Booked a table for {people} at {time}."

    async def test_books_a_table(tiny_engine, scripted_llm, scripted_asr):
        scripted_llm.on("book", tool_call("book_table", people=4, time="7 PM"))
        agent = Agent(tools=[book_table], engine=tiny_engine)
        async with scripted_call(agent, llm=scripted_llm, asr=scripted_asr) as call:
            await call.say("Please book a table for four at 7 PM.")
            outcome = await call.ask()
        outcome.expect_tool("book_table", people=4).expect_span(contains="7 PM")

`pip install 'duetaspan[testing]'` brings pytest and pytest-asyncio; the pytest plugin
(`duetaspan.testing.plugin`, registered through the `pytest11` entry point) gives the fixtures `tiny_engine`,
`scripted_llm` and `scripted_asr`. Names are imported lazily: importing this package loads neither torch nor
Pipecat.

Example:
    >>> from duetaspan.testing import tool_call
    >>> tool_call("get_weather", city="Paris")
    {'tool_call': {'name': 'get_weather', 'arguments': {'city': 'Paris'}}}
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "ScriptedLLM": "duetaspan.testing.llm",
    "tool_call": "duetaspan.testing.llm",
    "tool_calls": "duetaspan.testing.llm",
    "content": "duetaspan.testing.llm",
    "error": "duetaspan.testing.llm",
    "hang": "duetaspan.testing.llm",
    "delay": "duetaspan.testing.llm",
    "ScriptedASR": "duetaspan.testing.asr",
    "scripted_call": "duetaspan.testing.call",
    "ScriptedCall": "duetaspan.testing.call",
    "Outcome": "duetaspan.testing.outcome",
    "PHRASES": "duetaspan.testing.audio",
    "router_mode": "duetaspan.testing.judge",
    "free_port": "duetaspan.testing.servers",
    "serve_app": "duetaspan.testing.servers",
    "wait_until": "duetaspan.testing.wait",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'duetaspan.testing' has no attribute {name!r}")


__all__ = sorted(_LAZY)
