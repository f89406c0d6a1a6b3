"""What the scripted loopback servers share: serving an aiohttp app on a free loopback port, a reply that never
comes (`hang`), loading a script file and the command line (`python -m duetaspan.testing.llm` / `.asr`).

Example:
    >>> import asyncio
    >>> from aiohttp import web
    >>> async def main() -> str:
    ...     async with serve_app(web.Application()) as url:
    ...         return url.split(":")[1]
    >>> asyncio.run(main())
    '//127.0.0.1'
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar, Self

from aiohttp import web


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on loopback right now."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def serve_app(app: web.Application, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Run an aiohttp app on a free loopback port; yields its base URL (`http://127.0.0.1:PORT`)."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    server: Any = site._server  # aiohttp exposes no public accessor for the port of port 0
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


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

    `async with server as base_url:` serves it on a free loopback port (`base_url` ends in `/v1`, what an
    OpenAI client takes); `async with server.serve() as root:` yields the bare `http://127.0.0.1:PORT`.
    """

    description: ClassVar[str] = "Scripted server (tests only)."
    script_help: ClassVar[str] = "JSON script"
    url: str | None = None  # http://127.0.0.1:PORT while served

    def __init__(self, script: dict[str, Any] | None = None) -> None:
        raise NotImplementedError

    def app(self) -> web.Application:
        raise NotImplementedError

    @classmethod
    def from_file(cls, path: str | Path) -> Self:
        return cls(json.loads(Path(path).read_text()))

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:PORT/v1` while served (an OpenAI-compatible base URL)."""
        if self.url is None:
            raise RuntimeError(f"{type(self).__name__} is not running: use `async with server as base_url:`")
        return self.url + "/v1"

    @contextlib.asynccontextmanager
    async def serve(self) -> AsyncIterator[str]:
        """Serve on a free loopback port; yields the root URL (`http://127.0.0.1:PORT`)."""
        async with serve_app(self.app()) as url:
            self.url = url
            try:
                yield url
            finally:
                self.url = None

    async def __aenter__(self) -> str:
        self._serving = self.serve()
        await self._serving.__aenter__()
        return self.base_url

    async def __aexit__(self, *exc: Any) -> None:
        await self._serving.__aexit__(*exc)

    @classmethod
    def main(cls, argv: list[str] | None = None) -> None:
        """The command line: serve a script file (or an empty script) on `--host`/`--port` until killed."""
        parser = argparse.ArgumentParser(description=cls.description)
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, required=True)
        parser.add_argument("--script", type=Path, help=cls.script_help)
        args = parser.parse_args(argv)
        server = cls.from_file(args.script) if args.script else cls()
        print(f"serving on http://{args.host}:{args.port}/v1", flush=True)
        web.run_app(server.app(), host=args.host, port=args.port, print=None)
