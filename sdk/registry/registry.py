"""`ToolRegistry`: the set of tools one agent can call (Python and MCP alike), their schemas, and `call`.

`call` never raises for tool-side problems: an unknown name, invalid arguments, a timeout or an exception in
the tool all give a `ToolResult` with `ok=False`, an `error` message and the `(no information found)`
reference, so one bad tool never ends a phone call. Only cancellation (the router's deadline, the end of the
call) propagates. A side-effect tool, once started, is not cancelled with its caller: it runs to completion
within its own timeout, once per call and idempotency key, and a result that comes too late goes to
`CallContext.on_late_result` (see `duetaspan.registry.effects`).

Example:
    >>> import asyncio
    >>> from duetaspan.registry import ToolRegistry, tool
    >>> @tool
    ... def echo(text: str) -> str:
    ...     '''Repeat the text.'''
    ...     return text
    >>> reg = ToolRegistry([echo])
    >>> [t["function"]["name"] for t in reg.openai_tools()]
    ['echo']
    >>> asyncio.run(reg.call("echo", {"text": "hi"})).reference
    '(tool result) hi'
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import ModuleType
from typing import Any

from duetaspan.registry.context import CallContext
from duetaspan.registry.effects import idempotency_key, reset_current_key, set_current_key
from duetaspan.registry.errors import (
    ToolArgumentsInvalid,
    ToolDefinitionError,
    ToolError,
    ToolFailed,
    ToolNotFound,
    ToolTimeout,
)
from duetaspan.registry.render import NO_INFO, as_reference
from duetaspan.registry.result import ToolResult
from duetaspan.registry.tool import FunctionTool, Tool, ToolSpec

log = logging.getLogger(__name__)


class ToolRegistry:
    """Tools by name.

    Args:
        tools: functions (decorated with `@tool` or plain) or `Tool` objects to add.
        default_timeout: seconds for tools that set none.
        max_reference_chars: the reference line is cut (at a word) beyond this many characters.
    """

    def __init__(
        self,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        *,
        default_timeout: float = 10.0,
        max_reference_chars: int = 600,
    ) -> None:
        self._tools: dict[str, Tool] = {}
        # told about every finished call (e.g. the server's metrics); must not raise or block
        self.on_result: list[Callable[[ToolResult], None]] = []
        self.default_timeout = default_timeout
        self.max_reference_chars = max_reference_chars
        self.extend(tools)

    # -- contents -------------------------------------------------------------------------------------
    def add(
        self, fn_or_tool: Tool | Callable[..., Any], *, name: str | None = None, replace: bool = False
    ) -> Tool:
        """Register a tool (a plain function is wrapped with `@tool`); returns the registered `Tool`.

        A second tool of the same name is a `ToolDefinitionError` unless `replace=True`.
        """
        item = fn_or_tool if isinstance(fn_or_tool, Tool) else FunctionTool(fn_or_tool)
        if name is not None and name != item.name:
            item = item.with_name(name)
        if item.name in self._tools and not replace and self._tools[item.name] is not item:
            raise ToolDefinitionError(
                f"a tool named {item.name!r} is already registered ({self._tools[item.name].spec.source}); "
                "pass name=... or replace=True"
            )
        self._tools[item.name] = item
        return item

    def extend(self, tools: Iterable[Tool | Callable[..., Any]], *, replace: bool = False) -> list[Tool]:
        """Register several tools."""
        return [self.add(t, replace=replace) for t in tools]

    def add_module(self, module: str | ModuleType) -> list[Tool]:
        """Register every `@tool` object defined at the top level of a module (an import path or module)."""
        if isinstance(module, str):
            try:
                module = importlib.import_module(module)
            except ImportError as exc:
                raise ToolDefinitionError(f"cannot import tool module {module!r}: {exc}") from exc
        found = [v for v in vars(module).values() if isinstance(v, Tool)]
        if not found:
            raise ToolDefinitionError(f"module {module.__name__!r} defines no @tool functions")
        return self.extend(found)

    def remove(self, name: str) -> Tool:
        try:
            return self._tools.pop(name)
        except KeyError:
            raise ToolNotFound(f"no tool named {name!r}") from None

    def get(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            known = ", ".join(sorted(self._tools)) or "none"
            raise ToolNotFound(f"no tool named {name!r} (registered: {known})") from None

    def names(self) -> list[str]:
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def filtered(self, allow: Iterable[str] | None = None, deny: Iterable[str] = ()) -> ToolRegistry:
        """A new registry with the same settings holding only allowed, not denied, tools."""
        allowed = None if allow is None else set(allow)
        denied = set(deny)
        out = ToolRegistry(default_timeout=self.default_timeout, max_reference_chars=self.max_reference_chars)
        out.extend(t for t in self if (allowed is None or t.name in allowed) and t.name not in denied)
        return out

    # -- what the LLM sees ----------------------------------------------------------------------------
    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self._tools.values()]

    def openai_tools(self, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Chat-completions `tools=[{"type": "function", "function": {...}}]`, optionally only `names`."""
        wanted = None if names is None else set(names)
        return [t.spec.openai() for t in self._tools.values() if wanted is None or t.name in wanted]

    # -- calling --------------------------------------------------------------------------------------
    async def call(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        ctx: CallContext | None = None,
        *,
        timeout_s: float | None = None,
        allow_side_effects: bool = True,
    ) -> ToolResult:
        """Validate `arguments`, run the tool within its timeout and render its reference line.

        Args:
            name: the registered name.
            arguments: a JSON object (None means `{}`).
            ctx: the call's context (a fresh one when None, e.g. from the command line).
            timeout_s: overrides the tool's and the registry's timeout.
            allow_side_effects: False makes side-effect tools fail without running (the router's policy).
        """
        result = await self._call(name, arguments, ctx, timeout_s, allow_side_effects)
        self._notify(result)
        return result

    def _notify(self, result: ToolResult) -> None:
        for listener in list(self.on_result):
            try:
                listener(result)
            except Exception:  # an observer's bug must not cost the tool call
                log.exception("tool result listener %r failed", listener)

    async def _call(
        self,
        name: str,
        arguments: Mapping[str, Any] | None,
        ctx: CallContext | None,
        timeout_s: float | None,
        allow_side_effects: bool,
    ) -> ToolResult:
        started = time.perf_counter()
        ctx = ctx if ctx is not None else CallContext()
        raw_args = dict(arguments or {}) if isinstance(arguments, Mapping) else arguments
        try:
            item = self.get(name)
        except ToolNotFound as exc:
            return self._failed(name, raw_args, exc, started)
        spec = item.spec
        try:
            if spec.side_effect and not allow_side_effects:
                raise ToolFailed(f"tool {name!r} acts on the world and was not explicitly requested")
            validated = item.validate(raw_args if raw_args is not None else {})
        except ToolError as exc:
            return self._failed(name, raw_args, exc, started, item)
        limit = timeout_s if timeout_s is not None else spec.timeout or self.default_timeout
        key = idempotency_key(ctx.call_id, name, validated)

        async def execute() -> ToolResult:
            token = set_current_key(key)  # what `current_idempotency_key()` answers inside the tool
            try:
                return await self._execute(item, raw_args, validated, ctx, limit, started, key)
            finally:
                reset_current_key(token)

        if not spec.side_effect:
            return await execute()

        def late(result: ToolResult) -> None:  # finished after the caller stopped waiting
            self._notify(result)
            if ctx.on_late_result is not None:
                ctx.on_late_result(result)

        # shielded: a booking that has started runs to completion (within its own timeout), once per key
        return await ctx.effects.once(key, execute, late)

    async def _execute(
        self,
        item: Tool,
        raw_args: Any,
        validated: dict[str, Any],
        ctx: CallContext,
        limit: float,
        started: float,
        key: str,
    ) -> ToolResult:
        name, spec = item.name, item.spec
        try:
            log_args = item.arguments_for_log(validated)
            try:
                async with asyncio.timeout(limit):
                    raw = await item.run(validated, ctx)
            except TimeoutError:
                raise ToolTimeout(f"tool {name!r} did not finish within {limit:g} s") from None
            data = item.data(raw)
            reference = as_reference(item.render(raw), self.max_reference_chars)
        except ToolError as exc:
            return self._failed(name, raw_args, exc, started, item, key)
        except Exception as exc:  # a tool's own bug: report it, keep the call alive
            log.warning("tool %r raised", name, exc_info=True)
            failure = ToolFailed(f"tool {name!r} raised {type(exc).__name__}: {exc}")
            failure.__cause__ = exc
            return self._failed(name, raw_args, failure, started, item, key)
        return ToolResult(
            name=name,
            arguments=log_args,
            ok=True,
            data=data,
            reference=reference,
            elapsed_ms=(time.perf_counter() - started) * 1000,
            redact=spec.redact,
            side_effect=spec.side_effect,
            idempotency_key=key,
        )

    def _failed(
        self,
        name: str,
        arguments: Any,
        exc: ToolError,
        started: float,
        item: Tool | None = None,
        key: str | None = None,
    ) -> ToolResult:
        if not isinstance(exc, ToolArgumentsInvalid | ToolNotFound):
            log.info("tool %r failed: %s", name, exc)
        return ToolResult(
            name=name,
            arguments=arguments if isinstance(arguments, dict) else {"_raw": arguments},
            ok=False,
            reference=NO_INFO,
            error=str(exc),
            elapsed_ms=(time.perf_counter() - started) * 1000,
            redact=item.spec.redact if item else (),
            side_effect=item.spec.side_effect if item else False,
            idempotency_key=key,
            exception=exc,
        )
