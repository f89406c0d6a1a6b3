"""An agent's tools from its `agent.toml`: built-ins, `@tool` modules and MCP servers in one registry.

Example:
    >>> from duetaspan.config import AgentConfig
    >>> async def main():
    ...     async with agent_tools(AgentConfig.load("agent.toml")) as registry:
    ...         print(registry.names())
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator

from duetaspan.config import AgentConfig
from duetaspan.registry import ToolRegistry
from duetaspan.tools import builtin_tools


def python_registry(config: AgentConfig | None = None) -> ToolRegistry:
    """Built-ins and `tools.modules` (all built-ins without a config). Modules are imported with the config's
    folder on `sys.path`, so `modules = ["my_tools"]` finds `my_tools.py` beside agent.toml."""
    if config is None:
        return ToolRegistry(builtin_tools())
    registry = ToolRegistry(
        builtin_tools(config.tools.settings, config.tools.builtins),
        default_timeout=config.tools.default_timeout_s,
    )
    if config.tools.modules:
        base = str(config.base_dir)
        if base not in sys.path:
            sys.path.insert(0, base)
        for module in config.tools.modules:
            registry.add_module(module)
    return registry


@contextlib.asynccontextmanager
async def agent_tools(config: AgentConfig | None = None) -> AsyncIterator[ToolRegistry]:
    """The full registry, MCP servers connected for the duration of the `async with`."""
    registry = python_registry(config)
    if config is None or not config.mcp_servers:
        yield registry
        return
    from duetaspan.adapters.mcp import MCPToolset

    async with MCPToolset(config.mcp_servers) as mcp:
        mcp.register(registry)
        yield registry
