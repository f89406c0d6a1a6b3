"""The `[tools]` section (built-ins and Python tool modules) and `[[mcp_servers]]`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from duetaspan.config.base import _Section

_SERVER_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,32}$")


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
            transfer_call, send_dtmf.
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
        command: the stdio server's program (found on PATH), e.g. "python", "npx", "uvx"; required unless
            `url` is set.
        args: its arguments.
        cwd: its working directory (relative to agent.toml).
        env: literal environment variables for it.
        env_allow: names of our environment variables it may see (e.g. an API key it needs).
        url: a streamable-HTTP server's URL instead of `command` (one of the two is required).
        headers: HTTP headers for `url` (e.g. Authorization).
        allow: only these of its tools (by MCP name); unset: all.
        deny: never these of its tools.
        timeout_s: one tool call's time limit.
        connect_timeout_s: time to start and initialise the server.
        prefix: always name its tools `<name>__<tool>`.
    """

    name: str
    command: str | None = None
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

    @model_validator(mode="after")
    def _command_or_url(self) -> MCPServerConfig:
        if self.command is None and self.url is None:
            raise ValueError("needs `command` (a stdio server) or `url` (a streamable-HTTP server)")
        return self

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


__all__ = ["BuiltinToolsConfig", "MCPServerConfig", "ToolsConfig"]
