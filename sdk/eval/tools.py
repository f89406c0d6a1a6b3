"""The tools of an eval run: mock tools from the scenario file (canned results, or FDB-v3's mock APIs), and
`CallLog`, which wraps every tool of a registry so each executed call is recorded under its call's id.

A call counts when the tool actually runs (its arguments passed validation), which is what a caller would
notice; a refused side-effect call or arguments the schema rejects are not calls.

Example:
    >>> import asyncio
    >>> from duetaspan.registry import CallContext, ToolRegistry
    >>> from duetaspan.eval.scenario import MockTool
    >>> registry = ToolRegistry(mock_tools([MockTool(name="track_order", parameters={"order_id": "string"},
    ...                                              result={"status": "shipped"})]))
    >>> log = CallLog.wrap(registry)
    >>> asyncio.run(registry.call("track_order", {"order_id": "A1"}, CallContext(call_id="s1"))).reference
    '(tool result) status: shipped.'
    >>> log.calls("s1")[0].tool, log.calls("s1")[0].args
    ('track_order', {'order_id': 'A1'})
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from duetaspan.eval.fdb_v3 import mock_result
from duetaspan.eval.scenario import MockTool
from duetaspan.registry import REDACTED, CallContext, Tool, ToolRegistry, ToolSpec
from duetaspan.registry.errors import ToolFailed
from duetaspan.registry.tool import SchemaTool

log = logging.getLogger(__name__)


def mock_tools(tools: list[MockTool], *, fdb_v3: bool = False) -> list[Tool]:
    """Registry tools for the mock tools of a scenario file (`fdb_v3`: results from the benchmark's mocks)."""
    out: list[Tool] = []
    for mock in tools:
        spec = ToolSpec(
            name=mock.name,
            description=mock.description or f"{mock.name} (mock tool)",
            parameters=mock.parameters,
            side_effect=mock.side_effect,
            source="mock",
        )
        out.append((_SignatureTool if fdb_v3 else SchemaTool)(spec, _handler(mock, fdb_v3)))
    return out


class _SignatureTool(SchemaTool):
    """An FDB-v3 mock tool takes exactly its declared parameters, as the benchmark agent's functions do:
    arguments a router adds beyond the signature are dropped (with a log line), never run nor recorded."""

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        declared = self.spec.parameters.get("properties", {})
        if isinstance(arguments, Mapping) and (extra := sorted(set(arguments) - set(declared))):
            log.info("FDB-v3 mock tool %s: dropped arguments its signature does not have: %s",
                     self.spec.name, ", ".join(extra))  # fmt: skip
            arguments = {k: v for k, v in arguments.items() if k in declared}
        return super().validate(arguments)


def _handler(mock: MockTool, fdb_v3: bool) -> Any:
    async def run(arguments: dict[str, Any], ctx: CallContext) -> Any:
        if mock.error is not None:
            raise ToolFailed(mock.error)
        if fdb_v3:
            return mock_result(mock.name, arguments)
        return copy.deepcopy(mock.result)

    return run


@dataclass
class ActualCall:
    """One executed tool call: name, arguments (redacted fields masked), when it started and ended (`t`,
    `t_end`: seconds since the scenario started), and whether the tool succeeded."""

    tool: str
    args: dict[str, Any]
    t: float
    ok: bool = True
    error: str | None = None
    t_end: float | None = None  # None while the tool is still running

    def as_dict(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "args": self.args,
            "t": round(self.t, 3),
            "t_end": None if self.t_end is None else round(self.t_end, 3),
            "ok": self.ok,
            "error": self.error,
        }


class _Recorded(Tool):
    """A registry tool that reports each run to a `CallLog` (same spec, validation and rendering)."""

    def __init__(self, inner: Tool, log: CallLog) -> None:
        self.inner = inner
        self.spec = inner.spec
        self._log = log

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        return self.inner.validate(arguments)

    async def run(self, arguments: dict[str, Any], ctx: CallContext) -> Any:
        shown = {k: (REDACTED if k in self.spec.redact else v) for k, v in arguments.items()}
        call = self._log.record(ctx.call_id, self.spec.name, shown)
        try:
            return await self.inner.run(arguments, ctx)
        except Exception as exc:
            call.ok, call.error = False, f"{type(exc).__name__}: {exc}"
            raise
        finally:
            call.t_end = self._log.elapsed(ctx.call_id)

    def data(self, raw: Any) -> Any:
        return self.inner.data(raw)

    def render(self, raw: Any) -> str:
        return self.inner.render(raw)

    def arguments_for_log(self, arguments: dict[str, Any]) -> dict[str, Any]:
        return self.inner.arguments_for_log(arguments)


@dataclass
class CallLog:
    """Executed tool calls per call id (one scenario run = one call id)."""

    _calls: dict[str, list[ActualCall]] = field(default_factory=dict)
    _started: dict[str, float] = field(default_factory=dict)

    @classmethod
    def wrap(cls, registry: ToolRegistry) -> CallLog:
        """Replace every tool of `registry` with a recording wrapper; returns the log they write to."""
        log = cls()
        for name in registry.names():
            registry.add(_Recorded(registry.get(name), log), replace=True)
        return log

    def start(self, call_id: str) -> None:
        """Mark a scenario's start (call times are measured from here)."""
        self._calls[call_id] = []
        self._started[call_id] = time.monotonic()

    def record(self, call_id: str, tool: str, args: dict[str, Any]) -> ActualCall:
        call = ActualCall(tool, dict(args), self.elapsed(call_id))
        self._calls.setdefault(call_id, []).append(call)
        return call

    def elapsed(self, call_id: str) -> float:
        """Seconds since `start(call_id)`."""
        return time.monotonic() - self._started.setdefault(call_id, time.monotonic())

    def calls(self, call_id: str, *, since: float | None = None) -> list[ActualCall]:
        """The calls run so far; `since` (a `time.monotonic()` instant) makes their times relative to it."""
        calls = list(self._calls.get(call_id, []))
        if since is None:
            return calls
        shift = since - self._started.get(call_id, since)
        return [replace(c, t=c.t - shift, t_end=None if c.t_end is None else c.t_end - shift) for c in calls]
