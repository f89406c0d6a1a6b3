"""Built-in tools (`duetaspan.tools`): time, weather, web search, calculator, end_call, transfer_call,
send_dtmf and opt_out (the do-not-call list).

Each is a plain `@tool` function usable from Python and exportable as an MCP server
(`duetaspan tools serve-mcp`). The module-level objects use the public services; `builtin_tools(settings)`
builds them against configured endpoints (tests, mirrors) from `[tools.settings]` in agent.toml.

Example:
    >>> from duetaspan.registry import ToolRegistry
    >>> from duetaspan.tools import builtin_tools
    >>> sorted(t.name for t in builtin_tools())
    ['calculate', 'end_call', 'get_time', 'get_weather', 'opt_out', 'send_dtmf', 'transfer_call', 'web_search']
    >>> registry = ToolRegistry(builtin_tools(names=["get_time", "calculate"]))
"""

from __future__ import annotations

from collections.abc import Iterable

from duetaspan.config import BuiltinToolsConfig
from duetaspan.errors import ConfigError
from duetaspan.registry import FunctionTool
from duetaspan.tools.calculator import calculate
from duetaspan.tools.call_control import end_call, make_transfer_call, send_dtmf, transfer_call
from duetaspan.tools.clock import get_time, make_get_time
from duetaspan.tools.opt_out import opt_out
from duetaspan.tools.search import make_web_search, web_search
from duetaspan.tools.weather import get_weather, make_get_weather

BUILTIN_NAMES: tuple[str, ...] = (
    "get_time",
    "get_weather",
    "web_search",
    "calculate",
    "end_call",
    "transfer_call",
    "send_dtmf",
    "opt_out",
)


def builtin_tools(
    settings: BuiltinToolsConfig | None = None, names: Iterable[str] | None = None
) -> list[FunctionTool]:
    """The built-in tools (all, or `names`, in that order) configured by `settings`."""
    s = settings or BuiltinToolsConfig()
    factories = {
        "get_time": lambda: make_get_time(s.default_timezone),
        "get_weather": lambda: make_get_weather(s.geocoding_url, s.forecast_url, s.http_timeout_s),
        "web_search": lambda: make_web_search(s.duckduckgo_url, s.wikipedia_url, s.http_timeout_s),
        "calculate": lambda: calculate,
        "end_call": lambda: end_call,
        "transfer_call": lambda: make_transfer_call(s.transfer_targets),
        "send_dtmf": lambda: send_dtmf,
        "opt_out": lambda: opt_out,
    }
    wanted = list(BUILTIN_NAMES if names is None else names)
    unknown = [n for n in wanted if n not in factories]
    if unknown:
        raise ConfigError(
            f"tools.builtins: unknown built-in tools {unknown}; available: {list(BUILTIN_NAMES)}"
        )
    return [factories[n]() for n in wanted]


__all__ = [
    "BUILTIN_NAMES",
    "builtin_tools",
    "calculate",
    "end_call",
    "get_time",
    "get_weather",
    "opt_out",
    "send_dtmf",
    "transfer_call",
    "web_search",
]
