"""The web app every transport shares: one FastAPI app with the health routes, onto which transports mount
their routes (Twilio: `TwilioService.mount`; WebRTC: its own `mount`), served by uvicorn.

A transport is anything with `mount(app)` and, optionally, `async aclose()` (called on shutdown) and
`free_slots` (reported by `/health`). `GET /health` and `GET /health/ready` answer 503 until `ready()` is
true, again (`"status": "engine_down"`) while `down()` names a reason (an engine that went down under calls),
and from the moment the server drains (`app.state.drain`, `duetaspan.drain`); else 200 with the mounted
transports, so a load balancer waits for the model to load and moves away from a draining or broken server.
`GET /health/live` answers 200 as long as the process serves (a liveness probe must not kill a draining
server). `POST /admin/drain` (admin role, `duetaspan.access`) starts the drain.

`serve(app, ..., drain=drain)` hands SIGTERM and SIGINT to the drain instead of stopping at once.

Example:
    >>> app = create_app(ready=lambda: True)
    >>> # mount(app, TwilioService(...)); await serve(app, host="0.0.0.0", port=8080)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from duetaspan import __version__
from duetaspan.http_guard import install_log_redaction

if TYPE_CHECKING:
    from duetaspan.drain import Drain

logger = logging.getLogger("duetaspan.server")

HEALTH_PATH = "/health"
READY_PATH = "/health/ready"
LIVE_PATH = "/health/live"
DRAIN_PATH = "/admin/drain"
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
    app.state.drain = None  # a `duetaspan.drain.Drain` when the server can drain
    app.state.admin = None  # the admin role (`duetaspan.access.BearerRole`); None: no /admin routes answer

    async def health() -> JSONResponse:
        drain = app.state.drain
        problem = app.state.down() if app.state.ready() else None
        status = "starting" if not app.state.ready() else ("engine_down" if problem else "ready")
        if status == "ready" and drain is not None and drain.draining:
            status = "draining"
        body: dict[str, Any] = {"status": status, "version": __version__}
        if problem:
            body["error"] = problem
        body["transports"] = {
            name: {"free_slots": getattr(t, "free_slots", None)} for name, t in app.state.transports.items()
        }
        return JSONResponse(body, status_code=200 if status == "ready" else 503)

    app.add_api_route(HEALTH_PATH, health, methods=["GET"], include_in_schema=False)
    app.add_api_route(READY_PATH, health, methods=["GET"], include_in_schema=False)

    @app.get(LIVE_PATH, include_in_schema=False)
    async def live() -> JSONResponse:
        drain = app.state.drain
        return JSONResponse({"status": "live", "draining": bool(drain is not None and drain.draining)})

    @app.post(DRAIN_PATH, include_in_schema=False)
    async def start_drain(request: Request) -> Response:
        admin, drain = app.state.admin, app.state.drain
        refused = (
            admin.refusal(request) if admin is not None else JSONResponse({"error": "no admin role"}, 403)
        )
        if refused is not None:
            logger.warning("refused POST %s: HTTP %d", DRAIN_PATH, refused.status_code)
            return refused
        if drain is None:
            return JSONResponse({"error": "this server cannot drain"}, status_code=409)
        started = drain.begin(f"POST {DRAIN_PATH}")
        return JSONResponse(
            {"draining": True, "started": started, "live_calls": drain.admission.held}, status_code=202
        )

    return app


def mount(app: FastAPI, transport: Mountable, name: str | None = None) -> None:
    """Add a transport's routes to the app (`name` defaults to the transport's class name, lower case)."""
    name = name or type(transport).__name__.lower().removesuffix("service")
    if name in app.state.transports:
        raise ValueError(f"a transport named {name!r} is already mounted")
    transport.mount(app)
    app.state.transports[name] = transport


class _Server(uvicorn.Server):
    """uvicorn, with SIGTERM/SIGINT handed to `on_signal` (the drain) instead of stopping at once."""

    def __init__(self, config: uvicorn.Config, on_signal: Callable[[int], None] | None) -> None:
        super().__init__(config)
        self.on_signal = on_signal

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if self.on_signal is None or threading.current_thread() is not threading.main_thread():
            with super().capture_signals():
                yield
            return
        loop = asyncio.get_running_loop()
        on_signal = self.on_signal

        def handle(signum: int, _frame: object) -> None:
            loop.call_soon_threadsafe(on_signal, signum)

        previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def stop(self, force: bool = False) -> None:
        self.should_exit = True
        self.force_exit = self.force_exit or force


async def serve(
    app: FastAPI, *, host: str, port: int, ws_max_size: int = 1 << 20, drain: Drain | None = None
) -> None:
    """Serve `app` until cancelled or interrupted.

    Without `drain`, SIGINT/SIGTERM finish in-flight requests and stop. With it, they go to `drain.signal`
    (the first drains: no new calls, live ones go on; see `duetaspan.drain`), which stops the server when it
    is done, and `serve` returns (`drain.signals` says which came). `ws_max_size` is the WebSocket frame ceiling at the
    protocol level; transports enforce their own, smaller message limits so they can log which call broke it.
    """
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,  # keep the process's logging setup (the CLI configures it)
        ws_max_size=ws_max_size,
        lifespan="on",
    )
    server = _Server(config, drain.signal if drain is not None else None)
    if drain is not None:
        drain.stop_server = server.stop
        app.state.drain = drain
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
