"""Serving one agent: the web app with `/health`, the transports mounted on it (Twilio Media Streams, the
WebRTC browser page) and the order things start in. `Agent.serve()` / `Agent.run()` and `duetaspan serve`
all run `serve_agent`, so a script and the command line build exactly the same server.

Each setting comes from the call's arguments first (the command's flags), then the agent's `agent.toml`:
`[server] host` / `port`, `[twilio] public_url` and the credential variable names (`account_sid_env`,
`auth_token_env`), `[webrtc] ice_servers`. Everything is checked before the model loads, so a missing
public URL or Twilio credential fails in a second, not after minutes of loading weights.

Start order: the server listens at once (`GET /health` answers 503 and the Twilio webhook answers busy while
the model loads), then the agent starts, the transports get it, and `/health` turns 200.

Stop: SIGTERM (or SIGINT, or `POST /admin/drain`) drains (`duetaspan.drain`): no new calls, live calls go on
until they end or `[server] drain_timeout_s`, then the process exits 0. Roles (`duetaspan.access`): the
admin token (`$DUETASPAN_ADMIN_TOKEN`) guards `/admin/*`, call records and the tool console, the metrics
token `/metrics`; without them those routes are refused unless the server is the local demo (loopback, no
public URL).

Example:
    >>> from duetaspan import Agent
    >>> agent = Agent(persona="You answer the phone for Luigi's.", model="tiny-random")
    >>> plan = plan_server(agent.config, twilio=True, public_url="https://agent.example.com",
    ...                    env={"TWILIO_ACCOUNT_SID": "AC1", "TWILIO_AUTH_TOKEN": "t"})
    >>> plan.host, plan.port, plan.twilio.voice_url
    ('127.0.0.1', 8080, 'https://agent.example.com/twilio/voice')
    >>> # await serve_agent(agent, twilio=True, public_url="https://agent.example.com")  # until Ctrl-C
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError

from duetaspan.config import AgentConfig
from duetaspan.errors import ConfigError

if TYPE_CHECKING:  # Twilio, FastAPI and aiortc load only when a server is built
    from duetaspan.adapters.sip.endpoint import SipSettings
    from duetaspan.adapters.twilio.rest import TwilioCredentials
    from duetaspan.adapters.twilio.service import TwilioService, TwilioSettings, WebhookKey
    from duetaspan.observability.observer import Observability
    from duetaspan.pipeline.admission import Admission
    from duetaspan.registry import ToolRegistry

logger = logging.getLogger("duetaspan.serve")


class ServedAgent(Protocol):
    """What `serve_agent` needs of an agent (`duetaspan.agent.Agent` is one): its config, start and stop as
    an async context manager, the tool registry and engine runner once started, and a slot for the server's
    observability. Serving depends on this, not on the `Agent` class, so `agent` -> `serving` points one way.
    """

    config: AgentConfig
    observability: Any  # `duetaspan.observability.observer.Observability` while served, else what was given
    registry: ToolRegistry | None
    runner: Any  # has `max_calls` and `running` once started
    admission: Admission  # every call slot of the agent, whichever transport asks

    @property
    def started(self) -> bool: ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, *exc: object) -> None: ...


@dataclass(frozen=True)
class ServePlan:
    """What one server runs, resolved from arguments and `agent.toml` and checked before the model loads."""

    host: str
    port: int
    twilio: TwilioSettings | None = None
    webrtc: bool = False
    allow_force_ret: bool = False
    metrics_token: str | None = field(default=None, repr=False)  # a secret: kept out of logs
    admin_token: str | None = field(default=None, repr=False)
    local_demo: bool = False  # bound to loopback with no public URL: roles may go without their tokens
    drain_timeout_s: float = 300.0
    sip: SipSettings | None = None


def twilio_credentials(config: AgentConfig, env: Mapping[str, str] | None = None) -> TwilioCredentials:
    """The Twilio account SID and auth token from the environment variables `[twilio]` names."""
    from duetaspan.adapters.twilio.rest import TwilioCredentials

    return TwilioCredentials.from_env(
        env, account_sid_env=config.twilio.account_sid_env, auth_token_env=config.twilio.auth_token_env
    )


def twilio_settings(
    config: AgentConfig, public_url: str | None = None, env: Mapping[str, str] | None = None
) -> TwilioSettings:
    """Twilio route settings: `public_url` (else `[twilio] public_url`) and the credentials."""
    from duetaspan.adapters.twilio.service import TwilioSettings

    source = "--public-url" if public_url else "[twilio] public_url"
    url = public_url or config.twilio.public_url
    if not url:
        raise ConfigError(
            "Twilio needs the public https URL it reaches this server at: pass --public-url (public_url=...) "
            "or set [twilio] public_url in agent.toml (e.g. https://abc123.ngrok.app)"
        )
    credentials = twilio_credentials(config, env)  # its own ConfigError names the missing variables
    try:
        return TwilioSettings(
            public_url=url,
            credentials=credentials,
            webhook_key=webhook_key(env),
            phone_number=config.twilio.phone_number,
            drain_redirect_url=config.server.drain_redirect_url,
        )
    except ValidationError as exc:
        reason = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise ConfigError(f"{source}: {reason}") from None


def webhook_key(env: Mapping[str, str] | None = None) -> WebhookKey | None:
    """The webhook SharedKey from `TWILIO_WEBHOOK_KEY_ID` / `TWILIO_WEBHOOK_KEY_SECRET` (both or neither),
    or None: then only Auth Token signatures are accepted."""
    from duetaspan.adapters.twilio.security import SETTINGS_HEADER, SHARED_KEYS_SUPPORTED
    from duetaspan.adapters.twilio.service import WebhookKey

    env = os.environ if env is None else env
    key_id, secret = env.get("TWILIO_WEBHOOK_KEY_ID", ""), env.get("TWILIO_WEBHOOK_KEY_SECRET", "")
    if not key_id and not secret:
        return None
    if not key_id or not secret:
        missing = "TWILIO_WEBHOOK_KEY_SECRET" if key_id else "TWILIO_WEBHOOK_KEY_ID"
        raise ConfigError(f"{missing} not set: a webhook shared key needs both its id and its secret")
    if not SHARED_KEYS_SUPPORTED:
        raise ConfigError(
            f"TWILIO_WEBHOOK_KEY_ID is set but the installed twilio library cannot check {SETTINGS_HEADER} "
            "signatures: upgrade twilio, or unset the shared key to use Auth Token signatures"
        )
    return WebhookKey(id=key_id, secret=secret)


def plan_server(
    config: AgentConfig,
    *,
    host: str | None = None,
    port: int | None = None,
    twilio: bool = False,
    webrtc: bool = False,
    public_url: str | None = None,
    allow_force_ret: bool = False,
    env: Mapping[str, str] | None = None,
    sip: bool | Mapping[str, Any] = False,
) -> ServePlan:
    """Resolve and check what `serve_agent` will run (arguments override `agent.toml`)."""
    from duetaspan.access import admin_token, local_demo
    from duetaspan.observability.metrics import metrics_token

    if not twilio and not webrtc and not sip:
        raise ConfigError(
            "choose a transport to serve: --twilio, --webrtc and/or --sip (twilio=True / webrtc=True / sip=True)"
        )
    if port is not None and not 0 <= port <= 65535:
        raise ConfigError(f"port {port}: not a TCP port (0-65535)")
    host = host or config.server.host
    twilio_plan = twilio_settings(config, public_url, env) if twilio else None
    sip_plan = None
    if sip:
        from duetaspan.adapters.sip.serve import sip_settings

        sip_plan = sip_settings(config, sip, host=host, env=env)
    return ServePlan(
        sip=sip_plan,
        host=host,
        port=config.server.port if port is None else port,
        twilio=twilio_plan,
        webrtc=webrtc,
        allow_force_ret=allow_force_ret,
        metrics_token=metrics_token(config.server.metrics_token, env),
        admin_token=admin_token(env),
        local_demo=local_demo(host, twilio_plan.public_url if twilio_plan else public_url or None),
        drain_timeout_s=config.server.drain_timeout_s,
    )


async def serve_agent(
    agent: ServedAgent,
    *,
    host: str | None = None,
    port: int | None = None,
    twilio: bool = False,
    webrtc: bool = False,
    public_url: str | None = None,
    allow_force_ret: bool = False,
    sip: bool | Mapping[str, Any] = False,
) -> None:
    """Serve `agent` until cancelled or interrupted (see `Agent.serve`, which documents the arguments).

    Starts the agent unless it already runs (then the caller stops it); stops it again on the way out.
    """
    from duetaspan.adapters.sip.admin import add_dial_route
    from duetaspan.drain import Drain
    from duetaspan.observability.metrics import add_metrics_route
    from duetaspan.outbound.serve import ServerStore
    from duetaspan.server import create_app, mount, serve
    from duetaspan.webhooks.served import open_after_call

    plan = plan_server(
        agent.config,
        host=host,
        port=port,
        twilio=twilio,
        webrtc=webrtc,
        public_url=public_url,
        allow_force_ret=allow_force_ret,
        sip=sip,
    )
    twilio_service = _twilio_service(plan.twilio, agent) if plan.twilio is not None else None
    ready = asyncio.Event()
    app = create_app(ready=ready.is_set, down=lambda: _engine_down(agent))
    observability, previous = _observability(agent, plan), agent.observability
    metrics_role, app.state.admin = _roles(plan)
    add_metrics_route(app, observability.metrics, metrics_role)  # type: ignore[arg-type]
    # POST /admin/sip/dial, /admin/dial (admin role): `agent.dial` on request; a carrier not served: 409
    dial = getattr(agent, "dial", None)
    add_dial_route(app, dial if plan.sip is not None else None, twilio=dial if twilio_service is not None else None,
                   verdict=_verdict_of(agent))  # fmt: skip
    drain = Drain(agent.admission, timeout_s=plan.drain_timeout_s)
    if observability.metrics is not None:
        drain.on_state.append(observability.metrics.drain_state)
    agent.observability = observability
    # flush traces in the app's shutdown too: a drained server exits right after it
    app.state.shutdown_hooks.append(lambda: asyncio.to_thread(observability.close))
    sip_endpoint = None
    # the store (call index, campaigns, do-not-call, outbox) and its admin routes; campaigns where we can dial
    server_store = ServerStore(agent, observability.metrics, can_dial=plan.sip is not None or plan.twilio is not None)
    served_after_call = None
    try:
        await server_store.open()
        server_store.mount(app)
        # lifecycle webhooks (from the store's outbox), end-of-call analysis, log and trace redaction
        served_after_call = await open_after_call(agent, observability)
        if twilio_service is not None:
            twilio_service.on_refusal = observability.metrics.webhook_refused  # type: ignore[union-attr]
            twilio_service.dialer.on_dial = twilio_dial_outcome(agent, observability.metrics)
            mount(app, twilio_service, "twilio")
            if hasattr(agent, "twilio_service"):
                agent.twilio_service = twilio_service  # `agent.dial("+1555...")` places calls through it
        webrtc_service = None
        if plan.webrtc:
            from duetaspan.adapters.webrtc.serve import build_service

            webrtc_service = build_service(agent, allow_force_ret=plan.allow_force_ret, admin=app.state.admin)
            metrics = observability.metrics
            if metrics is not None:
                webrtc_service.on_refused = lambda: metrics.call_ended("webrtc", "refused")
            mount(app, webrtc_service, "webrtc")
        if plan.sip is not None:  # listening at once: INVITEs get 503 until the agent is loaded
            from duetaspan.adapters.sip.serve import build_endpoint

            sip_endpoint = build_endpoint(plan.sip, agent, observability.metrics)
            await sip_endpoint.start()
            app.state.transports["sip"] = sip_endpoint  # its `aclose` runs at shutdown, `free_slots` in /health
            if hasattr(agent, "sip_endpoint"):
                agent.sip_endpoint = sip_endpoint  # `agent.dial("sip:...")` places calls through it
        serving = serve(app, host=plan.host, port=plan.port, drain=drain)
        server = asyncio.create_task(serving, name="duetaspan-server")
        try:
            async with contextlib.AsyncExitStack() as stack:
                if not agent.started:
                    if not await _start_unless_stopped(agent, server):
                        await server  # stopped (e.g. SIGTERM) while the model loaded
                        return
                    stack.push_async_exit(agent.__aexit__)
                if agent.registry is not None and observability.metrics is not None:
                    stack.callback(observability.metrics.watch_registry(agent.registry))
                if twilio_service is not None:
                    from duetaspan.adapters.twilio.bridge import agent_call_handler

                    # slots: the agent's admission (its engine's slots; none while the engine is down)
                    twilio_service.handler = agent_call_handler(agent)
                if webrtc_service is not None:
                    from duetaspan.adapters.webrtc.serve import announce

                    webrtc_service.agent = agent
                    announce(webrtc_service, plan.host, plan.port)
                ready.set()
                server_store.start_campaigns()
                if twilio_service is not None:
                    _announce_twilio(twilio_service.settings, plan)
                await server
        finally:
            if not server.done():
                server.cancel()
                await asyncio.gather(server, return_exceptions=True)
    finally:
        await server_store.stop_campaigns()  # the scheduler first: nothing is dialled while the transports close
        if served_after_call is not None:  # the calls' last store writes and analyses, then the deliverer
            await served_after_call.aclose()
        await server_store.aclose()
        agent.observability = previous
        await asyncio.to_thread(observability.close)  # flushes the OTLP exporter (blocking HTTP)
        if sip_endpoint is not None:  # idempotent: the app's shutdown closed it unless the agent failed
            await sip_endpoint.aclose()
            if getattr(agent, "sip_endpoint", None) is sip_endpoint:
                agent.sip_endpoint = None
        if twilio_service is not None:  # the app's shutdown does this too, not when the agent failed to start
            await twilio_service.aclose()
            if getattr(agent, "twilio_service", None) is twilio_service:
                agent.twilio_service = None
    if drain.signals and drain.signals[0] == signal.SIGINT:
        raise KeyboardInterrupt  # drained after Ctrl-C: the command line's usual "stopped" (130)


def _verdict_of(agent: ServedAgent) -> Any:
    """`call id -> its first answer verdict`, waited for up to `[outbound] detect_timeout_s` plus the start: the
    first verdict of the call's gate (the agent's `answers`: call id -> `AnswerGate`; the gate appears when the
    call's session starts); None when none came."""

    async def verdict(call_id: str) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + agent.config.outbound.detect_timeout_s + 10.0
        while loop.time() < deadline:
            gate = getattr(agent, "answers", {}).get(call_id)
            if gate is not None and gate.verdict is not None:
                return gate.verdict
            await asyncio.sleep(0.05)
        return None

    return verdict


def twilio_dial_outcome(agent: ServedAgent, metrics: Any) -> Any:
    """Every outcome of a Twilio call the server placed: counted, and recorded when never answered."""
    from duetaspan.adapters.twilio.outbound import write_dial_record

    def heard(result: Any) -> None:
        if metrics is not None:
            metrics.outbound.dialled(result.outcome)
        record_dir = getattr(agent, "record_dir", None)
        if record_dir is not None and result.outcome != "answered":
            write_dial_record(record_dir, result)

    return heard


def _engine_down(agent: ServedAgent) -> str | None:
    """Why the agent's engine is down (its steps kept failing, its process died and is restarting), or None:
    `/health` is unhealthy meanwhile, and admission (`runner.free_slots`, `running`) refuses calls."""
    runner = agent.runner
    if runner is None or not getattr(runner, "engine_down", False):
        return None
    return str(getattr(runner, "error", None) or "the engine is down")


def _observability(agent: ServedAgent, plan: ServePlan) -> Observability:
    """This server's metrics, and its traces when `[tracing]` / `OTEL_*` ask for them (an observability the
    caller already gave the agent keeps its tracer: tests pass an in-memory one)."""
    from duetaspan.observability.metrics import ServeMetrics
    from duetaspan.observability.observer import Observability
    from duetaspan.observability.tracing import Tracing

    served = (("twilio", plan.twilio is not None), ("webrtc", plan.webrtc), ("sip", plan.sip is not None))
    transports = [name for name, on in served if on]
    metrics = ServeMetrics(engine=lambda: agent.runner, transports=transports)
    given = agent.observability
    tracing = getattr(given, "tracing", None) or Tracing.from_config(
        agent.config.tracing, router_model=agent.config.router.model
    )
    return Observability(metrics=metrics, tracing=tracing)


def _announce_twilio(settings: TwilioSettings, plan: ServePlan) -> None:
    """The ready line: where Twilio calls, and which URLs and keys signatures are checked against."""
    from duetaspan.adapters.twilio.security import SETTINGS_HEADER, SHARED_KEYS_SUPPORTED

    if settings.webhook_key is not None:
        keys = f"the Auth Token or webhook shared key {settings.webhook_key.id}"
    elif SHARED_KEYS_SUPPORTED:
        keys = "the Auth Token (no webhook shared key set)"
    else:
        keys = f"the Auth Token ({SETTINGS_HEADER} shared-key signing is unsupported by the installed twilio)"
    logger.info(
        "ready: Twilio voice webhook %s (listening on %s:%d); signatures checked over %s and %s, with and "
        "without :443, made with %s",
        settings.voice_url,
        plan.host,
        plan.port,
        settings.public_url + "/twilio/...",
        settings.stream_url("<token>"),
        keys,
    )


async def _start_unless_stopped(agent: ServedAgent, server: asyncio.Task[None]) -> bool:
    """Start the agent (load the model); False when the server stopped first (the start is cancelled)."""
    starting = asyncio.ensure_future(agent.__aenter__())
    await asyncio.wait({starting, server}, return_when=asyncio.FIRST_COMPLETED)
    if starting.done():
        starting.result()
        return True
    logger.warning("stopped while the agent was starting; not starting it")
    starting.cancel()
    await asyncio.gather(starting, return_exceptions=True)
    return False


def _roles(plan: ServePlan) -> tuple[Any, Any]:
    """The metrics and admin roles (`duetaspan.access`), open without their tokens only on the local demo."""
    from duetaspan.access import ADMIN_TOKEN_ENV, BearerRole
    from duetaspan.observability.metrics import TOKEN_ENV as METRICS_TOKEN_ENV

    metrics = BearerRole("metrics", plan.metrics_token, METRICS_TOKEN_ENV, open_without_token=plan.local_demo)
    admin = BearerRole("admin", plan.admin_token, ADMIN_TOKEN_ENV, open_without_token=plan.local_demo)
    for role, routes in ((metrics, "GET /metrics"), (admin, "/admin/*, /webrtc/calls, /webrtc/tools")):
        if role.open:
            logger.warning("%s open without a token (local demo: loopback, no public URL)", routes)
        elif role.token is None:
            logger.warning("%s refused: set $%s to use them", routes, role.env)
    return metrics, admin


def _twilio_service(settings: TwilioSettings, agent: ServedAgent) -> TwilioService:
    """The Twilio routes, on the agent's call budget (no slots until the agent is up)."""
    from duetaspan.adapters.twilio.bridge import AGENT_IN_RATE
    from duetaspan.adapters.twilio.service import TwilioService

    async def not_ready(call: Any) -> None:
        await call.end_call("agent not ready", drain_s=0)

    return TwilioService(settings, not_ready, max_calls=0, in_rate=AGENT_IN_RATE, admission=agent.admission)


__all__ = [
    "ServePlan",
    "ServedAgent",
    "plan_server",
    "serve_agent",
    "twilio_credentials",
    "twilio_settings",
    "webhook_key",
]
