"""`AgentConfig`: a whole `agent.toml` (every section optional), read with `AgentConfig.load(path)`; relative
paths resolve against the file's folder."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, model_validator

from duetaspan.config.after_call import AnalysisConfig, PrivacyConfig, WebhooksConfig
from duetaspan.config.base import _Section, format_errors
from duetaspan.config.outbound import OutboundConfig
from duetaspan.config.persona import EngineConfig, ModelConfig, PersonaConfig, VoiceConfig
from duetaspan.config.retrieval import ASRConfig, CaptureConfig, RetrievalConfig, RouterConfig
from duetaspan.config.serving import RecordingConfig, ServerConfig, TracingConfig, TwilioConfig, WebRTCConfig
from duetaspan.config.sip import SipConfig
from duetaspan.config.store import CampaignConfig, StoreConfig
from duetaspan.config.tools import MCPServerConfig, ToolsConfig
from duetaspan.errors import ConfigError


class AgentConfig(_Section):
    """A whole `agent.toml`. Every section is optional.

    Example:
        >>> cfg = AgentConfig.load("examples/front_desk/agent.toml")  # doctest: +SKIP
    """

    persona: PersonaConfig = Field(default_factory=PersonaConfig)
    voice: VoiceConfig = Field(default_factory=VoiceConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    router: RouterConfig = Field(default_factory=RouterConfig)
    asr: ASRConfig = Field(default_factory=ASRConfig)
    capture: CaptureConfig = Field(default_factory=CaptureConfig)
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    mcp_servers: list[MCPServerConfig] = Field(default_factory=list)
    profile: dict[str, Any] = Field(default_factory=dict)
    webhooks: WebhooksConfig = Field(default_factory=WebhooksConfig)
    analysis: AnalysisConfig = Field(default_factory=AnalysisConfig)
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    twilio: TwilioConfig = Field(default_factory=TwilioConfig)
    webrtc: WebRTCConfig = Field(default_factory=WebRTCConfig)
    sip: SipConfig = Field(default_factory=SipConfig)
    outbound: OutboundConfig = Field(default_factory=OutboundConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    recording: RecordingConfig = Field(default_factory=RecordingConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    campaign: CampaignConfig = Field(default_factory=CampaignConfig)
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
        self.model.dir = fix(self.model.dir)
        self.recording.dir = fix(self.recording.dir) or self.recording.dir
        self.recording.consent_audio = fix(self.recording.consent_audio)
        self.server.data_dir = fix(self.server.data_dir) or self.server.data_dir
        self.store.path = fix(self.store.path)
        for server in self.mcp_servers:
            server.cwd = fix(server.cwd)
        model = self.asr.model
        if self.asr.kind == "whisper" and model and model.startswith(("./", "../")):
            # a local faster-whisper folder named relative to the file (sizes and `org/name` ids stay as is)
            self.asr.model = str(self.base_dir / model)


__all__ = ["AgentConfig"]
