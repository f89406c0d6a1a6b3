"""The `agent.toml` models: one pydantic model per section, `AgentConfig.load(path)` for the whole file.

Errors name the field: `ConfigError: agent.toml: mcp_servers[0].command: field required`. Relative paths are
resolved against the file's folder. Secrets are never written in the file: sections name the environment
variable that holds them (`api_key_env`), and MCP stdio servers get only the variables they list.

Example:
    >>> from duetaspan.config import AgentConfig
    >>> cfg = AgentConfig.from_toml('''
    ... [persona]
    ... name = "Ava"
    ... prompt = "You are Ava, the front desk of Harbor Dental."
    ... [router]
    ... model = "gpt-4.1-mini"
    ... [[mcp_servers]]
    ... name = "time"
    ... command = "python"
    ... args = ["-m", "mcp_server_time"]
    ... ''')
    >>> cfg.router.mode, cfg.retrieval.deadline_s, cfg.mcp_servers[0].transport
    ('native', 2.5, 'stdio')
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from duetaspan.errors import ConfigError

_SERVER_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,32}$")


class _Section(BaseModel):
    # Typos in a config file should fail loudly, not be ignored.
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class PersonaConfig(_Section):
    """Who the agent is: a name and the text prompt (inline or from a file).

    Attributes:
        name: the agent's name (logs, the page, your prompt's own use).
        prompt: the text prompt the model is conditioned on: who it is, what it does, how it speaks.
        prompt_file: read the prompt from this file instead (relative to agent.toml).
    """

    name: str = "Assistant"
    prompt: str = ""
    prompt_file: Path | None = None

    def text(self) -> str:
        """The prompt text: `prompt_file`'s contents when set, else `prompt`."""
        if self.prompt_file is not None:
            return self.prompt_file.read_text(encoding="utf-8").strip()
        return self.prompt


class VoiceConfig(_Section):
    """The agent's voice: a preset voice name or a voice-prompt file (wav or precomputed embeddings).

    Attributes:
        name: a voice of the model preset (`voices/NAME.pt` in its repository, e.g. "main"); unset: the
            preset's default voice.
        path: a voice-prompt file instead: `.pt` Mimi codes or a wav of the voice (>= 0.5 s).
    """

    name: str | None = None
    path: Path | None = None


class ModelConfig(_Section):
    """Which weights to run and where: a preset, or explicit checkpoint files.

    Attributes:
        preset: "duetaspan-7b" (default), "personaplex-7b", "moshi-7b", or "tiny-random" (random weights,
            CPU demos and tests); `--model` overrides it.
        checkpoint: LM weights file (`.pt` or `.safetensors`) instead of a preset's download.
        lm_config: Moshi-style `lm_kwargs` JSON for `checkpoint` (default: `config.json` beside it, else the
            preset whose shapes match).
        mimi: Mimi codec weights (safetensors) to go with `checkpoint`.
        tokenizer: SentencePiece model to go with `checkpoint`.
        device: "cuda", "cuda:1", "cpu", or "auto" (CUDA when available).
        dtype: compute dtype (default: bfloat16 on CUDA, float32 on CPU).
    """

    preset: str | None = None
    checkpoint: Path | None = None
    lm_config: Path | None = None
    mimi: Path | None = None
    tokenizer: Path | None = None
    device: str = "auto"
    dtype: Literal["bfloat16", "float16", "float32"] | None = None


class RouterConfig(_Section):
    """The router's LLM: any OpenAI-compatible chat-completions endpoint.

    `mode="native"` sends the tools with the API's `tools=`; `mode="json"` puts the catalogue in the prompt
    and parses a JSON reply (for servers without tool-call parsing).

    Attributes:
        base_url: the endpoint's `/v1` root (OpenAI, vLLM, llama.cpp, Ollama, LM Studio ...).
        model: the model name the endpoint expects.
        api_key_env: environment variable holding the API key (unset or empty: no key sent).
        mode: "native" (tool calling) or "json" (catalogue in the prompt, JSON reply).
        timeout_s: one LLM request's time limit (the retrieval deadline still applies).
        temperature: sampling temperature of the router's LLM (0: deterministic routing).
        max_tokens: reply length limit (a tool call or one short sentence).
    """

    base_url: str = "https://api.openai.com/v1"
    model: str = "gpt-4.1-mini"
    api_key_env: str | None = "OPENAI_API_KEY"
    mode: Literal["native", "json"] = "native"
    timeout_s: float = Field(8.0, gt=0)
    temperature: float = Field(0.0, ge=0, le=2)
    max_tokens: int = Field(200, gt=0)

    def api_key(self) -> str | None:
        """The key from the environment variable `api_key_env` (None when unset)."""
        return os.environ.get(self.api_key_env) if self.api_key_env else None


class ASRConfig(_Section):
    """Transcription of the caller's question: an OpenAI-compatible endpoint, a `POST /transcribe` server,
    in-process faster-whisper, or none.

    Attributes:
        kind: "openai" (`/audio/transcriptions`), "transcribe" (`POST` a wav to `url`), "whisper"
            (faster-whisper in process, `pip install duetaspan[whisper]`) or "none" (no question capture).
        url: the endpoint; for "openai" unset means the router's `base_url`.
        model: the ASR model name ("whisper-1"; a faster-whisper size like "small.en" for "whisper").
        api_key_env: environment variable holding the ASR key.
        language: ISO code hint ("en"); unset: detect.
        timeout_s: one transcription's time limit.
    """

    kind: Literal["openai", "transcribe", "whisper", "none"] = "openai"
    url: str | None = None
    model: str = "whisper-1"
    api_key_env: str | None = "OPENAI_API_KEY"
    language: str | None = None
    timeout_s: float = Field(5.0, gt=0)

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None


class CaptureConfig(_Section):
    """Question capture at `<ret>`: how far back a final utterance counts, how long to wait for one in
    progress, the silence that ends an utterance, and the audio window transcribed as a fallback.

    Attributes:
        final_window_s: a caller utterance that ended this recently before `<ret>` is the question.
        wait_s: when the caller is still speaking at `<ret>`, wait this long for the utterance to end.
        silence_s: while waiting, this much silence ends the utterance.
        fallback_window_s: otherwise transcribe this much recent caller audio as the question.
    """

    final_window_s: float = Field(3.0, ge=0)
    wait_s: float = Field(1.0, ge=0)
    silence_s: float = Field(0.4, gt=0)
    fallback_window_s: float = Field(12.0, gt=0)


class RetrievalConfig(_Section):
    """The retrieval lifecycle: the deadline from `<ret>` to a landed span, and the reference's size cap.

    Attributes:
        deadline_s: from `<ret>` to the span landing; later references are dropped (a `late_span` event).
        max_reference_tokens: references are cut (at a word) to about this many tokens.
    """

    deadline_s: float = Field(2.5, gt=0)
    max_reference_tokens: int = Field(250, gt=0)


class BuiltinToolsConfig(_Section):
    """Settings of the built-in tools (`duetaspan.tools`). The base URLs exist so tests and self-hosted
    mirrors can replace the public keyless services.

    Attributes:
        geocoding_url: Open-Meteo geocoding API (get_weather).
        forecast_url: Open-Meteo forecast API (get_weather).
        duckduckgo_url: DuckDuckGo instant answers (web_search).
        wikipedia_url: MediaWiki API (web_search).
        http_timeout_s: time limit of each request these tools make.
        default_timezone: get_time's zone when neither the caller nor the profile names a place.
        transfer_targets: transfer_call's destinations, name -> phone number or SIP URI (empty: any number).
    """

    geocoding_url: str = "https://geocoding-api.open-meteo.com/v1/search"
    forecast_url: str = "https://api.open-meteo.com/v1/forecast"
    duckduckgo_url: str = "https://api.duckduckgo.com/"
    wikipedia_url: str = "https://en.wikipedia.org/w/api.php"
    http_timeout_s: float = Field(4.0, gt=0)
    default_timezone: str | None = None
    transfer_targets: dict[str, str] = Field(default_factory=dict)


class ToolsConfig(_Section):
    """Python tools: modules whose `@tool` functions are registered, and which built-ins to enable.

    Attributes:
        modules: import paths of modules whose `@tool` objects join the registry (agent.toml's folder is
            on `sys.path`, so "my_tools" finds my_tools.py beside it).
        builtins: built-in tools to enable: get_time, get_weather, web_search, calculate, end_call,
            transfer_call.
        default_timeout_s: a tool call's time limit unless its `@tool(timeout=...)` says otherwise.
    """

    modules: list[str] = Field(default_factory=list)
    builtins: list[str] = Field(
        default_factory=lambda: ["get_time", "get_weather", "web_search", "calculate"]
    )
    default_timeout_s: float = Field(10.0, gt=0)
    settings: BuiltinToolsConfig = Field(default_factory=BuiltinToolsConfig)


class MCPServerConfig(_Section):
    """One MCP server: stdio (`command`, `args`, `cwd`, `env`, `env_allow`) or streamable HTTP (`url`,
    `headers`). `allow`/`deny` filter its tools by their MCP names.

    A stdio server gets only PATH-like basics, the variables named in `env_allow` (copied from our
    environment) and the literal `env` values: never the parent's secrets by accident.

    Attributes:
        name: 1-32 letters, digits, `_` or `-`; prefixes its tool names on collisions.
        command: the stdio server's program (found on PATH), e.g. "python", "npx", "uvx".
        args: its arguments.
        cwd: its working directory (relative to agent.toml).
        env: literal environment variables for it.
        env_allow: names of our environment variables it may see (e.g. an API key it needs).
        url: a streamable-HTTP server's URL instead of `command`.
        headers: HTTP headers for `url` (e.g. Authorization).
        allow: only these of its tools (by MCP name); unset: all.
        deny: never these of its tools.
        timeout_s: one tool call's time limit.
        connect_timeout_s: time to start and initialise the server.
        prefix: always name its tools `<name>__<tool>`.
    """

    name: str
    command: str | None
    args: list[str] = Field(default_factory=list)
    cwd: Path | None = None
    env: dict[str, str] = Field(default_factory=dict)
    env_allow: list[str] = Field(default_factory=list)
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    allow: list[str] | None = None
    deny: list[str] = Field(default_factory=list)
    timeout_s: float = Field(10.0, gt=0)
    connect_timeout_s: float = Field(20.0, gt=0)
    prefix: bool = False

    @model_validator(mode="before")
    @classmethod
    def _http_needs_no_command(cls, data: Any) -> Any:
        # `command` is required (so its absence is reported by name) unless the server is reached by url.
        if isinstance(data, dict) and data.get("url") is not None and "command" not in data:
            data = {**data, "command": None}
        return data

    @field_validator("name")
    @classmethod
    def _name_ok(cls, value: str) -> str:
        if not _SERVER_NAME.match(value):
            raise ValueError("use 1-32 letters, digits, '_' or '-' (it prefixes tool names on collisions)")
        return value

    @model_validator(mode="after")
    def _one_transport(self) -> MCPServerConfig:
        if self.command is not None and self.url is not None:
            raise ValueError("give either command (stdio) or url (streamable HTTP), not both")
        if self.command is None and self.url is None:
            raise ValueError("give command (stdio) or url (streamable HTTP)")
        return self

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "http" if self.url is not None else "stdio"


class TwilioConfig(_Section):
    """Twilio: credentials by environment variable name, the public URL Twilio reaches, the number.

    `X-Twilio-Signature` is always checked on the webhooks and the stream upgrade: there is no switch to turn
    it off (without it anyone who finds the URL could open calls and run the agent's tools).

    Attributes:
        account_sid_env: environment variable holding the Account SID.
        auth_token_env: environment variable holding the Auth Token (signs webhooks, authenticates REST).
        public_url: the https URL Twilio reaches this server at (signatures are checked against it;
            http is refused: Twilio opens streams over wss only); `serve --public-url` overrides it.
        phone_number: your Twilio number, E.164: the caller ID of `duetaspan call --config` (`--from`
            overrides it).
    """

    account_sid_env: str = "TWILIO_ACCOUNT_SID"
    auth_token_env: str = "TWILIO_AUTH_TOKEN"
    public_url: str | None = None
    phone_number: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _removed_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and "validate_signatures" in data:
            raise ValueError(
                "validate_signatures was removed: Twilio signatures are always checked (an unsigned server "
                "lets anyone open calls and run your tools); delete the line. To test locally, sign requests "
                "with your auth token (twilio.request_validator.RequestValidator.compute_signature)"
            )
        return data


class WebRTCConfig(_Section):
    """The browser demo over WebRTC (served by `serve --webrtc` or `agent.serve(webrtc=True)`).

    Attributes:
        ice_servers: STUN/TURN URLs for both peers (`[]` when browser and server share a machine or LAN).
    """

    ice_servers: list[str] = Field(default_factory=lambda: ["stun:stun.l.google.com:19302"])

    @model_validator(mode="before")
    @classmethod
    def _removed_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and "enabled" in data:
            raise ValueError(
                "enabled was removed: the transports are chosen where the server starts "
                "(`duetaspan serve --webrtc`, `agent.serve(webrtc=True)`); delete the line"
            )
        return data


class ServerConfig(_Section):
    """Where `duetaspan serve` (and `agent.serve()`) listens; `--host` / `--port` override it.

    Attributes:
        host: interface to bind (`0.0.0.0` for every interface; the default keeps the server local).
        port: TCP port.
        metrics_token: bearer token `GET /metrics` requires (`Authorization: Bearer <token>`);
            `$DUETASPAN_METRICS_TOKEN` takes precedence and keeps the secret out of the file. Unset: open.
    """

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    metrics_token: SecretStr | None = None


class TracingConfig(_Section):
    """OpenTelemetry traces of calls (a trace per call, a span per retrieval), exported over OTLP/HTTP.

    Off unless `enabled = true` or the standard `OTEL_EXPORTER_OTLP_ENDPOINT` /
    `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` variables are set; needs `pip install 'duetaspan[tracing]'`.
    Headers, timeouts and the rest come from the standard `OTEL_*` variables.

    Attributes:
        enabled: export traces.
        endpoint: the OTLP/HTTP traces URL (e.g. `http://collector:4318/v1/traces`); unset: the `OTEL_*`
            variables, else `http://localhost:4318/v1/traces`.
        service_name: `service.name` of the traces (`$OTEL_SERVICE_NAME` overrides it).
        include_text: put the caller's question and the span's reference text on spans (off: only sizes,
            timings, tool names and redacted arguments).
    """

    enabled: bool = False
    endpoint: str | None = None
    service_name: str = "duetaspan"
    include_text: bool = False


class RecordingConfig(_Section):
    """Per-call artifacts: the stereo wav and the JSON event log.

    Attributes:
        enabled: write `<call id>.wav`, `.jsonl` and `.json` per call (`--record-dir` turns it on).
        dir: the folder (relative to agent.toml).
        audio: write the stereo wav (left caller, right agent) besides the event log; `false` keeps only the
            `.jsonl` / `.json` (no caller audio on disk).
    """

    enabled: bool = False
    dir: Path = Path("recordings")
    audio: bool = True


class AgentConfig(_Section):
    """A whole `agent.toml`. Every section is optional.

    Example:
        >>> cfg = AgentConfig.load("examples/front_desk/agent.toml")  # doctest: +SKIP
    """

    persona: PersonaConfig = Field(default_factory=PersonaConfig)
    voice: VoiceConfig = Field(default_factory=VoiceConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    router: RouterConfig = Field(default_factory=RouterConfig)
    asr: ASRConfig = Field(default_factory=ASRConfig)
    capture: CaptureConfig = Field(default_factory=CaptureConfig)
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    mcp_servers: list[MCPServerConfig] = Field(default_factory=list)
    profile: dict[str, Any] = Field(default_factory=dict)
    twilio: TwilioConfig = Field(default_factory=TwilioConfig)
    webrtc: WebRTCConfig = Field(default_factory=WebRTCConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    recording: RecordingConfig = Field(default_factory=RecordingConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    base_dir: Path = Field(default_factory=Path.cwd, exclude=True)

    @model_validator(mode="after")
    def _unique_servers(self) -> AgentConfig:
        names = [s.name for s in self.mcp_servers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"mcp_servers: duplicate names {dupes}")
        return self

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> AgentConfig:
        """Read and validate an `agent.toml`; relative paths resolve against its folder."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        return cls.from_toml(text, source=path.name, base_dir=path.resolve().parent)

    @classmethod
    def from_toml(cls, text: str, *, source: str = "agent.toml", base_dir: Path | None = None) -> AgentConfig:
        """Parse TOML text (see `load`)."""
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{source}: invalid TOML: {exc}") from None
        return cls.from_dict(data, source=source, base_dir=base_dir)

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], *, source: str = "agent.toml", base_dir: Path | None = None
    ) -> AgentConfig:
        """Validate already-parsed data; `ConfigError` names the first bad fields."""
        if "base_dir" in data:
            raise ConfigError(f"{source}: base_dir: not a config field (it is the file's folder)")
        try:
            cfg = cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(f"{source}: {format_errors(exc)}") from None
        cfg.base_dir = (base_dir or Path.cwd()).resolve()
        cfg._resolve_paths()
        return cfg

    def _resolve_paths(self) -> None:
        def fix(p: Path | None) -> Path | None:
            return p if p is None or p.is_absolute() else self.base_dir / p

        self.persona.prompt_file = fix(self.persona.prompt_file)
        self.voice.path = fix(self.voice.path)
        self.model.checkpoint = fix(self.model.checkpoint)
        self.model.lm_config = fix(self.model.lm_config)
        self.model.mimi = fix(self.model.mimi)
        self.model.tokenizer = fix(self.model.tokenizer)
        self.recording.dir = fix(self.recording.dir) or self.recording.dir
        for server in self.mcp_servers:
            server.cwd = fix(server.cwd)


def format_errors(exc: ValidationError) -> str:
    """`mcp_servers[0].command: field required; router.mode: ...` from a pydantic error."""
    parts = []
    for err in exc.errors():
        loc = ""
        for item in err["loc"]:
            loc += f"[{item}]" if isinstance(item, int) else (f".{item}" if loc else str(item))
        msg = err["msg"]
        msg = msg.removeprefix("Value error, ")
        msg = msg[:1].lower() + msg[1:]
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


__all__ = [
    "ASRConfig",
    "AgentConfig",
    "BuiltinToolsConfig",
    "CaptureConfig",
    "MCPServerConfig",
    "ModelConfig",
    "PersonaConfig",
    "RecordingConfig",
    "RetrievalConfig",
    "RouterConfig",
    "ServerConfig",
    "ToolsConfig",
    "TracingConfig",
    "TwilioConfig",
    "VoiceConfig",
    "WebRTCConfig",
    "format_errors",
]
