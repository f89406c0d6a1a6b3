"""The sessions an agent creates, for a test to look into (their calls, services, records).

Example:
    >>> class FakeAgent:
    ...     def create_session(self, call):
    ...         return f"session of {call}"
    >>> agent = FakeAgent()
    >>> sessions = capture_sessions(agent)
    >>> agent.create_session("CA1"), sessions
    ('session of CA1', ['session of CA1'])
"""

from __future__ import annotations

from typing import Any


def capture_sessions(agent: Any) -> list[Any]:
    """Every session `agent.create_session(...)` makes from now on, in order (the method is wrapped)."""
    sessions: list[Any] = []
    create = agent.create_session

    def capture(*args: Any, **kwargs: Any) -> Any:
        session = create(*args, **kwargs)
        sessions.append(session)
        return session

    agent.create_session = capture
    return sessions


__all__ = ["capture_sessions"]
