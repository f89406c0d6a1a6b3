"""MCP 2.x (`duetaspan.adapters.mcp`): servers' tools into the registry (stdio, streamable HTTP) and the
registry out as an MCP server (`duetaspan tools serve-mcp`).

Example:
    >>> from duetaspan.adapters.mcp import MCPToolset
    >>> # async with MCPToolset(config.mcp_servers) as mcp:
    >>> #     mcp.register(registry)
"""

from duetaspan.adapters.mcp.client import (
    MCPConnectionError,
    MCPServerConnection,
    MCPTool,
    MCPToolset,
    llm_tool_name,
    stdio_environment,
)
from duetaspan.adapters.mcp.export import build_mcp_server, serve_http, serve_stdio

__all__ = [
    "MCPConnectionError",
    "MCPServerConnection",
    "MCPTool",
    "MCPToolset",
    "build_mcp_server",
    "llm_tool_name",
    "serve_http",
    "serve_stdio",
    "stdio_environment",
]
