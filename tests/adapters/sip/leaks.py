"""What a SIP test must leave behind: nothing. `checked_endpoint(handler, **settings)` is `endpoint_on_loopback`
that, when the test's body is done, waits (generously) for the endpoint to go idle and then asserts that no
RTP port pair, call slot (ours, aiosipua's dialogs, the shared admission budget), endpoint task or socket of
the process is left, and then that no SIP transaction but an unanswered INVITE of ours (RFC 3261 runs it
to its timer) is still retransmitting or waiting for its answer (a BYE nobody answered, a 486 nobody ACKed:
they would end by themselves only at 64*T1, 32 s, and the endpoint's shutdown would hide them);
`endpoint_leaks(ep)` lists what is held, for tests that manage the endpoint themselves,
`running_transactions(ep)` the transactions.

Example:
    >>> # async with checked_endpoint(echo, answer_after_ms=2000) as ep:
    >>> #     await run_sipp(...)          # on exit: 0 ports, slots, tasks, sockets, or the test fails
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

from tests.adapters.sip.peer import endpoint_on_loopback

IDLE_TIMEOUT_S = 40.0  # an unACKed 200 holds its slot for 64*T1 = 32 s; a loaded CI box is slow
# once the rest is idle, the transactions still running must end within this (an answer in flight, a last
# retransmission absorbed): far below the 32 s after which an unanswered one gives up by itself
TRANSACTIONS_GRACE_S = 10.0
# under loss, a BYE whose every answer the loss ate (the callee gone once its scenario ended) ends only when it
# gives up, at Timer F (64*T1 = 32 s after it was sent): what the lossy tests give their transactions
LOSSY_TRANSACTIONS_GRACE_S = 40.0


def socket_fds() -> set[str]:
    """This process's open sockets (`socket:[inode]` of each fd)."""
    out: set[str] = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:"):
                out.add(target)
    return out


def endpoint_leaks(ep: Any) -> list[str]:
    """What the endpoint still holds: RTP port pairs, calls, slots, dialogs, tasks (empty when idle)."""
    problems: list[str] = []
    ports = getattr(ep.ports, "allocated", None) or getattr(ep.ports, "_allocated", set())  # aiortp's own too
    if ports:
        problems.append(f"{len(ports)} RTP port pair(s) allocated: {sorted(ports)}")
    for name in ("calls", "answering", "_reserved", "_tasks"):
        held = getattr(ep, name, None)
        if held:
            problems.append(f"endpoint.{name}: {list(held)[:4]} ({len(held)})")
    if ep.uas is not None and ep.uas._calls:
        problems.append(f"aiosipua dialogs: {list(ep.uas._calls)[:4]}")
    if ep.uas is not None and ep.uas.uac is not None and ep.uas.uac._calls:
        problems.append(f"aiosipua outbound calls: {list(ep.uas.uac._calls)[:4]}")
    if ep.shared is not None and ep.shared.held:
        problems.append(f"{ep.shared.held} slot(s) held in the shared admission")
    return problems


def running_transactions(ep: Any) -> list[str]:
    """The endpoint's SIP transactions still running: our requests other than INVITE retransmitted or awaiting
    their final answer (`BYE`, `REFER`, ...), our error answers to INVITEs retransmitted until ACKed (`answer to
    INVITE`). Not `Transactions.pending()`: that also counts transactions already done but still absorbing
    retransmissions (timer D)."""
    txns = getattr(ep, "txns", None)
    if txns is None:
        return []
    # a client transaction that has its final answer is done (an INVITE's then only ACKs that answer's
    # retransmissions for a while, timer D: RFC 3261's "Completed" state, not a leak). An INVITE with no
    # answer yet is not counted either: a dial that gave up on a callee that never answered cannot stop it
    # (no CANCEL before a provisional answer, RFC 3261 9.1), it runs to timer B by the RFC
    running = [f"{method} (branch {branch})" for (branch, method), txn in txns._client.items()
               if txn.task is not None and not txn.task.done() and not txn.final
               and method != "INVITE"]  # fmt: skip
    running += [f"answer to {method} (branch {branch})" for (branch, method, _), entry in txns._server.items()
                if entry.task is not None and not entry.task.done()]  # fmt: skip
    return running


async def assert_idle(ep: Any, timeout_s: float = IDLE_TIMEOUT_S, transactions_grace_s: float | None = None) -> None:
    """Wait for the endpoint to hold nothing, else fail naming what it holds; then for its transactions to end
    (within `transactions_grace_s`, default `TRANSACTIONS_GRACE_S`), else fail naming them."""
    await _until_none(lambda: endpoint_leaks(ep), timeout_s,
                      lambda held: f"leaked after the test: {'; '.join(held)}")  # fmt: skip
    grace = TRANSACTIONS_GRACE_S if transactions_grace_s is None else transactions_grace_s
    await _until_none(lambda: running_transactions(ep), grace,
                      lambda held: f"SIP transactions still running after the test: {held[:4]} ({len(held)})")


async def _until_none(held: Callable[[], list[Any]], timeout_s: float, say: Callable[[list[Any]], str]) -> None:
    """Poll `held()` until it is empty, else fail after `timeout_s` with `say(what is still held)`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while left := held():
        if loop.time() > deadline:
            raise AssertionError(say(left))
        await asyncio.sleep(0.05)


async def assert_no_new_sockets(before: set[str], timeout_s: float = 10.0) -> None:
    await _until_none(lambda: list(socket_fds() - before), timeout_s,
                      lambda left: f"{len(left)} socket(s) left open after the test")  # fmt: skip


async def assert_no_new_tasks(before: set[asyncio.Task[Any]], timeout_s: float = 10.0) -> None:
    current = asyncio.current_task()
    await _until_none(lambda: [t for t in asyncio.all_tasks() - before if t is not current and not t.done()],
                      timeout_s,
                      lambda left: f"{len(left)} task(s) left running: {[t.get_name() for t in left[:5]]}")  # fmt: skip


@contextlib.asynccontextmanager
async def checked_endpoint(handler: Any, *, transactions_grace_s: float | None = None,
                           **settings: Any) -> AsyncIterator[Any]:  # fmt: skip
    """`endpoint_on_loopback` that fails the test if anything is left once its body is done (see above)."""
    sockets, tasks = socket_fds(), set(asyncio.all_tasks())
    async with endpoint_on_loopback(handler, **settings) as ep:
        yield ep
        await assert_idle(ep, transactions_grace_s=transactions_grace_s)
    await assert_no_new_tasks(tasks)
    await assert_no_new_sockets(sockets)


__all__ = [
    "assert_idle",
    "assert_no_new_sockets",
    "assert_no_new_tasks",
    "checked_endpoint",
    "endpoint_leaks",
    "running_transactions",
    "socket_fds",
]
