"""The campaign tests run on both stores, like tests/store (a SQLite file, a fresh PostgreSQL database); and
what the SIP campaign tests check and tidy after their calls."""

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

from tests.adapters.sip.peer import wait_for
from tests.store.conftest import store, store_target  # noqa: F401


async def assert_nothing_held(agent: Any, ep: Any, slots: int, timeout_s: float = 15.0) -> None:
    """After a campaign's calls: every call slot back, no SIP call and no RTP port left on the endpoint. The
    callees' last BYEs were answered when SIPp exits, but our side may still be ending those calls (their
    pipelines, records and ports) on a loaded machine: wait for that, then check. The wait stays well under
    the 30 s media timeout, so a call whose BYE was lost (it would end only by that timeout) still fails."""
    with contextlib.suppress(AssertionError):  # timed out: the assertions below say what is still held
        await wait_for(lambda: not (agent.admission.held or ep.calls or ep.ports._allocated), timeout_s,
                       what="the last calls' slots, calls and RTP ports to be released")  # fmt: skip
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
