"""The registry as an MCP server: every tool listed with its JSON schema, each call run by `ToolRegistry.call`.

A result's text content is its one-line reference (`(tool result) ...`) and its structured content the full
data (`{"result": ...}` for non-objects); failures come back with `is_error` and the error message. Each MCP
request gets a fresh `CallContext` (call-control actions it records are echoed in the structured content).

Example:
    >>> from duetaspan.registry import ToolRegistry
    >>> from duetaspan.tools import builtin_tools
    >>> server = build_mcp_server(ToolRegistry(builtin_tools()))
    >>> # await serve_http(registry, port=8931)  ->  http://127.0.0.1:8931/mcp
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from mcp import types
from mcp.server.lowlevel import Server

from duetaspan import __version__
from duetaspan.registry import CallContext, ToolRegistry

log = logging.getLogger(__name__)


def _mcp_tool(spec: Any) -> types.Tool:
    return types.Tool(
        name=spec.name,
        description=spec.description,
        input_schema=spec.parameters,
        annotations=types.ToolAnnotations(
            read_only_hint=not spec.side_effect, destructive_hint=spec.side_effect
        ),
    )


def build_mcp_server(registry: ToolRegistry, name: str = "duetaspan") -> Server[Any]:
    """A low-level MCP `Server` exposing `registry` (tools only)."""

    async def list_tools(_ctx: Any, _params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[_mcp_tool(s) for s in registry.specs()])

    async def call_tool(_ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        ctx = CallContext(call_id=f"mcp-{_ctx.request_id}" if getattr(_ctx, "request_id", None) else "mcp")
        result = await registry.call(params.name, params.arguments or {}, ctx)
        if not result.ok:
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=result.error or "failed")], is_error=True
            )
        data = result.data if isinstance(result.data, dict) else {"result": result.data}
        if ctx.actions:
            data = {
                **data,
                "actions": [{"kind": a.kind, "target": a.target, "reason": a.reason} for a in ctx.actions],
            }
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=result.reference)], structured_content=data
        )

    return Server(name, version=__version__, on_list_tools=list_tools, on_call_tool=call_tool)


async def serve_stdio(registry: ToolRegistry, name: str = "duetaspan") -> None:
    """Serve over this process's stdin/stdout until the client closes them."""
    from mcp.server.stdio import stdio_server

    server = build_mcp_server(registry, name)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


async def serve_http(
    registry: ToolRegistry,
    host: str = "127.0.0.1",
    port: int = 8931,
    path: str = "/mcp",
    name: str = "duetaspan",
) -> None:
    """Serve over streamable HTTP at `http://host:port/path` until cancelled."""
    import uvicorn

    server = build_mcp_server(registry, name)
    app = server.streamable_http_app(streamable_http_path=path, host=host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    print(f"duetaspan: MCP server on http://{host}:{port}{path}", file=sys.stderr, flush=True)
    await uvicorn.Server(config).serve()
