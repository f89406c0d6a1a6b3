"""What the scripted loopback servers share: loading a script file, serving on a free port, the command line,
and a reply that never comes (`hang`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar, Self

from aiohttp import web

from tests.support import serve_app


async def hang_until_disconnect(request: web.Request, limit_s: float = 3600.0) -> None:
    """Never answer, but stop once the client hangs up (so server shutdown does not wait on it)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + limit_s
    while loop.time() < end:
        transport = request.transport
        if transport is None or transport.is_closing():
            return
        await asyncio.sleep(0.02)


class ScriptedServer:
    """Base of a scripted server: subclasses take a script dict in `__init__` and build their `app()`.

    Example:
        >>> # async with ScriptedLLMServer(script).serve() as base_url: ...
        >>> # python -m tests.fakes.llm_server --port 8004 --script script.json  (ScriptedLLMServer.main)
    """

    description: ClassVar[str] = "Scripted server (tests only)."
    script_help: ClassVar[str] = "JSON script"

    def __init__(self, script: dict[str, Any] | None = None) -> None:
        raise NotImplementedError

    def app(self) -> web.Application:
        raise NotImplementedError

    @classmethod
    def from_file(cls, path: str | Path) -> Self:
        return cls(json.loads(Path(path).read_text()))

    @contextlib.asynccontextmanager
    async def serve(self) -> AsyncIterator[str]:
        """Serve on a free loopback port; yields the base URL."""
        async with serve_app(self.app()) as url:
            yield url

    @classmethod
    def main(cls, argv: list[str] | None = None) -> None:
        """The command line: serve a script file (or an empty script) on `--host`/`--port` until killed."""
        parser = argparse.ArgumentParser(description=cls.description)
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, required=True)
        parser.add_argument("--script", type=Path, help=cls.script_help)
        args = parser.parse_args(argv)
        server = cls.from_file(args.script) if args.script else cls()
        web.run_app(server.app(), host=args.host, port=args.port, print=None)
