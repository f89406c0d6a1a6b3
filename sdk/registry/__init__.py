"""Tool registry (`duetaspan.registry`): `@tool`, JSON schemas, the per-call context, results and rendering.

Example:
    >>> from duetaspan.registry import tool, ToolRegistry, CallContext
    >>> @tool
    ... def add(a: int, b: int) -> int:
    ...     '''Add two numbers.
    ...
    ...     Args:
    ...         a: first addend
    ...         b: second addend
    ...     '''
    ...     return a + b
    >>> registry = ToolRegistry([add])
    >>> import asyncio
    >>> asyncio.run(registry.call("add", {"a": 2, "b": 3}, CallContext())).reference
    '(tool result) 5'
"""

from duetaspan.registry.context import CallAction, CallContext, Turn
from duetaspan.registry.effects import current_idempotency_key, idempotency_key
from duetaspan.registry.errors import (
    ToolArgumentsInvalid,
    ToolDefinitionError,
    ToolError,
    ToolFailed,
    ToolNotFound,
    ToolTimeout,
)
from duetaspan.registry.registry import ToolRegistry
from duetaspan.registry.render import NO_INFO, TOOL_RESULT_PREFIX, as_reference, render_compact
from duetaspan.registry.result import REDACTED, ToolResult
from duetaspan.registry.tool import FunctionTool, Tool, ToolSpec, tool

__all__ = [
    "NO_INFO",
    "REDACTED",
    "TOOL_RESULT_PREFIX",
    "CallAction",
    "CallContext",
    "FunctionTool",
    "Tool",
    "ToolArgumentsInvalid",
    "ToolDefinitionError",
    "ToolError",
    "ToolFailed",
    "ToolNotFound",
    "ToolRegistry",
    "ToolResult",
    "ToolSpec",
    "ToolTimeout",
    "Turn",
    "as_reference",
    "current_idempotency_key",
    "idempotency_key",
    "render_compact",
    "tool",
]
