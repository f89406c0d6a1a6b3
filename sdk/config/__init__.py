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

from duetaspan.config.after_call import AnalysisConfig, PrivacyConfig, WebhooksConfig
from duetaspan.config.agent import AgentConfig
from duetaspan.config.base import format_errors
from duetaspan.config.outbound import OutboundConfig
from duetaspan.config.persona import EngineConfig, ModelConfig, PersonaConfig, VoiceConfig
from duetaspan.config.retrieval import (
    ASRConfig,
    CaptureConfig,
    RetrievalConfig,
    RouterConfig,
    SideEffectsConfig,
    SideEffectToolConfig,
)
from duetaspan.config.serving import RecordingConfig, ServerConfig, TracingConfig, TwilioConfig, WebRTCConfig
from duetaspan.config.sip import SipConfig
from duetaspan.config.store import CampaignConfig, RetryRule, StoreConfig
from duetaspan.config.tools import BuiltinToolsConfig, MCPServerConfig, ToolsConfig

__all__ = [
    "ASRConfig",
    "AgentConfig",
    "AnalysisConfig",
    "BuiltinToolsConfig",
    "CampaignConfig",
    "CaptureConfig",
    "EngineConfig",
    "MCPServerConfig",
    "ModelConfig",
    "OutboundConfig",
    "PersonaConfig",
    "PrivacyConfig",
    "RecordingConfig",
    "RetrievalConfig",
    "RetryRule",
    "RouterConfig",
    "ServerConfig",
    "SideEffectToolConfig",
    "SideEffectsConfig",
    "SipConfig",
    "StoreConfig",
    "ToolsConfig",
    "TracingConfig",
    "TwilioConfig",
    "VoiceConfig",
    "WebRTCConfig",
    "WebhooksConfig",
    "format_errors",
]
