"""`@tool` and the tool types the registry holds: Python functions and raw JSON-schema tools (e.g. MCP).

Example:
    >>> from duetaspan.registry import tool, CallContext
    >>> @tool(timeout=3.0, redact=["card_number"], side_effect=True)
    ... async def pay_bill(amount: float, card_number: str, ctx: CallContext) -> dict:
    ...     '''Pay the caller's bill.
    ...
    ...     Args:
    ...         amount: amount in dollars
    ...         card_number: the card to charge
    ...     '''
    ...     return {"paid": amount, "confirmation": "ABC1-000042"}
    >>> pay_bill.spec.parameters["required"]
    ['amount', 'card_number']
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import re
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, overload

import jsonschema
from pydantic import ValidationError

from duetaspan.registry.context import CallContext
from duetaspan.registry.effects import IDEMPOTENCY_PARAM, current_idempotency_key
from duetaspan.registry.errors import ToolArgumentsInvalid, ToolDefinitionError
from duetaspan.registry.render import render_compact, to_jsonable
from duetaspan.registry.schema import arguments_model, describe, json_schema

# What OpenAI-compatible chat APIs accept as a function name.
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

Render = Callable[[Any], str]


@dataclass(frozen=True)
class ToolSpec:
    """What the router and LLM see of a tool.

    Attributes:
        name: matches `^[a-zA-Z0-9_-]{1,64}$`.
        description: what the tool does, for the LLM.
        parameters: the JSON schema (an object schema) of its arguments.
        side_effect: it acts on the world (booking, payment, transfer): call only on an explicit request,
            never with guessed arguments.
        timeout: seconds, or None for the registry's default.
        redact: argument names kept out of logs and transcripts.
        source: "python", or "mcp:<server>" for tools from an MCP server.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    side_effect: bool = False
    timeout: float | None = None
    redact: tuple[str, ...] = ()
    source: str = "python"
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def listing(self) -> dict[str, Any]:
        """How tool lists show it to people (`duetaspan tools list --json`, the page's tool console):
        `{"name", "description", "parameters", "side_effect", "source"}`."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "side_effect": self.side_effect,
            "source": self.source,
        }

    def openai(self) -> dict[str, Any]:
        """The chat-completions form: `{"type": "function", "function": {...}}`."""
        description = self.description
        if self.side_effect:
            description = (
                f"{description} (Action with real effects: call only when the caller explicitly asks for it; "
                "never guess its arguments.)"
            ).strip()
        return {
            "type": "function",
            "function": {"name": self.name, "description": description, "parameters": self.parameters},
        }


def check_name(name: str) -> str:
    if not TOOL_NAME.match(name):
        raise ToolDefinitionError(
            f"tool name {name!r} is not accepted by LLM APIs: use 1-64 letters, digits, '_' or '-'"
        )
    return name


class Tool(ABC):
    """A registered tool: a spec, argument validation, execution and rendering.

    Subclass it for tools that are not Python functions; `run` gets validated arguments.
    """

    spec: ToolSpec

    @property
    def name(self) -> str:
        return self.spec.name

    @abstractmethod
    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Validated arguments, or `ToolArgumentsInvalid` naming the bad argument."""

    @abstractmethod
    async def run(self, arguments: dict[str, Any], ctx: CallContext) -> Any:
        """Execute with validated arguments; returns the raw result."""

    def data(self, raw: Any) -> Any:
        """The full result as JSON-like data (kept for the router and logs)."""
        return to_jsonable(raw)

    def render(self, raw: Any) -> str:
        """The spoken clause for the reference line (the registry adds the `(tool result)` prefix)."""
        return render_compact(raw)

    def arguments_for_log(self, arguments: dict[str, Any]) -> dict[str, Any]:
        return to_jsonable(arguments)

    def with_name(self, name: str) -> Tool:
        """A copy registered under another name (collisions between servers)."""
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.spec = ToolSpec(**{**self.spec.__dict__, "name": check_name(name)})
        return clone


class FunctionTool(Tool):
    """A Python function (sync or async) as a tool; made by `@tool`. Calling it calls the function."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        side_effect: bool = False,
        redact: Iterable[str] = (),
        render: Render | None = None,
    ) -> None:
        if not callable(fn):
            raise ToolDefinitionError(f"@tool needs a function, got {fn!r}")
        tool_name = check_name(name or fn.__name__)
        self.fn = fn
        self.is_async = inspect.iscoroutinefunction(fn)
        self.model, self.context_params = arguments_model(fn, tool_name)
        self.takes_key = IDEMPOTENCY_PARAM in inspect.signature(fn).parameters
        parameters = json_schema(self.model)
        redact = tuple(redact)
        unknown = [r for r in redact if r not in parameters["properties"]]
        if unknown:
            raise ToolDefinitionError(f"tool {tool_name!r}: redact names unknown arguments {unknown}")
        if timeout is not None and timeout <= 0:
            raise ToolDefinitionError(f"tool {tool_name!r}: timeout must be > 0 seconds, got {timeout}")
        self.spec = ToolSpec(
            name=tool_name,
            description=description if description is not None else describe(fn)[0],
            parameters=parameters,
            side_effect=side_effect,
            timeout=timeout,
            redact=redact,
            source="python",
        )
        self._render = render
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<FunctionTool {self.spec.name}>"

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(arguments, Mapping):
            raise ToolArgumentsInvalid(
                f"tool {self.name!r}: arguments must be a JSON object, got {arguments!r}"
            )
        try:
            model = self.model.model_validate(dict(arguments))
        except ValidationError as exc:
            problems = "; ".join(
                f"argument {'.'.join(str(p) for p in err['loc']) or '(root)'!r}: {err['msg']}"
                for err in exc.errors()
            )
            raise ToolArgumentsInvalid(f"tool {self.name!r}: {problems}") from None
        return {name: getattr(model, name) for name in type(model).model_fields}

    async def run(self, arguments: dict[str, Any], ctx: CallContext) -> Any:
        kwargs = dict(arguments)
        for param in self.context_params:
            kwargs[param] = ctx
        if self.takes_key:  # the call id + tool + arguments key, for the far side to deduplicate with
            kwargs[IDEMPOTENCY_PARAM] = current_idempotency_key()
        if self.is_async:
            return await self.fn(**kwargs)
        # Sync tools go to a worker thread so a slow one never stalls the audio loop.
        result = await asyncio.to_thread(self.fn, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    def render(self, raw: Any) -> str:
        return self._render(raw) if self._render is not None else render_compact(raw)


class SchemaTool(Tool):
    """A tool declared by a raw JSON schema and an async handler `handler(arguments, ctx)`.

    Example:
        >>> async def lookup(arguments, ctx):
        ...     return {"balance": 12.5}
        >>> t = SchemaTool(ToolSpec("balance", "Account balance.", {"type": "object", "properties": {}}), lookup)
    """

    def __init__(
        self,
        spec: ToolSpec,
        handler: Callable[[dict[str, Any], CallContext], Awaitable[Any]] | None = None,
        render: Render | None = None,
    ) -> None:
        check_name(spec.name)
        try:
            jsonschema.Draft202012Validator.check_schema(spec.parameters)
        except jsonschema.SchemaError as exc:
            raise ToolDefinitionError(f"tool {spec.name!r}: invalid JSON schema: {exc.message}") from None
        self.spec = spec
        self._handler = handler
        self._render = render
        self._validator = jsonschema.Draft202012Validator(spec.parameters)

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(arguments, Mapping):
            raise ToolArgumentsInvalid(
                f"tool {self.name!r}: arguments must be a JSON object, got {arguments!r}"
            )
        arguments = dict(arguments)
        errors = sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.path))
        if errors:
            problems = "; ".join(
                f"argument {'.'.join(str(p) for p in e.path)!r}: {e.message}" if e.path else e.message
                for e in errors
            )
            raise ToolArgumentsInvalid(f"tool {self.name!r}: {problems}")
        return arguments

    async def run(self, arguments: dict[str, Any], ctx: CallContext) -> Any:
        if self._handler is None:
            raise NotImplementedError(f"{type(self).__name__} must override run() or be given a handler")
        return await self._handler(arguments, ctx)

    def render(self, raw: Any) -> str:
        return self._render(raw) if self._render is not None else render_compact(raw)


@overload
def tool(fn: Callable[..., Any], /) -> FunctionTool: ...
@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    side_effect: bool = False,
    redact: Iterable[str] = (),
    render: Render | None = None,
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    side_effect: bool = False,
    redact: Iterable[str] = (),
    render: Render | None = None,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Make a function a tool; use bare (`@tool`) or with options (`@tool(timeout=3)`).

    Args:
        name: the tool's name (default: the function's name).
        description: for the LLM (default: the docstring without its Args section).
        timeout: seconds before the call fails with `ToolTimeout` (default: the registry's).
        side_effect: acts on the world; the router calls it only on an explicit request.
        redact: argument names masked in logs and transcripts.
        render: `render(result) -> str`, the spoken clause (default: `render_compact`).

    Example:
        >>> @tool
        ... def get_balance(account: str) -> dict:
        ...     '''Current balance of an account.'''
        ...     return {"balance": 12.5, "currency": "USD"}
        >>> get_balance("A1")
        {'balance': 12.5, 'currency': 'USD'}
    """

    def wrap(f: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(
            f,
            name=name,
            description=description,
            timeout=timeout,
            side_effect=side_effect,
            redact=redact,
            render=render,
        )

    return wrap(fn) if fn is not None else wrap
