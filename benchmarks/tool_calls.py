"""Tool-call overheads on the retrieval path: `ToolRegistry.call` for async and sync (thread) tools, and an
MCP round trip over stdio to the test server (spawned here). Prints median and p95 in milliseconds.

    python benchmarks/tool_calls.py [--n 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

from duetaspan.adapters.mcp import MCPToolset
from duetaspan.config import MCPServerConfig
from duetaspan.registry import ToolRegistry, tool
from duetaspan.tools import builtin_tools

SERVER = Path(__file__).resolve().parents[1] / "tests" / "adapters" / "mcp" / "server_app.py"


@tool
async def ping_async(x: int) -> dict:
    """Async no-op."""
    return {"x": x}


@tool
def ping_sync(x: int) -> dict:
    """Sync no-op (runs in a worker thread)."""
    return {"x": x}


async def measure(label: str, registry: ToolRegistry, name: str, args: dict, n: int) -> None:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        result = await registry.call(name, args)
        times.append((time.perf_counter() - t0) * 1000)
        assert result.ok, result.error
    times.sort()
    p95 = times[int(0.95 * (len(times) - 1))]
    print(f"{label:<34} median {statistics.median(times):7.3f} ms   p95 {p95:7.3f} ms   (n={n})")


async def main(n: int) -> None:
    registry = ToolRegistry([ping_async, ping_sync, *builtin_tools(names=["get_time", "calculate"])])
    await measure("registry async tool", registry, "ping_async", {"x": 1}, n)
    await measure("registry sync tool (thread)", registry, "ping_sync", {"x": 1}, n)
    await measure("built-in get_time", registry, "get_time", {"place": "Tokyo"}, n)
    await measure("built-in calculate", registry, "calculate", {"expression": "12*(3+4)"}, n)
    config = MCPServerConfig(name="bench", command=sys.executable, args=[str(SERVER)])
    t0 = time.perf_counter()
    async with MCPToolset([config]) as mcp:
        print(f"{'MCP stdio connect + list':<34} {(time.perf_counter() - t0) * 1000:7.1f} ms")
        mcp.register(registry)
        await measure("MCP stdio tool call (add)", registry, "add", {"a": 1, "b": 2}, n)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=200)
    asyncio.run(main(parser.parse_args().n))
