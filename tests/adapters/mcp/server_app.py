"""A small MCP server for the tests, written with `mcp`'s `MCPServer`; run over stdio or `--http PORT`.

Tools cover the cases the client must handle: structured and text results, is_error, slow calls, a crash
in the middle of a call (once per marker file), names an LLM API rejects, a name that collides with a
built-in, and a report of the environment it was started with.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel

server = MCPServer("test-server")


class Weather(BaseModel):
    city: str
    temp_c: float


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def weather(city: str) -> Weather:
    """Weather in a city (canned)."""
    return Weather(city=city, temp_c=21.5)


@server.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    return text


@server.tool()
def fail(reason: str = "bad input") -> str:
    """Always fails with a tool error."""
    raise ToolError(reason)


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def crash_once(marker: str) -> str:
    """Kill this server process the first time it is called with a marker path."""
    path = Path(marker)
    if not path.exists():
        path.write_text(str(os.getpid()))
        os._exit(3)
    return f"survived after {path.read_text()}"


@server.tool()
def env_report() -> dict[str, str]:
    """The environment this server process sees."""
    return dict(os.environ)


@server.tool(name="db.lookup")
def db_lookup(key: str) -> str:
    """A name with a dot, which chat LLM APIs do not accept."""
    return f"value of {key}"


@server.tool(name="get_time")
def get_time() -> str:
    """Collides with the built-in get_time."""
    return "server time"


@server.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int)
    args = parser.parse_args()
    if args.http:
        asyncio.run(server.run_streamable_http_async(host="127.0.0.1", port=args.http))
    else:
        print("test server starting", file=sys.stderr)
        server.run()
