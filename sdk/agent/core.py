"""The `Agent` class: what a user writes (see `duetaspan.agent` for a complete example). It holds what all
calls share (the engine and its runner, the tool registry, MCP connections, router clients), starts and stops
them, serves, and makes one `CallSession` or `DuetaSpanService` per call. Building the config from its
arguments, loading the engine, the shared clients and each call's parts live in the sibling modules."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipecat.pipeline.worker import PipelineParams

from duetaspan.agent.after_call import follow_call
from duetaspan.agent.calls import (
    AgentNotStarted,
    call_context,
    call_info,
    call_recorder,
    call_service,
    session_params,
)
from duetaspan.agent.dialing import place_call
from duetaspan.agent.engine import engine_spec, load_engine
from duetaspan.agent.options import leveller_config, merge_arguments
from duetaspan.agent.stored import attach_store, fill_variables
from duetaspan.agent.wiring import (
    asr_configured,
    call_retrieval,
    close_shared_clients,
    redact_logs,
    start_shared_clients,
)
from duetaspan.config import (
    AgentConfig,
    ASRConfig,
    CaptureConfig,
    MCPServerConfig,
    RetrievalConfig,
    RouterConfig,
)
from duetaspan.logs import bind_call
from duetaspan.model.convention import SAMPLE_RATE
from duetaspan.outbound.handle import start_campaign
from duetaspan.pipeline.admission import Admission
from duetaspan.pipeline.artifacts import check_record_dir
from duetaspan.pipeline.leveller import LevellerConfig
from duetaspan.pipeline.runner import EngineRunner
from duetaspan.pipeline.service import DuetaSpanService, RetrievalFactory
from duetaspan.pipeline.session import CallInfo, CallSession
from duetaspan.registry import CallContext, ToolRegistry
from duetaspan.serving import serve_agent

if TYPE_CHECKING:  # prometheus_client and OpenTelemetry load only when a server observes the agent
    from duetaspan.observability.observer import CallObserver

log = logging.getLogger(__name__)

# Builds a call's retrieval from its CallContext (or None: a `<ret>` then lands no span).
RetrievalBuilder = Callable[["Agent", CallContext], RetrievalFactory | None]


class Agent:
    """A phone agent on the duplex model. See `duetaspan.agent`'s docstring for a complete example.

    Args:
        persona: the text prompt (who the agent is).
        voice: a voice preset name or a voice-prompt file (`.pt` codes or a wav).
        tools: `@tool` functions (or `Tool`s) in addition to the enabled built-ins.
        builtins: built-in tools to enable (default: get_time, get_weather, web_search, calculate).
        mcp_servers: MCP servers whose tools join the registry (configs or dicts, see `MCPServerConfig`).
        router: the LLM router (`RouterConfig` or dict); `False` turns retrieval off.
        asr, capture, retrieval: question-capture ASR, capture windows and the retrieval deadline.
        model: a preset name ("duetaspan-7b", "tiny-random", ...); `device`: "cuda", "cpu" or "auto".
        max_calls: concurrent calls (engine slots); more are refused with `EngineFull`.
        record_dir: write `<call id>.wav` / `.jsonl` / `.json` per call there (checked at start).
        level_caller_audio: level caller audio toward -24 LUFS (or a `LevellerConfig`).
        sampling, seed: engine sampling parameters and seed for every call.
        profile: facts tools and the router may use (e.g. {"city": "Sydney"}).
        engine: an already-loaded engine (shared with other code or a test); `model` is then ignored.
        engine_process: run the engine in its own process (`duetaspan.pipeline.engine_process`), so the
            server's event loop and the GPU loop never share a process; a dead engine ends its calls.
        retrieval_builder: `(agent, call_context) -> RetrievalFactory | None` replacing the router-backed
            retrieval (scripted demos, custom backends).
        config: a full `AgentConfig` the other arguments override (what `from_config` passes).
    """

    def __init__(
        self,
        *,
        persona: str | None = None,
        voice: str | Path | None = None,
        tools: Sequence[Any] = (),
        builtins: Sequence[str] | None = None,
        mcp_servers: Sequence[MCPServerConfig | dict[str, Any]] = (),
        router: RouterConfig | dict[str, Any] | bool | None = None,
        asr: ASRConfig | dict[str, Any] | None = None,
        capture: CaptureConfig | dict[str, Any] | None = None,
        retrieval: RetrievalConfig | dict[str, Any] | None = None,
        model: str | None = None,
        device: str | None = None,
        max_calls: int = 4,
        record_dir: str | Path | None = None,
        level_caller_audio: bool | LevellerConfig = True,
        sampling: Any = None,
        seed: int | None = None,
        profile: dict[str, Any] | None = None,
        engine: Any = None,
        engine_process: bool = False,
        retrieval_builder: RetrievalBuilder | None = None,
        config: AgentConfig | None = None,
    ) -> None:
        self.config = merge_arguments(
            config,
            persona=persona,
            voice=voice,
            builtins=builtins,
            mcp_servers=mcp_servers,
            router=router,
            asr=asr,
            capture=capture,
            retrieval=retrieval,
            model=model,
            device=device,
            record_dir=record_dir,
            profile=profile,
        )
        self.retrieval_enabled = router is not False
        self.max_calls = max_calls
        self.leveller = leveller_config(level_caller_audio)
        self.sampling = sampling
        self.seed = seed
        self.engine = engine
        self.engine_process = engine_process
        self._extra_tools = list(tools)
        self._retrieval_builder = retrieval_builder
        self.registry: ToolRegistry | None = None
        self.runner: EngineRunner | None = None
        self._mcp: Any = None
        self.shared: dict[str, Any] = {}  # router-side shared clients (LLM, ASR), built at start
        self.observability: Any = None  # `duetaspan.observability.observer.Observability`, set by the server
        # every call slot of this agent, any transport (`pipeline.admission`): the engine's while it runs
        self.admission = Admission(
            lambda: self.runner.max_calls if self.runner and self.runner.running else 0
        )
        self.sip_endpoint: Any = None  # the running `duetaspan.adapters.sip.SipEndpoint`, set by `serve(sip=...)`
        self.twilio_service: Any = None  # the running `TwilioService`, set by `serve(twilio=True)`
        self.store: Any = None  # the server's `duetaspan.store.Store`, set by `serve()`
        self.campaigns: Any = None  # the server's campaign scheduler (`duetaspan.outbound.scheduler`)
        self.answers: Any = weakref.WeakValueDictionary()  # live calls' answer gates by call id (`[outbound]`)
        self._started = False

    @classmethod
    def from_config(cls, path: str | Path | AgentConfig, **overrides: Any) -> Agent:
        """An agent from an `agent.toml` (see `duetaspan.config.AgentConfig`); keyword arguments override it."""
        config = path if isinstance(path, AgentConfig) else AgentConfig.load(path)
        return cls(config=config, **overrides)

    # lifecycle ----------------------------------------------------------------------------------
    @property
    def record_dir(self) -> Path | None:
        return self.config.recording.dir if self.config.recording.enabled else None

    @property
    def started(self) -> bool:
        """True between `start()` and `stop()`."""
        return self._started

    async def start(self) -> None:
        """Check the record dir, build the tool registry, connect MCP servers, load the engine, start its clock."""
        if self._started:
            return
        if self.record_dir is not None:
            check_record_dir(self.record_dir)  # fail now, not at the first call
        from duetaspan.tools.loader import python_registry

        registry = python_registry(self.config)
        registry.extend(self._extra_tools, replace=True)
        try:
            redact_logs(self.shared, self.config)  # [privacy] redact: the process's log lines, while it runs
            if self.config.mcp_servers:
                from duetaspan.adapters.mcp import MCPToolset

                self._mcp = MCPToolset(self.config.mcp_servers)
                await self._mcp.start()
                self._mcp.register(registry)
            self.registry = registry
            if self.engine is None and self.engine_process:
                from duetaspan.pipeline.engine_process import EngineProcess

                on_fault = self.config.engine
                self.runner = EngineProcess(  # type: ignore[assignment]
                    self._engine_spec(),
                    max_restarts=on_fault.max_restarts,
                    restart_delay_s=on_fault.restart_delay_s,
                )
                await self.runner.start()
            else:
                if self.engine is None:
                    self.engine = await asyncio.get_running_loop().run_in_executor(None, self._load_engine)
                slots = int(getattr(self.engine, "max_slots", self.max_calls))
                self.runner = EngineRunner(
                    self.engine,
                    max_calls=min(self.max_calls, slots),
                    max_failed_steps=self.config.engine.max_failed_steps,
                )
                self.runner.start()
            if self._retrieval_builder is None:
                start_shared_clients(
                    self.shared, self.config, registry, retrieval_enabled=self.retrieval_enabled
                )
        except BaseException:
            await self._close_shared()
            raise
        self._started = True
        log.info(
            "agent ready: %d tools (%s), %d call slots",
            len(registry),
            ", ".join(registry.names()),
            self.runner.max_calls,
        )

    async def stop(self) -> None:
        """Stop the engine clock, close MCP connections and router clients."""
        self._started = False
        await self._close_shared()

    async def __aenter__(self) -> Agent:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _close_shared(self) -> None:
        if self.runner is not None:
            await self.runner.stop()
        if self._mcp is not None:
            await self._mcp.close()
            self._mcp = None
        await close_shared_clients(self.shared)

    def _engine_spec(self) -> Any:
        """What an engine process loads: the same model, files, device and slots as `_load_engine`."""
        return engine_spec(
            self.config.model, max_slots=self.max_calls, seed=self.seed, engine=self.config.engine
        )

    def _load_engine(self) -> Any:
        return load_engine(
            self.config.model, max_slots=self.max_calls, seed=self.seed, sampling=self.sampling
        )

    # serving ------------------------------------------------------------------------------------
    async def serve(
        self,
        *,
        twilio: bool = False,
        webrtc: bool = False,
        public_url: str | None = None,
        host: str | None = None,
        port: int | None = None,
        allow_force_ret: bool = False,
        sip: bool | Mapping[str, Any] = False,
    ) -> None:
        """Answer calls until cancelled or interrupted: exactly what `duetaspan serve` runs.

        Starts a web server (`GET /health`: 503 while the model loads, then 200), starts the agent (unless it
        already runs), and mounts the transports asked for:

        - `twilio=True`: Twilio Media Streams (`POST /twilio/voice`, `WS /twilio/stream/<token>`,
          `POST /twilio/status`); `public_url` is the https URL Twilio reaches this server at (default
          `[twilio] public_url`); credentials from `TWILIO_ACCOUNT_SID` / `TWILIO_AUTH_TOKEN` (or the
          variables `[twilio]` names). Point your number's voice webhook at `<public_url>/twilio/voice`.
        - `webrtc=True`: the browser page (its URL with the page token is printed);
          `allow_force_ret` adds its Force <ret> button.
        - `sip=True` (or a dict of `[sip]` overrides, e.g. `{"port": 5070, "allow": ["10.0.0.0/8"]}`): a native
          SIP endpoint (`duetaspan.adapters.sip`, docs/sip.md); INVITEs only from `[sip] allow` sources or with
          digest credentials (`[sip] auth_user`, password in `$DUETASPAN_SIP_AUTH_PASSWORD`).

        `host` / `port` default to `[server]` (127.0.0.1:8080). Configuration errors (no transport, no
        public URL, missing credentials) raise `ConfigError` before the model loads.

        Example:
            await agent.serve(twilio=True, public_url="https://abc123.ngrok.app", host="0.0.0.0", port=8080)
        """
        await serve_agent(
            self,
            twilio=twilio,
            webrtc=webrtc,
            public_url=public_url,
            host=host,
            port=port,
            allow_force_ret=allow_force_ret,
            sip=sip,
        )

    def run(
        self,
        *,
        twilio: bool = False,
        webrtc: bool = False,
        public_url: str | None = None,
        host: str | None = None,
        port: int | None = None,
        allow_force_ret: bool = False,
    ) -> None:
        """`serve(...)` for a script's last line: runs its own event loop and returns on Ctrl-C. A setup
        error (no public URL, no Twilio credentials, no weights...) ends the script with its one-line
        message and exit status 1, not a traceback.

        Example:
            agent.run(twilio=True, public_url="https://abc123.ngrok.app", host="0.0.0.0")
        """
        from duetaspan.errors import DuetaspanError

        with contextlib.suppress(KeyboardInterrupt):
            try:
                asyncio.run(
                    self.serve(
                        twilio=twilio,
                        webrtc=webrtc,
                        public_url=public_url,
                        host=host,
                        port=port,
                        allow_force_ret=allow_force_ret,
                    )
                )
            except DuetaspanError as exc:
                raise SystemExit(f"error: {exc}") from None

    def persona(self, context: CallContext | None = None) -> Any:
        """The engine `Persona` for a call (the profile's name/city personalise it)."""
        from duetaspan.model.persona import Persona

        profile = context.profile if context is not None else self.config.profile
        voice = self.config.voice.path or self.config.voice.name
        return Persona(text=fill_variables(self.config.persona.text(), profile) or None, voice=voice, user_name=profile.get("name"),
                       user_city=profile.get("city"))  # fmt: skip

    async def dial(self, to: str, *, caller: str | None = None, ring_timeout_s: float | None = None,
                   detect: bool | None = None, params: Any = None, goal: str | None = None) -> Any:  # fmt: skip
        """Place a call from this process (`duetaspan.agent.dialing`: a SIP URI, or an E.164 number via Twilio);
        `detect`: who answered, `goal`: a phone menu's target ("reach billing"; both docs/outbound.md)."""
        return await place_call(self, to, caller=caller, ring_timeout_s=ring_timeout_s, detect=detect, params=params,
                                goal=goal)  # fmt: skip

    async def campaign(self, contacts: Any, *, name: str | None = None, **settings: Any) -> Any:
        """Start an outbound campaign on this serving agent (`duetaspan.outbound.handle.start_campaign`)."""
        return await start_campaign(self, contacts, name=name, **settings)

    def create_session(
        self,
        call: CallInfo | str | None = None,
        transport: Any = None,
        *,
        pipeline_params: PipelineParams | None = None,
        audio_in_sample_rate: int | None = None,
        audio_out_sample_rate: int = SAMPLE_RATE,
    ) -> CallSession:
        """A new call session. The transport then calls `await session.open()` (raises `EngineFull` when all
        slots are busy: refuse the call) and `await session.run()`."""
        call = call_info(call)
        service, context, observer = self._call_service(call)
        bind_call(call.call_id)  # the transport's per-call task: its logs (and its pipeline's) carry the id
        return CallSession(
            call,
            service,
            transport,
            context=context,
            pipeline_params=session_params(pipeline_params, audio_in_sample_rate, audio_out_sample_rate),
            on_close=observer.closed if observer else None,
        )

    def service(self, call: CallInfo | str | None = None) -> DuetaSpanService:
        """The duplex model for one call, for your own Pipecat pipeline with any Pipecat transport.

        The service is bound to this agent's engine, tools, router, persona and record dir. It takes its
        engine slot at `StartFrame` (no free slot: a permanent `ErrorFrame` upstream and the pipeline ends,
        so the transport hangs up), writes the call's artifacts when the pipeline ends (`EndFrame` or
        `CancelFrame`) and frees the slot. Logs of the calling task (and of the pipeline it then builds,
        Pipecat's included) carry the call id (`duetaspan.logs`). The call's `CallContext` (tools see it;
        DTMF digits are appended to it) is `service.context`.

        Example (docs/pipeline.md has the whole pipeline):
            >>> async def bot(agent, transport, call_sid):       # doctest: +SKIP
            ...     service = agent.service(CallInfo(call_sid, caller="+15550001111", transport="twilio"))
            ...     pipeline = Pipeline([transport.input(), service, transport.output()])
            ...     await WorkerRunner(handle_sigint=False).run(PipelineWorker(pipeline))
        """
        call = call_info(call)
        service, _, _ = self._call_service(call)
        bind_call(call.call_id)
        return service

    def _call_service(self, call: CallInfo) -> tuple[DuetaSpanService, CallContext, CallObserver | None]:
        """A call's `DuetaSpanService` (on the agent's engine, retrieval, persona, recorder), its context,
        and its observer (metrics and trace) when the agent is observed."""
        if not self._started or self.runner is None:
            raise AgentNotStarted("call `await agent.start()` (or use `async with agent:`) before taking calls")
        context = call_context(self.config, call)
        recorder = call_recorder(self.record_dir, call, audio=self.config.recording.audio)
        # indexed at its end (served: by the AfterCall, with call.ended); the do-not-call list for opt_out
        attach_store(self.store, context, recorder, index=getattr(self, "after_call", None) is None)
        obs = self.observability
        observer = obs.call(call.call_id, transport=call.transport) if obs is not None else None
        retrieval = self._retrieval_for(context)
        service = call_service(
            self.runner,
            call,
            context=context,
            persona=self.persona(context),
            sampling=self.sampling, seed=self.seed, leveller=self.leveller,
            retrieval=retrieval,
            recorder=recorder,
            observer=observer,
            admission=self.admission,
            max_call_s=self.config.server.max_call_s,
        )
        follow_call(self, call, service)  # answer gate, redaction, consent; webhooks and analysis when served
        return service, context, observer

    @property
    def free_slots(self) -> int:
        """Calls the agent can take now: its admission's free slots (0 draining), at most the engine's free."""
        if self.runner is None or self.admission.draining:
            return 0
        return max(0, min(self.runner.free_slots, self.runner.max_calls - self.admission.held))

    @property
    def engine_down(self) -> bool:
        """True while the engine is down after a failure (admission refuses, `/health` is unhealthy)."""
        return self.runner is not None and bool(getattr(self.runner, "engine_down", False))

    @property
    def asr_configured(self) -> bool:
        """An ASR the agent can reach without the router: an explicit `asr.url`, or in-process whisper."""
        return asr_configured(self.config)

    def _retrieval_for(self, context: CallContext) -> RetrievalFactory | None:
        if self.retrieval_enabled and self._retrieval_builder is not None:
            return self._retrieval_builder(self, context)
        return call_retrieval(self.config, self.shared, context, retrieval_enabled=self.retrieval_enabled)


__all__ = ["Agent", "RetrievalBuilder"]
