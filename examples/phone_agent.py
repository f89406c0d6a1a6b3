"""A phone agent in one file: Luigi's host on your Twilio number. Run: python examples/phone_agent.py"""

import asyncio
import os

from duetaspan import Agent, tool
from duetaspan.adapters.twilio.bridge import AGENT_IN_RATE, agent_call_handler
from duetaspan.adapters.twilio.rest import TwilioCredentials
from duetaspan.adapters.twilio.service import TwilioService, TwilioSettings
from duetaspan.server import create_app, mount, serve


@tool
def opening_hours(day: str) -> str:
    """When Luigi's is open.

    Args:
        day: weekday name, e.g. "Monday"
    """
    return "closed" if day.lower() == "monday" else "noon to 10 PM"


agent = Agent(
    persona="You are Ada, the friendly host of Luigi's restaurant.",
    tools=[opening_hours],
    builtins=["get_time", "end_call"],
    router={"base_url": "https://api.openai.com/v1", "model": "gpt-4.1-mini"},
    model=os.environ.get("DUETASPAN_MODEL", "duetaspan-7b"),
    record_dir="calls",
)


async def main() -> None:
    settings = TwilioSettings(public_url=os.environ["PUBLIC_URL"], credentials=TwilioCredentials.from_env())
    twilio = TwilioService(
        settings, agent_call_handler(agent), max_calls=lambda: agent.max_calls, in_rate=AGENT_IN_RATE
    )
    app = create_app()
    mount(app, twilio, "twilio")
    async with agent:
        await serve(app, host="0.0.0.0", port=int(os.environ.get("PORT", "8080")))


if __name__ == "__main__":
    asyncio.run(main())
