"""Side-effect tool calls that outlive their caller: idempotency keys and the per-call ledger.

A side-effect tool (a booking, a payment) that has started must not be cut off by the retrieval's deadline
or the end of its retrieval: a booking API that commits at 2.4 s and answers at 2.6 s would be committed and
forgotten, and the caller's next `<ret>` would book again. So the registry runs each side-effect call as its
own task, shielded from the caller's cancellation and bounded by the tool's own timeout, through the call's
`SideEffectLedger` (`CallContext.effects`):

- the same call of the same tool with the same arguments has one **idempotency key**
  (`idempotency_key(call_id, tool, arguments)`); tools that accept one get it (a parameter named
  `idempotency_key`, or `current_idempotency_key()` inside any tool, e.g. to send as an HTTP header);
- a call whose key is running is joined, one whose key already succeeded is answered from the ledger
  (`ToolResult.replayed`), so a booking runs once per call however often the router asks for it; a failed
  one may be tried again (with the same key, so the far side can deduplicate too);
- a result that arrives after everyone stopped waiting goes to `on_late(result)`: the registry hands it to
  `CallContext.on_late_result`, where the call's retrieval records it in the Context DB and the call record,
  so the next `<ret>` sees it.

Example:
    >>> key = idempotency_key("CA1", "book_table", {"party": 4, "time": "20:00"})
    >>> key == idempotency_key("CA1", "book_table", {"time": "20:00", "party": 4}), key[:4]
    (True, 'dsk-')
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from duetaspan.registry.render import to_jsonable
from duetaspan.registry.result import ToolResult

log = logging.getLogger(__name__)

IDEMPOTENCY_PARAM = "idempotency_key"  # a tool parameter of this name gets the key (kept out of the schema)
_CURRENT_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("duetaspan_tool_key", default=None)


def idempotency_key(call_id: str, tool: str, arguments: Mapping[str, Any]) -> str:
    """The key of one tool call: the same for the same call, tool and (validated) arguments."""
    canonical = json.dumps(to_jsonable(dict(arguments)), sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(f"{call_id}\x1f{tool}\x1f{canonical}".encode()).hexdigest()
    return f"dsk-{digest[:32]}"


def current_idempotency_key() -> str | None:
    """Inside a running tool: its call's idempotency key (None outside a tool call)."""
    return _CURRENT_KEY.get()


def set_current_key(key: str | None) -> contextvars.Token[str | None]:
    return _CURRENT_KEY.set(key)


def reset_current_key(token: contextvars.Token[str | None]) -> None:
    _CURRENT_KEY.reset(token)


class SideEffectLedger:
    """One call's side-effect tool calls by idempotency key: running ones (shared), succeeded ones (kept)."""

    def __init__(self) -> None:
        self._running: dict[str, asyncio.Task[ToolResult]] = {}
        self._waiting: dict[str, int] = {}
        self._late: dict[str, Callable[[ToolResult], None]] = {}
        self.done: dict[str, ToolResult] = {}

    async def once(
        self,
        key: str,
        start: Callable[[], Awaitable[ToolResult]],
        on_late: Callable[[ToolResult], None] | None = None,
    ) -> ToolResult:
        """Run `start()` once for `key` (shielded from this caller's cancellation) and return its result."""
        kept = self.done.get(key)
        if kept is not None:
            return dataclasses.replace(kept, replayed=True, elapsed_ms=0.0)
        task = self._running.get(key)
        if task is None:
            task = asyncio.ensure_future(start())
            self._running[key] = task
            task.add_done_callback(functools.partial(self._finished, key))
        self._waiting[key] = self._waiting.get(key, 0) + 1
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done() and on_late is not None:
                self._late[key] = on_late  # nobody may be left to hear the answer: it still gets recorded
            raise
        finally:
            self._waiting[key] -= 1

    @property
    def running(self) -> int:
        """Side-effect calls still running."""
        return len(self._running)

    def _finished(self, key: str, task: asyncio.Task[ToolResult]) -> None:
        self._running.pop(key, None)
        on_late = self._late.pop(key, None)
        if task.cancelled():
            return
        if task.exception() is not None:  # the registry turns tool errors into results: this is a bug
            log.error("side-effect call %s failed: %r", key, task.exception())
            return
        result = task.result()
        if result.ok:
            self.done[key] = result
        if on_late is not None and self._waiting.get(key, 0) == 0:
            try:
                on_late(result)
            except Exception:
                log.exception("recording the late result of %s failed", result.name)


__all__ = [
    "IDEMPOTENCY_PARAM",
    "SideEffectLedger",
    "current_idempotency_key",
    "idempotency_key",
]
