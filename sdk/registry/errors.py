"""Errors of the tool registry. `ToolRegistry.call` reports tool-side failures in a failed `ToolResult`
(`ok=False`) instead of raising; `ToolResult.raise_for_error()` turns one back into these exceptions."""

from __future__ import annotations

from duetaspan.errors import DuetaspanError


class ToolError(DuetaspanError):
    """Base class of the errors a tool call can end with."""


class ToolNotFound(ToolError, LookupError):
    """No tool of that name is registered (often a name the LLM made up)."""


class ToolArgumentsInvalid(ToolError, ValueError):
    """The arguments do not match the tool's JSON schema; the message names the argument."""


class ToolTimeout(ToolError, TimeoutError):
    """The tool did not finish within its timeout."""


class ToolFailed(ToolError):
    """The tool ran and failed. Tools may raise it themselves with a short, speakable message."""


class ToolDefinitionError(DuetaspanError, TypeError):
    """A function cannot be made into a tool (bad name, `*args`, duplicate registration...)."""
