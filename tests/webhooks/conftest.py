"""The webhook tests' store on both backends (a SQLite file, a fresh database on the session's PostgreSQL) and
a real HTTP receiver that verifies signatures."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web

from duetaspan.webhooks import SignatureError, verify

SECRET = "whsec_test"


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request, tmp_path):
    from duetaspan.store import open_store

    target = str(tmp_path / "data" / "s.sqlite3") if request.param == "sqlite" else request.getfixturevalue("pg_url")
    opened = await open_store(target, server_id="test")
    yield opened
    await opened.close()


class Receiver:
    """A loopback HTTP receiver: answers each POST with the next of `statuses` (then 200), verifies every
    signature, and keeps what it got. A status of `"hang"` never answers (a timeout)."""

    def __init__(self, statuses: list[Any] | None = None, secret: str = SECRET) -> None:
        self.statuses = list(statuses or [])
        self.secret = secret
        self.got: list[dict[str, Any]] = []
        self.bad_signatures = 0
        self.arrived = asyncio.Event()
        self._release = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        status = self.statuses.pop(0) if self.statuses else 200
        try:
            event = verify(body, request.headers.get("Duetaspan-Signature"), self.secret)
        except SignatureError:
            self.bad_signatures += 1
            return web.Response(status=400, text="bad signature")
        if status == "hang":  # until the test ends (stop releases it)
            await self._release.wait()
        self.got.append({"status": status, "event": event, "body": body})
        self.arrived.set()
        return web.Response(status=int(status), text=f"answer {status}")

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/hook"
        return self.url

    async def stop(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def receiver():
    made: list[Receiver] = []

    async def make(statuses: list[Any] | None = None, secret: str = SECRET) -> Receiver:
        r = Receiver(statuses, secret)
        await r.start()
        made.append(r)
        return r

    yield make
    for r in made:
        await r.stop()
