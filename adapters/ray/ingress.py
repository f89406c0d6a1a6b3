"""The ingress of the Ray Serve deployment: Twilio's webhook and stream socket, with the same routes,
signatures and single-use tokens as a single process, on a FastAPI app that Serve runs as its HTTP ingress.

- `POST /twilio/voice` (signed): asks the engine deployment for a slot (`EngineReplica.place`, one long
  Serve request per call, so Serve's router picks a replica below its `max_ongoing_requests` = slots) and
  answers `<Connect><Stream url="wss://PUBLIC/twilio/stream/<token>">`, or the busy TwiML when no slot frees
  within `placement_timeout_s`. The token seals which replica took the call (see `routing`).
- `WS /twilio/stream/<token>` (signed upgrade): checks Twilio's signature and the seal, connects to the
  replica's relay endpoint (its single-use internal token), then accepts Twilio and relays the stream's text
  messages both ways. If the replica dies, only the calls it carried are closed (1011).
- `POST /twilio/status` (signed), `GET /health` (503 until an engine replica is running, and while the
  deployment drains).
- `POST /admin/drain` (admin role, `$DUETASPAN_ADMIN_TOKEN`): the deployment drains (`control`): new calls
  get the drain TwiML (or a 503 offer), every replica lets its live calls run up to `drain_timeout_s` and
  then ends them (`ended_by: "shutdown"`). `GET /metrics` and `/ray/metrics/targets` take the metrics role.
- With `webrtc` settings, the browser page as on one process (`GET /?token=`, static files, `/webrtc/config`;
  token checked and offers size-checked here): `POST /webrtc/offer` is placed on a replica with a free slot
  (`EngineReplica.offer`, again one Serve request per call), whose own WebRTC peer answers; the answer goes
  back to the page and the media then flows between the browser and that replica. 503 when no slot frees.

Example:
    >>> # see duetaspan.adapters.ray.app.build_app: Serve constructs `RayIngress(config, engine_handle, key)`
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from fastapi import FastAPI, Request, Response, WebSocket
from fastapi.responses import JSONResponse

from duetaspan.adapters.ray.config import RayServeConfig
from duetaspan.adapters.ray.control import (
    DeploymentDrain,
    IngressAdmission,
    control_token,
    drain_replicas,
    roles,
)
from duetaspan.adapters.ray.metrics import TARGETS_PATH, http_sd, live_targets
from duetaspan.adapters.ray.relay import relay
from duetaspan.adapters.ray.replica import PageOffer, Placement, PlaceRequest
from duetaspan.adapters.ray.routing import CallRoute, open_token, seal
from duetaspan.adapters.twilio import twiml
from duetaspan.adapters.twilio.errors import CLOSE_INTERNAL_ERROR, StreamRefused
from duetaspan.adapters.twilio.security import SETTINGS_HEADER, SIGNATURE_HEADER, check_signature, redact
from duetaspan.adapters.twilio.service import TwilioService, TwilioSettings
from duetaspan.adapters.webrtc.service import OfferRefused, OfferRequest, WebRTCService, new_call_id
from duetaspan.observability.metrics import ServeMetrics, add_metrics_route
from duetaspan.pipeline.admission import DRAINING, Refusal

logger = logging.getLogger("duetaspan.ray")

_ENDED_MEMORY = 256
_PLACE_ATTEMPTS = 3


@dataclass
class HeldCall:
    """A call this ingress placed: its Serve request stays open until the call ends."""

    placement: Placement
    placed_at: float = field(default_factory=time.monotonic)
    ended: Placement | None = None


class Placer:
    """Places calls on the engine deployment through a Serve handle and holds each call's request open."""

    def __init__(self, engine: Any, timeout_s: float) -> None:
        self.engine = engine
        self.timeout_s = timeout_s
        self.held: dict[str, HeldCall] = {}
        self.ended: dict[str, HeldCall] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def place(self, request: PlaceRequest | PageOffer, method: str = "place") -> Placement | None:
        """A replica's `placed` answer, or None when no slot freed within the timeout (`method`: `place` for a
        Twilio call, `offer` for a page's WebRTC offer; a refusal with a `status` other than 503, such as a
        rejected SDP offer, is returned as it is: no other replica would take it either)."""
        deadline, attempt = time.monotonic() + self.timeout_s, 0
        while attempt < _PLACE_ATTEMPTS:
            attempt += 1
            left = deadline - time.monotonic()
            if left <= 0:
                break
            gen = getattr(self.engine.options(stream=True), method).remote(request.model_dump())
            try:
                first = Placement.model_validate(await asyncio.wait_for(gen.__anext__(), left))
            except TimeoutError:
                gen.cancel()
                break
            except Exception as exc:  # the chosen replica died before answering: Serve drops it, try again
                gen.cancel()
                logger.warning("call %s: placement attempt %d failed: %r", request.call_sid, attempt, exc)
                await asyncio.sleep(min(0.2 * attempt, max(0.0, deadline - time.monotonic())))
                continue
            if first.kind != "placed":
                logger.warning(
                    "call %s: replica %s refused (%s)", request.call_sid, first.replica, first.reason
                )
                gen.cancel()
                if first.status not in (None, 503):
                    return first
                attempt -= first.reason == DRAINING  # Serve may pick it again: try another until the deadline
                await asyncio.sleep(min(0.1 * attempt, max(0.0, deadline - time.monotonic())))
                continue
            held = HeldCall(first)
            self.held[request.call_sid] = held
            task = asyncio.create_task(self._hold(gen, held), name=f"duetaspan-call-{request.call_sid}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return first
        logger.warning("call %s: no free slot within %.1f s", request.call_sid, self.timeout_s)
        return None

    async def _hold(self, gen: Any, held: HeldCall) -> None:
        sid = held.placement.call_sid
        try:
            async for item in gen:
                message = Placement.model_validate(item)
                if message.kind == "ended":
                    held.ended = message
        except Exception as exc:  # the replica died with the call on it
            held.ended = Placement(
                kind="ended", replica=held.placement.replica, call_sid=sid, reason=repr(exc)
            )
        finally:
            if self.held.get(sid) is held:
                del self.held[sid]
            self.ended[sid] = held
            while len(self.ended) > _ENDED_MEMORY:
                self.ended.pop(next(iter(self.ended)))
            reason = held.ended.reason if held.ended else "?"
            logger.info("call %s on replica %s: ended (%s)", sid, held.placement.replica, reason)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _unplaced(call: Any) -> None:  # the base class's handler: never used, calls run on replicas
    raise RuntimeError("the Ray ingress runs no calls itself")


class RayTwilioService(TwilioService):
    """`TwilioService` whose calls run on engine replicas: same routes, signatures and TwiML."""

    def __init__(
        self, config: RayServeConfig, placer: Placer, key: bytes, admission: IngressAdmission
    ) -> None:
        settings = TwilioSettings(
            public_url=config.public_url,
            credentials=config.credentials,
            token_ttl_s=config.token_ttl_s,
            limits=config.limits,
            drain_redirect_url=config.drain_redirect_url,
        )
        super().__init__(settings, _unplaced, max_calls=0, admission=admission)
        self.config = config
        self.placer = placer
        self.key = key
        self.relayed: dict[str, dict[str, Any]] = {}  # call_sid -> how its relay ended (tests, logs)
        self._http: aiohttp.ClientSession | None = None
        self.capacity: int | None = None  # set by the ingress from Serve's replica count

    @property
    def free_slots(self) -> int | None:  # type: ignore[override]
        """Slots left on running replicas as this ingress sees them (None until known)."""
        if self.capacity is None:
            return None
        return max(0, self.capacity - len(self.placer.held))

    async def aclose(self) -> None:
        await self.placer.aclose()
        if self._http is not None:
            await self._http.close()
        await super().aclose()

    async def voice_webhook(self, request: Request) -> Response:
        params = await self._signed_form(request, self.settings.voice_url)
        if isinstance(params, Response):
            return params
        call_sid = params.get("CallSid", "")
        if not call_sid:
            return Response("CallSid missing", status_code=400, media_type="text/plain")
        caller, called = params.get("From", ""), params.get("To", "")
        if self.admission.draining:  # `POST /admin/drain`: the drain TwiML (redirect, else busy)
            refusal = Refusal(DRAINING, f"the deployment is draining ({self.admission.drain_reason})")
            return self._refuse_call(
                refusal, call_sid, caller, request.client.host if request.client else "?"
            )
        placed = await self.placer.place(
            PlaceRequest(
                call_sid=call_sid,
                account_sid=params.get("AccountSid", ""),
                from_number=caller,
                to_number=called,
            )
        )
        if placed is None or placed.relay_url is None:
            logger.warning("call %s from %s: refused, no replica has a free slot", call_sid, caller or "?")
            self.on_refusal("busy")
            return Response(twiml.busy(), media_type="application/xml")
        route = CallRoute(
            relay_url=placed.relay_url,
            call_sid=call_sid,
            replica=placed.replica,
            expires_at=time.time() + self.settings.token_ttl_s,
        )
        token = seal(route, self.key)
        parameters = {"from_number": caller, "to_number": called, "direction": params.get("Direction", "")}
        status_callback = self.settings.status_url if self.settings.stream_status_callbacks else None
        body = twiml.connect_stream(self.settings.stream_url(token), parameters, status_callback)
        logger.info(
            "call %s from %s: placed on replica %s, token %s", call_sid, caller, placed.replica, redact(token)
        )
        return Response(body, media_type="application/xml")

    async def stream_socket(self, websocket: WebSocket, token: str) -> None:
        try:
            check_signature(
                self.keys,
                self.settings.stream_url(token),
                {},
                websocket.headers.get(SIGNATURE_HEADER),
                websocket.headers.get(SETTINGS_HEADER),
                shown_url=self.settings.stream_url(redact(token)),
            )
            route = open_token(token, self.key)
        except StreamRefused as exc:
            logger.warning("stream upgrade refused (HTTP %d): %s", exc.status, exc)
            await websocket.send_denial_response(
                Response(type(exc).__name__, status_code=exc.status, media_type="text/plain")
            )
            return
        if self._http is None:
            self._http = aiohttp.ClientSession()
        try:
            upstream = await self._http.ws_connect(
                route.relay_url, max_msg_size=self.settings.limits.max_message_bytes * 4, autoping=True
            )
        except aiohttp.WSServerHandshakeError as exc:
            logger.warning(
                "call %s: replica %s refused the relay (HTTP %d)", route.call_sid, route.replica, exc.status
            )
            await websocket.send_denial_response(Response("relay refused", status_code=exc.status))
            return
        except (aiohttp.ClientError, OSError) as exc:
            logger.error("call %s: replica %s unreachable: %r", route.call_sid, route.replica, exc)
            await websocket.send_denial_response(Response("replica unreachable", status_code=503))
            return
        await websocket.accept()
        outcome = await relay(websocket, upstream)
        self.relayed[route.call_sid] = {"replica": route.replica, **outcome}
        while len(self.relayed) > _ENDED_MEMORY:
            self.relayed.pop(next(iter(self.relayed)))
        log = logger.warning if outcome["close_code"] == CLOSE_INTERNAL_ERROR else logger.info
        log("call %s: relay to replica %s ended: %s", route.call_sid, route.replica, outcome)


class RayWebRTCService(WebRTCService):
    """`WebRTCService` whose calls run on engine replicas: same page, token checks and offer limits; each
    offer is answered by the replica that takes the call."""

    def __init__(
        self, config: RayServeConfig, placer: Placer, running: Any, admission: IngressAdmission
    ) -> None:
        super().__init__(config.webrtc)
        self.placer = placer
        self.admission = admission
        self._running = running  # () -> engine replicas running
        self.capacity: int | None = None  # set by the ingress from Serve's replica count

    @property
    def ready(self) -> bool:
        return self._running() > 0

    @property
    def free_slots(self) -> int:  # type: ignore[override]
        """Slots left on running replicas as this ingress sees them (Twilio and page calls together)."""
        return max(0, (self.capacity or 0) - len(self.placer.held))

    async def _answer(self, offer: OfferRequest, peer: str, call_id: str | None = None) -> dict[str, Any]:
        if not self.ready:
            raise OfferRefused(503, "the agent is still loading; try again shortly")
        if self.admission.draining:
            raise OfferRefused(
                503, f"the deployment is draining ({self.admission.drain_reason}): no new calls"
            )
        call_id = call_id or new_call_id()
        request = PageOffer(call_sid=call_id, sdp=offer.sdp, type=offer.type, peer=peer)
        placed = await self.placer.place(request, method="offer")
        if placed is None:
            raise OfferRefused(503, "all call slots are busy (no replica has a free slot)")
        if placed.kind != "placed" or placed.answer is None:
            raise OfferRefused(placed.status or 503, placed.reason or "the replica refused the offer")
        logger.info("page call %s from %s: answered by replica %s", call_id, peer, placed.replica)
        return {**placed.answer, "call_id": call_id}


class RayIngress:
    """The Serve ingress deployment class (wrapped with `serve.ingress()` by `build_app`): one FastAPI app
    with `/health`, the Twilio routes and/or the WebRTC page, placing calls on the engine deployment."""

    async def __init__(self, config: RayServeConfig, engine: Any, key: bytes) -> None:
        self.config = config
        self.placer = Placer(engine, config.placement_timeout_s)
        self.admission = IngressAdmission(lambda: len(self.placer.held))
        self.drain = DeploymentDrain(self.admission, self._drain_replicas, config.drain_timeout_s)
        self._control_token = control_token(key)
        self.twilio = RayTwilioService(config, self.placer, key, self.admission) if config.twilio else None
        self.webrtc = (
            RayWebRTCService(config, self.placer, lambda: self.running_replicas, self.admission)
            if config.webrtc
            else None
        )
        self.metrics_role, self.admin_role = roles(config)
        self.running_replicas = 0
        transports = [
            n for n, on in (("twilio", self.twilio is not None), ("webrtc", self.webrtc is not None)) if on
        ]
        self.metrics = ServeMetrics(engine=None, transports=transports)  # engines live in the replicas
        if self.twilio is not None:
            self.twilio.on_refusal = self.metrics.webhook_refused
        self.drain.on_state.append(self.metrics.drain_state)
        self._watch = asyncio.create_task(self._watch_replicas(), name="duetaspan-replica-watch")

    def __serve_build_asgi_app__(self) -> FastAPI:
        from duetaspan.server import create_app, mount

        app = create_app(ready=lambda: self.running_replicas > 0, title="duetaspan (Ray Serve)")
        app.state.drain, app.state.admin = self.drain, self.admin_role  # POST /admin/drain, /health
        if self.twilio is not None:
            mount(app, self.twilio, "twilio")
        if self.webrtc is not None:
            mount(app, self.webrtc, "webrtc")
        if self.config.calls_route:
            app.add_api_route("/ray/calls", self.calls, methods=["GET"], include_in_schema=False)
        add_metrics_route(app, self.metrics, self.metrics_role)
        app.add_api_route(TARGETS_PATH, self.metrics_targets, methods=["GET"], include_in_schema=False)
        return app

    async def metrics_targets(self, request: Request) -> Response:
        """The engine replicas' `/metrics` addresses for Prometheus' `http_sd_configs`."""
        refused = self.metrics_role.refusal(request)
        if refused is not None:
            return refused
        return JSONResponse(http_sd(await live_targets(self.config.app_name)))

    async def _drain_replicas(self, reason: str) -> dict[str, int]:
        """`POST /admin/drain` to every engine replica that announces its relay endpoint."""
        return await drain_replicas(await live_targets(self.config.app_name), self._control_token, reason)

    async def calls(self) -> dict[str, Any]:
        """Where calls went and how they ended (`GET /ray/calls` with `calls_route`: operators, tests)."""
        return {
            "running_replicas": self.running_replicas,
            "held": {
                sid: {"replica": h.placement.replica, "pid": h.placement.pid}
                for sid, h in self.placer.held.items()
            },
            "ended": {
                sid: {
                    "replica": h.placement.replica,
                    "reason": h.ended.reason if h.ended else None,
                    "first_media_out_at": h.ended.first_media_out_at if h.ended else None,
                }
                for sid, h in self.placer.ended.items()
            },
            "relayed": self.twilio.relayed if self.twilio is not None else {},
        }

    async def _watch_replicas(self) -> None:
        """Track how many engine replicas Serve has running (for `/health` and the free-slot estimate)."""
        from ray import serve

        while True:
            try:
                status = await asyncio.to_thread(serve.status)
                app = status.applications.get(self.config.app_name)
                deployment = app.deployments.get("EngineReplica") if app else None
                running = int(deployment.replica_states.get("RUNNING", 0)) if deployment else 0
                self.running_replicas = running
                for service in (self.twilio, self.webrtc):
                    if service is not None:
                        service.capacity = running * self.config.replica.max_calls
            except Exception as exc:
                logger.debug("replica watch: %r", exc)
            await asyncio.sleep(1.0)

    async def __del__(self) -> None:
        self._watch.cancel()
        if self.twilio is not None:
            await self.twilio.aclose()
        else:
            await self.placer.aclose()
        if self.webrtc is not None:
            await self.webrtc.aclose()
