"""The campaign tests run on both stores, like tests/store (a SQLite file, a fresh PostgreSQL database); and
what the SIP campaign tests check and tidy after their calls."""

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

from tests.store.conftest import store, store_target  # noqa: F401


def assert_nothing_held(agent: Any, ep: Any, slots: int) -> None:
    """After a campaign's calls: every call slot back, no SIP call and no RTP port left on the endpoint."""
    assert agent.admission.held == 0 and agent.free_slots == slots  # no slot leaked
    assert ep.free_slots == slots and not ep.calls  # no SIP call left
    assert not ep.ports._allocated  # no RTP port left


async def cancel_all(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel the SIPp callees still running (a failed test's) and wait for them to go."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    with contextlib.suppress(Exception):
        await asyncio.gather(*tasks, return_exceptions=True)
