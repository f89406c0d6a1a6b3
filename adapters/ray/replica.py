"""One engine replica of the Ray Serve deployment: an `Agent` (engine, runner, call slots) on its GPU, and a
small relay endpoint on the node's own address where the ingress hands it each placed call's Twilio stream.

A call is one long-running Serve request, `place(...)`, from the webhook to the end of the call: it reserves
a slot, yields the relay URL with a single-use internal token, and finishes when the call ends. So Serve's
per-replica count of ongoing requests is the count of occupied slots, which is what `max_ongoing_requests`
(= slots: never over-placed) and autoscaling (`target_ongoing_requests`) look at, and what a stopping replica
waits for (Serve sends a stopping replica no new calls). The replica drains then too (`control.ReplicaDrain`:
it reads its own state in the Serve controller): its slots refuse new calls (`draining`), its `/health`
answers 503, the live calls go on, and at `drain_timeout_s` it ends what is left the way a hang-up does
(records with `ended_by: "shutdown"`), before Serve's `graceful_shutdown_timeout_s` would kill it. The
ingress's `POST /admin/drain` drains every replica the same way (`POST /admin/drain` on its relay endpoint,
with the deployment's internal drain token).

A WebRTC page call is one long-running Serve request too, `offer(...)`: the replica answers the page's SDP
offer with its own aiortc peer (ICE host candidates on this node: the media flows between the browser and
this replica, not through the ingress), yields the answer, and finishes when the peer connection ends.

Example (what the ingress does; see `duetaspan.adapters.ray.ingress`):
    >>> # gen = engine.options(stream=True).place.remote(PlaceRequest(call_sid="CA1", account_sid="AC1").model_dump())
    >>> # placed = await gen.__anext__()   # {"kind": "placed", "relay_url": "ws://10.0.0.7:41234/relay/...", ...}
    >>> # ...the ingress relays the stream there...
    >>> # ended = await gen.__anext__()    # {"kind": "ended", "reason": "stop", ...}
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request, Response, WebSocket
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from duetaspan.access import BearerRole
from duetaspan.adapters.ray.config import RayServeConfig
from duetaspan.adapters.ray.control import DRAIN_PATH, ReplicaDrain, control_token, roles, serve_replica_state
from duetaspan.adapters.ray.metrics import announce
from duetaspan.adapters.twilio.bridge import AGENT_IN_RATE, agent_call_handler
from duetaspan.adapters.twilio.errors import StreamRefused
from duetaspan.adapters.twilio.rest import TwilioRest
from duetaspan.adapters.twilio.security import StreamTokens, redact
from duetaspan.adapters.twilio.service import end_stream
from duetaspan.adapters.twilio.stream import CallControl, StarletteSocket, TwilioCall, run_stream
from duetaspan.errors import DuetaspanError
from duetaspan.observability.metrics import ServeMetrics, add_metrics_route
from duetaspan.pipeline.admission import Refusal, Slot

logger = logging.getLogger("duetaspan.ray")

RELAY_PATH = "/relay"


class ReplicaUnhealthy(DuetaspanError):
    """The replica's engine clock stopped; Serve replaces the replica (its calls have ended)."""


class PlaceRequest(BaseModel):
    """What the ingress asks a replica for: a slot for this call."""

    call_sid: str
    account_sid: str
    from_number: str = ""
    to_number: str = ""


class PageOffer(BaseModel):
    """A browser page's SDP offer for a replica (already size-checked and validated by the ingress)."""

    call_sid: str  # the page call's id, `web-...`, chosen by the ingress
    sdp: str
    type: Literal["offer"] = "offer"
    peer: str = "?"


class Placement(BaseModel):
    """The messages of one `place` request, in order: `placed` (or `refused`), then `ended`."""

    kind: Literal["placed", "refused", "ended"]
    replica: str
    call_sid: str
    relay_url: str | None = None
    reason: str | None = None
    pid: int | None = None
    media_in: int = 0
    media_out: int = 0
    first_media_out_at: float | None = None  # time.monotonic() on the replica's node (benchmarks)
    answer: dict[str, str] | None = None  # WebRTC: the SDP answer (`sdp`, `type`, `pc_id`)
    status: int | None = None  # WebRTC refusal: the HTTP status the page gets (400 bad SDP, 503 busy)


@dataclass
class _Reservation:
    """A slot from `place` to the end of its call."""

    call_sid: str
    started: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    call: TwilioCall | None = None
    reason: str | None = None
    slot: Slot | None = None  # the call's slot in the agent's admission (what a drain ends)


def replica_name() -> str:
    """Serve's id of the running replica (its actor is `SERVE_REPLICA::<app>#<deployment>#<id>`)."""
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # outside Serve (unit use): the process is the replica
        return f"pid{os.getpid()}"


def _quiet_pipecat(level: str) -> None:
    """Pipecat logs every frame processor at DEBUG through loguru; in a replica that floods Ray's log."""
    try:
        from loguru import logger as loguru_logger
    except ImportError:
        return
    loguru_logger.remove()
    loguru_logger.add(sys.stderr, level=level)


def node_address() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:
        return "127.0.0.1"


class EngineReplica:
    """A Serve deployment class (applied by `duetaspan.adapters.ray.app.build_app`): one agent, its slots,
    its relay endpoint. Serve constructs it with the deployment's `RayServeConfig`."""

    async def __init__(self, config: RayServeConfig, key: bytes | None = None) -> None:
        from duetaspan.agent import Agent

        self.config = config
        self.name = replica_name()
        _quiet_pipecat(config.replica.pipecat_log_level)
        spec = config.agent
        kwargs = {"max_calls": config.replica.max_calls, **spec.overrides()}
        self.agent = Agent(config=spec.config, **kwargs) if spec.config else Agent(**kwargs)
        await self.agent.start()
        if self.agent.runner is None:
            raise ReplicaUnhealthy(f"replica {self.name}: the agent started without an engine runner")
        self.slots = self.agent.runner.max_calls
        self.tokens = StreamTokens(ttl_s=config.token_ttl_s)
        self.reservations: dict[str, _Reservation] = {}  # internal token -> reservation
        self.calls_served = 0
        self.refused_draining = 0  # calls Serve's router sent while draining (`router.OpenReplicaRouter`)
        self.rest = TwilioRest(config.credentials) if config.credentials is not None else None
        self.control = (
            CallControl(hang_up=self.rest.hang_up, transfer=self.rest.transfer, apologize=self.rest.apologize)
            if self.rest
            else None
        )
        self.webrtc = None
        if config.webrtc is not None:
            from duetaspan.adapters.webrtc.service import WebRTCService

            self.webrtc = WebRTCService(config.webrtc, agent=self.agent)
        self.handler = agent_call_handler(self.agent)
        self.metrics = self._observe()
        self.drain = ReplicaDrain(self.name, self.agent.admission, config.drain_timeout_s)
        self.drain.drain.on_state.append(self.metrics.drain_state)
        # `/admin/drain` of the relay endpoint: only the ingress knows this token (none: no such route)
        self._control = BearerRole("drain", control_token(key), "internal") if key else None
        self._watch = asyncio.create_task(self.drain.watch(self._serve_state), name="duetaspan-stop-watch")
        self._server, self._server_task, self.relay_base = await self._start_relay()
        self._announce = asyncio.create_task(
            announce(config.app_name, self.name, self.relay_base.split("://", 1)[1]), name="duetaspan-metrics"
        )
        logger.info("replica %s ready: %d call slots, relay %s", self.name, self.slots, self.relay_base)

    # --- what Serve calls ----------------------------------------------------------------------------------
    async def place(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Reserve a slot for one call, yield where its stream goes, then yield how it ended."""
        req = PlaceRequest.model_validate(request)
        base = {"replica": self.name, "call_sid": req.call_sid, "pid": os.getpid()}
        if self.drain.draining:  # the ingress tries another replica (Serve's router should not send it)
            self.refused_draining += 1
            yield Placement(kind="refused", status=503, reason="draining", **base).model_dump()
            return
        if self.free_slots <= 0:
            logger.warning(
                "replica %s: call %s refused, all %d slots busy", self.name, req.call_sid, self.slots
            )
            self.metrics.call_ended("twilio", "refused")
            yield Placement(kind="refused", reason="no free slot", **base).model_dump()
            return
        if self.tokens.answered(req.call_sid):  # a replayed webhook: this call has (had) its slot
            logger.warning("replica %s: call %s refused, placed already", self.name, req.call_sid)
            yield Placement(kind="refused", reason="call placed already", **base).model_dump()
            return
        slot = self.agent.admission.try_acquire("twilio", req.call_sid, ttl_s=self.config.token_ttl_s)
        if isinstance(slot, Refusal):
            yield Placement(kind="refused", status=503, reason=slot.reason, **base).model_dump()
            return
        grant = self.tokens.issue(
            call_sid=req.call_sid,
            account_sid=req.account_sid,
            from_number=req.from_number,
            to_number=req.to_number,
        )
        reservation = _Reservation(req.call_sid, slot=slot)
        self.reservations[grant.token] = reservation
        try:
            url = f"{self.relay_base}{RELAY_PATH}/{grant.token}"
            logger.info(
                "replica %s: call %s placed (relay token %s)", self.name, req.call_sid, redact(grant.token)
            )
            yield Placement(kind="placed", relay_url=url, **base).model_dump()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(reservation.started.wait(), self.config.token_ttl_s)
            if not reservation.started.is_set():
                reservation.reason = "the stream never arrived"
            else:
                await reservation.ended.wait()
            call = reservation.call
            yield Placement(
                kind="ended",
                reason=reservation.reason,
                media_in=call.stats.media_in if call else 0,
                media_out=call.stats.media_out if call else 0,
                first_media_out_at=call.stats.first_media_out_at if call else None,
                **base,
            ).model_dump()
        finally:
            if not reservation.started.is_set():  # never streamed (or the ingress gave up): free the slot
                self.reservations.pop(grant.token, None)
                slot.release()
                with contextlib.suppress(StreamRefused):
                    self.tokens.redeem(grant.token)

    async def offer(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Answer one page's WebRTC offer on a slot of this replica, yield the answer, then how it ended.

        The call is peer-to-peer with the browser: if the ingress drops this request, the call goes on and
        keeps its slot until the peer connection ends.
        """
        from duetaspan.adapters.webrtc.service import OfferRefused, OfferRequest

        req = PageOffer.model_validate(request)
        base = {"replica": self.name, "call_sid": req.call_sid, "pid": os.getpid()}
        if self.webrtc is None:
            yield Placement(kind="refused", status=404, reason="WebRTC is not enabled", **base).model_dump()
            return
        if self.drain.draining:
            yield Placement(kind="refused", status=503, reason="draining", **base).model_dump()
            return
        if self.free_slots <= 0:
            logger.warning("replica %s: page call %s refused, all slots busy", self.name, req.call_sid)
            self.metrics.call_ended("webrtc", "refused")
            yield Placement(kind="refused", status=503, reason="no free slot", **base).model_dump()
            return
        key = f"webrtc:{req.call_sid}"
        reservation = _Reservation(req.call_sid)
        self.reservations[key] = reservation
        try:
            answer = await self.webrtc._answer(
                OfferRequest(sdp=req.sdp, type=req.type), req.peer, req.call_sid
            )
        except BaseException as exc:
            self.reservations.pop(key, None)
            if not isinstance(exc, OfferRefused):
                raise
            yield Placement(kind="refused", status=exc.status, reason=str(exc), **base).model_dump()
            return
        call = self.webrtc.calls[req.call_sid]
        task = call.task
        assert task is not None  # set by `_answer` before it returns
        reservation.started.set()

        def ended(_task: asyncio.Task[None]) -> None:
            self.reservations.pop(key, None)
            self.calls_served += 1

        task.add_done_callback(ended)
        answer.pop("call_id", None)
        logger.info("replica %s: page call %s answered", self.name, req.call_sid)
        yield Placement(kind="placed", answer=answer, **base).model_dump()
        await asyncio.shield(task)
        yield Placement(kind="ended", reason="the peer connection ended", **base).model_dump()

    def record_routing_stats(self) -> dict[str, Any]:
        """What Serve's router (`router.OpenReplicaRouter`) knows of this replica: draining gets no calls."""
        return {"draining": self.drain.draining}

    async def check_health(self) -> None:
        """Serve's periodic health check: a stopped engine clock makes Serve replace this replica."""
        runner = self.agent.runner
        if runner is None or not runner.running:
            raise ReplicaUnhealthy(f"replica {self.name}: the engine clock is not running")
        if self._server_task.done():
            raise ReplicaUnhealthy(f"replica {self.name}: the relay endpoint stopped")

    async def __del__(self) -> None:
        """Called by Serve after draining (or at shutdown): stop the relay and the engine."""
        self._watch.cancel()
        self._announce.cancel()  # leaves the metrics directory
        await asyncio.gather(self._watch, self._announce, return_exceptions=True)
        self._server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server_task, 5)
        if self.webrtc is not None:
            await self.webrtc.aclose()
        await self.agent.stop()
        if self.rest is not None:
            await self.rest.aclose()

    # --- slots and the relay endpoint --------------------------------------------------------------------
    @property
    def free_slots(self) -> int:
        return max(0, min(self.slots - len(self.reservations), self.agent.free_slots))

    def stats(self) -> dict[str, Any]:
        return {
            "replica": self.name,
            "pid": os.getpid(),
            "slots": self.slots,
            "free_slots": self.free_slots,
            "live_calls": sum(r.started.is_set() for r in self.reservations.values()),
            "calls_served": self.calls_served,
            "draining": self.drain.draining,
            "refused_draining": self.refused_draining,
            "drain_state": self.drain.state,
        }

    def _serve_state(self) -> str | None:
        return serve_replica_state(self.config.app_name, "EngineReplica", self.name)

    async def _health(self) -> Response:
        """This replica alone: 503 while it drains (or its engine is down), else 200."""
        body = self.stats()
        ok = not self.drain.draining and self.agent.runner is not None and self.agent.runner.running
        body["status"] = "draining" if self.drain.draining else ("ready" if ok else "engine_down")
        return JSONResponse(body, status_code=200 if ok else 503)

    async def _admin_drain(self, request: Request) -> Response:
        refused = self._control.refusal(request) if self._control else JSONResponse({"error": "off"}, 403)
        if refused is not None:
            logger.warning("replica %s: refused POST %s: HTTP %d", self.name, DRAIN_PATH, refused.status_code)
            return refused
        started = self.drain.begin(f"POST {DRAIN_PATH} from the ingress")
        return JSONResponse(
            {"draining": True, "started": started, "live_calls": self.agent.admission.held}, 202
        )

    def _observe(self) -> ServeMetrics:
        """This replica's metrics (and traces, when `[tracing]` / `OTEL_*` ask) for every call it runs."""
        from duetaspan.observability.observer import Observability
        from duetaspan.observability.tracing import Tracing

        transports = [
            n for n, on in (("twilio", self.config.twilio), ("webrtc", self.webrtc is not None)) if on
        ]
        metrics = ServeMetrics(engine=lambda: self.agent.runner, transports=transports)
        if self.agent.registry is not None:
            metrics.watch_registry(self.agent.registry)
        tracing = Tracing.from_config(self.agent.config.tracing, router_model=self.agent.config.router.model)
        self.agent.observability = Observability(metrics, tracing)
        return metrics

    async def _start_relay(self) -> tuple[uvicorn.Server, asyncio.Task[None], str]:
        app = FastAPI(docs_url=None, redoc_url=None)
        app.add_api_websocket_route(RELAY_PATH + "/{token}", self._relay_socket)
        app.add_api_route("/stats", lambda: self.stats(), methods=["GET"])
        app.add_api_route("/health", self._health, methods=["GET"])
        app.add_api_route(DRAIN_PATH, self._admin_drain, methods=["POST"])
        add_metrics_route(app, self.metrics, roles(self.config)[0])
        host = self.config.internal_host or node_address()
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(app, log_config=None, lifespan="off", ws_max_size=1 << 20, access_log=False)
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]), name="duetaspan-relay")
        deadline = time.monotonic() + 10
        while not server.started:
            if task.done():
                task.result()
                raise ReplicaUnhealthy(f"relay endpoint on {host}:{port} did not start")
            if time.monotonic() > deadline:
                raise ReplicaUnhealthy(f"relay endpoint on {host}:{port} did not start within 10 s")
            await asyncio.sleep(0.01)
        shown = f"[{host}]" if ":" in host else host
        return server, task, f"ws://{shown}:{port}"

    async def _relay_socket(self, websocket: WebSocket, token: str) -> None:
        try:
            grant = self.tokens.redeem(token)
        except StreamRefused as exc:
            logger.warning("replica %s: relay refused (HTTP %d): %s", self.name, exc.status, exc)
            await websocket.send_denial_response(
                Response(type(exc).__name__, status_code=exc.status, media_type="text/plain")
            )
            return
        reservation = self.reservations.get(token)
        if reservation is None:  # redeemed a token whose placement was given up
            await websocket.send_denial_response(Response("TokenExpired", status_code=410))
            return
        await websocket.accept()

        def started(call: TwilioCall) -> None:
            reservation.call = call
            reservation.started.set()
            if reservation.slot is not None:  # a drain ends it as a hang-up does
                reservation.slot.on_end(lambda: end_stream(call, "the replica is draining"))

        reservation.started.set()  # the slot is now the stream's, whatever `place` does next
        if reservation.slot is not None:
            reservation.slot.hold()
        try:
            call = await run_stream(
                StarletteSocket(websocket),
                self.handler,
                grant=grant,
                limits=self.config.limits,
                control=self.control,
                in_rate=AGENT_IN_RATE,
                on_start=started,
            )
            reservation.reason = call.end_reason if call is not None else "the stream never started"
            self.calls_served += call is not None
        finally:
            self.reservations.pop(token, None)
            if reservation.slot is not None:
                reservation.slot.release()
            reservation.ended.set()
