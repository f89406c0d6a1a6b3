"""`duetaspan tools`: list, call and export the agent's tools. These forms are a relied-on contract:

    duetaspan tools list [--config agent.toml] [--json]
    duetaspan tools call NAME '{"arg": 1}' [--config agent.toml]   # JSON on stdout; exit 1 when the call fails
                         [--caller +1555...] [--called +1555...] [--dtmf 1234]   # the tool's call context
    duetaspan tools serve-mcp [--config agent.toml] [--http PORT] [--host HOST]   # stdio unless --http

Without `--config` they work on the built-in tools.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from duetaspan.errors import DuetaspanError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("tools", help="list, call or serve (over MCP) the agent's tools")
    sub = parser.add_subparsers(dest="tools_command", metavar="ACTION", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", metavar="AGENT_TOML", help="agent.toml (default: the built-in tools only)")

    p_list = sub.add_parser("list", help="list tools with their source and description")
    common(p_list)
    p_list.add_argument(
        "--json", action="store_true", help="print the full specs (with JSON schemas) as JSON"
    )
    p_list.set_defaults(func=_list)

    p_call = sub.add_parser("call", help="call one tool and print the result as JSON")
    common(p_call)
    p_call.add_argument("name")
    p_call.add_argument("arguments", nargs="?", default="{}", help="a JSON object (default {})")
    p_call.add_argument("--caller", help="the call context's caller number, e.g. +15550001111")
    p_call.add_argument("--called", help="the call context's dialled number")
    p_call.add_argument("--dtmf", default="", help="DTMF digits the caller has pressed, e.g. 1234")
    p_call.set_defaults(func=_call)

    p_serve = sub.add_parser(
        "serve-mcp", help="expose the tools as an MCP server (stdio, or HTTP with --http)"
    )
    common(p_serve)
    p_serve.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on PORT at /mcp")
    p_serve.add_argument("--host", default="127.0.0.1", help="HTTP host (default 127.0.0.1)")
    p_serve.set_defaults(func=_serve)


def _config(args: argparse.Namespace):
    if not args.config:
        return None
    from duetaspan.config import AgentConfig

    return AgentConfig.load(args.config)


def _fail(message: str, code: int = 2) -> int:
    print(f"duetaspan tools: {message}", file=sys.stderr)
    return code


async def _list(args: argparse.Namespace) -> int:
    from duetaspan.tools.loader import agent_tools

    try:
        async with agent_tools(_config(args)) as registry:
            specs = registry.specs()
    except DuetaspanError as exc:
        return _fail(str(exc))
    if args.json:
        print(json.dumps([s.listing() for s in specs], indent=2, ensure_ascii=False))
        return 0
    width = max((len(s.name) for s in specs), default=4)
    for s in specs:
        flag = " [side effect]" if s.side_effect else ""
        summary = (s.description.splitlines() or [""])[0]
        print(f"{s.name:<{width}}  {s.source:<12} {summary}{flag}")
    return 0


async def _call(args: argparse.Namespace) -> int:
    from duetaspan.tools.loader import agent_tools

    try:
        arguments = json.loads(args.arguments)
    except json.JSONDecodeError as exc:
        return _fail(f"arguments are not valid JSON: {exc}")
    if not isinstance(arguments, dict):
        return _fail('arguments must be a JSON object, e.g. \'{"city": "Paris"}\'')
    from duetaspan.registry import CallContext

    ctx = CallContext(call_id="cli", caller=args.caller, called=args.called, dtmf=args.dtmf or "")
    try:
        async with agent_tools(_config(args)) as registry:
            result = await registry.call(args.name, arguments, ctx)
    except DuetaspanError as exc:
        return _fail(str(exc))
    out = {**result.to_log(), "data": result.data}
    print(json.dumps(out, ensure_ascii=False, default=str))
    return 0 if result.ok else 1


async def _serve(args: argparse.Namespace) -> int:
    from duetaspan.adapters.mcp import serve_http, serve_stdio
    from duetaspan.tools.loader import agent_tools

    try:
        async with agent_tools(_config(args)) as registry:
            if args.http is not None:
                await serve_http(registry, host=args.host, port=args.http)
            else:
                await serve_stdio(registry)
    except DuetaspanError as exc:
        return _fail(str(exc))
    return 0
