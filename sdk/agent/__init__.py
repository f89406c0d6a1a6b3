"""`Agent`: what a user writes. It owns what all calls share (the engine and its runner, the tool registry,
MCP connections, router clients) and makes one `CallSession` per call for the transports.

Example (a phone agent with two custom tools, answering a Twilio number):

    from duetaspan import Agent, CallInfo, tool

    @tool
    def opening_hours(day: str) -> str:
        '''When the restaurant is open.

        Args:
            day: weekday name, e.g. "Monday"
        '''
        return "closed" if day.lower() == "monday" else "noon to 10 PM"

    @tool(side_effect=True, redact=["phone"])
    async def book_table(people: int, time: str, phone: str) -> str:
        '''Book a table.

        Args:
            people: party size
            time: e.g. "7 PM"
            phone: the caller's phone number for the confirmation
        '''
        return f"Booked a table for {people} at {time}."

    agent = Agent(
        persona="You are Ada, the friendly host of Luigi's restaurant.",
        voice="main",
        tools=[opening_hours, book_table],
        router={"base_url": "http://localhost:8000/v1", "model": "qwen3-8b"},
        record_dir="calls",
    )

    if __name__ == "__main__":
        agent.run(twilio=True, public_url="https://agent.example.com", host="0.0.0.0", port=8080)

`agent.run(...)` is `asyncio.run(agent.serve(...))`, the same server as `duetaspan serve --twilio` (Twilio
credentials from `TWILIO_ACCOUNT_SID` / `TWILIO_AUTH_TOKEN`). Or from a file:
`Agent.from_config("agent.toml")`. Your own transport instead of `serve`:

    async def main(transport):
        async with agent:
            await agent.create_session(CallInfo("call-1"), transport).run()
"""

from __future__ import annotations

from duetaspan.agent.calls import AgentNotStarted
from duetaspan.agent.core import Agent, RetrievalBuilder
from duetaspan.agent.engine import DEFAULT_MODEL
from duetaspan.pipeline.runner import EngineFull
from duetaspan.pipeline.session import CallInfo, CallSession

__all__ = [
    "DEFAULT_MODEL",
    "Agent",
    "AgentNotStarted",
    "CallInfo",
    "CallSession",
    "EngineFull",
    "RetrievalBuilder",
]
