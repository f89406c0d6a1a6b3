"""The web app every transport shares: one FastAPI app with `GET /health`, onto which transports mount their
routes (Twilio: `TwilioService.mount`; WebRTC: its own `mount`), served by uvicorn.

A transport is anything with `mount(app)` and, optionally, `async aclose()` (called on shutdown) and
`free_slots` (reported by `/health`). `GET /health` answers 503 until `ready()` is true, then 200 with the
mounted transports, so a load balancer or test waits for the model to load before sending calls; and 503
again (`"status": "engine_down"`) while `down()` names a reason, e.g. an engine that went down under calls.

Example:
    >>> app = create_app(ready=lambda: True)
    >>> # mount(app, TwilioService(...)); await serve(app, host="0.0.0.0", port=8080)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from duetaspan import __version__
from duetaspan.http_guard import install_log_redaction

logger = logging.getLogger("duetaspan.server")

HEALTH_PATH = "/health"
SHUTDOWN_GRACE_S = 10.0  # a cancelled `serve` waits this long for connections to close, then forces exit


class Mountable(Protocol):
    """What a transport offers the shared app."""

    def mount(self, app: FastAPI) -> None: ...


def create_app(
    *,
    ready: Callable[[], bool] = lambda: True,
    down: Callable[[], str | None] = lambda: None,
    title: str = "duetaspan",
) -> FastAPI:
    """A FastAPI app with `/health`; `app.state.transports` lists what `mount` added. `down()` returning a
    reason (e.g. the engine went down after failed steps) makes `/health` 503 with `"status": "engine_down"`.
    """

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        for transport in app.state.transports.values():
            aclose = getattr(transport, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except Exception:
                    logger.exception("closing transport %s failed", type(transport).__name__)
        for hook in app.state.shutdown_hooks:  # e.g. flushing traces: uvicorn may end the process right after
            try:
                await hook()
            except Exception:
                logger.exception("shutdown hook %r failed", hook)

    app = FastAPI(title=title, version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.transports = {}
    app.state.shutdown_hooks = []  # async callables run at shutdown, after the transports' `aclose`
    app.state.ready = ready
    app.state.down = down

    @app.get(HEALTH_PATH, include_in_schema=False)
    async def health() -> JSONResponse:
        problem = app.state.down() if app.state.ready() else None
        body: dict[str, Any] = {
            "status": "starting" if not app.state.ready() else ("engine_down" if problem else "ready"),
            "version": __version__,
        }
        if problem:
            body["error"] = problem
        body["transports"] = {
            name: {"free_slots": getattr(t, "free_slots", None)} for name, t in app.state.transports.items()
        }
        return JSONResponse(body, status_code=200 if body["status"] == "ready" else 503)

    return app


def mount(app: FastAPI, transport: Mountable, name: str | None = None) -> None:
    """Add a transport's routes to the app (`name` defaults to the transport's class name, lower case)."""
    name = name or type(transport).__name__.lower().removesuffix("service")
    if name in app.state.transports:
        raise ValueError(f"a transport named {name!r} is already mounted")
    transport.mount(app)
    app.state.transports[name] = transport


async def serve(app: FastAPI, *, host: str, port: int, ws_max_size: int = 1 << 20) -> None:
    """Serve `app` until cancelled or interrupted (SIGINT/SIGTERM finish in-flight requests first).

    `ws_max_size` is the WebSocket frame ceiling at the protocol level; transports enforce their own, smaller
    message limits so they can log which call broke it.
    """
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,  # keep the process's logging setup (the CLI configures it)
        ws_max_size=ws_max_size,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    install_log_redaction()  # stream and page tokens travel in URLs: no log line of the process shows them
    logger.info("serving on http://%s:%d", host, port)
    task = asyncio.ensure_future(server.serve())
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        # Cancelled (e.g. `agent.serve()` as a task): shut down like Ctrl-C does, closing connections and
        # running the app's shutdown (transports' `aclose`), instead of tearing the lifespan down mid-wait.
        server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(task), SHUTDOWN_GRACE_S)
        except (TimeoutError, asyncio.CancelledError):
            server.force_exit = True
            await asyncio.gather(task, return_exceptions=True)
        raise
