"""A phone agent in one file: Luigi's host on your Twilio number. Run: python examples/phone_agent.py"""

import os

from duetaspan import Agent, tool


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

if __name__ == "__main__":
    # Twilio credentials from TWILIO_ACCOUNT_SID / TWILIO_AUTH_TOKEN; PUBLIC_URL is e.g. your ngrok URL
    if not os.environ.get("PUBLIC_URL"):
        raise SystemExit("error: set PUBLIC_URL to the https URL Twilio reaches you at (e.g. your ngrok URL)")
    agent.run(
        twilio=True, public_url=os.environ["PUBLIC_URL"], host="0.0.0.0", port=int(os.getenv("PORT", "8080"))
    )
