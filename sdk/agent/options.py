"""Turning `Agent(...)` keyword arguments into the agent's `AgentConfig`: arguments override the config (or
`agent.toml`) they are given with, and sections may be passed as models or plain dicts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from duetaspan.config import (
    AgentConfig,
    ASRConfig,
    CaptureConfig,
    MCPServerConfig,
    RetrievalConfig,
    RouterConfig,
)
from duetaspan.errors import ConfigError
from duetaspan.pipeline.leveller import LevellerConfig


def _section(model: type, value: Any, name: str) -> Any:
    if value is None or isinstance(value, model):
        return value
    if isinstance(value, dict):
        try:
            return model.model_validate(value)
        except Exception as exc:
            raise ConfigError(f"Agent({name}=...): {exc}") from None
    raise ConfigError(f"Agent({name}=...): expected {model.__name__} or a dict, got {type(value).__name__}")


def merge_arguments(
    config: AgentConfig | None,
    *,
    persona: str | None = None,
    voice: str | Path | None = None,
    builtins: Sequence[str] | None = None,
    mcp_servers: Sequence[MCPServerConfig | dict[str, Any]] = (),
    router: RouterConfig | dict[str, Any] | bool | None = None,
    asr: ASRConfig | dict[str, Any] | None = None,
    capture: CaptureConfig | dict[str, Any] | None = None,
    retrieval: RetrievalConfig | dict[str, Any] | None = None,
    model: str | None = None,
    device: str | None = None,
    record_dir: str | Path | None = None,
    profile: dict[str, Any] | None = None,
) -> AgentConfig:
    """A copy of `config` (or the defaults) with the given arguments applied; `config` is left as it was.

    Example:
        >>> cfg = merge_arguments(None, persona="You are Ada.", router={"model": "qwen3-8b"})
        >>> cfg.persona.prompt, cfg.router.model
        ('You are Ada.', 'qwen3-8b')
    """
    cfg = (config or AgentConfig()).model_copy(deep=True)
    if config is not None:
        cfg.base_dir = config.base_dir
    if persona is not None:
        cfg.persona.prompt, cfg.persona.prompt_file = persona, None
    if voice is not None:
        if Path(voice).suffix:
            cfg.voice.path, cfg.voice.name = Path(voice), None
        else:
            cfg.voice.name, cfg.voice.path = str(voice), None
    if builtins is not None:
        cfg.tools.builtins = list(builtins)
    if mcp_servers:
        cfg.mcp_servers = [
            *cfg.mcp_servers,
            *(_section(MCPServerConfig, s, "mcp_servers") for s in mcp_servers),
        ]
    if router not in (None, False, True):
        cfg.router = _section(RouterConfig, router, "router")
    for name, model_cls, value in (
        ("asr", ASRConfig, asr),
        ("capture", CaptureConfig, capture),
        ("retrieval", RetrievalConfig, retrieval),
    ):
        if value is not None:
            setattr(cfg, name, _section(model_cls, value, name))
    if model is not None:
        cfg.model.preset = model
    if device is not None:
        cfg.model.device = device
    if record_dir is not None:
        cfg.recording.enabled, cfg.recording.dir = True, Path(record_dir)
    if profile:
        cfg.profile = {**cfg.profile, **profile}
    return cfg


def leveller_config(level_caller_audio: bool | LevellerConfig) -> LevellerConfig:
    """`Agent(level_caller_audio=...)`: a `LevellerConfig` as given, or on/off with the defaults."""
    if isinstance(level_caller_audio, LevellerConfig):
        return level_caller_audio
    return LevellerConfig(enabled=bool(level_caller_audio))


__all__ = ["leveller_config", "merge_arguments"]
