"""MCP servers' tools in the registry: connect at agent start, list, map names, call with timeout and
cancellation, restart a crashed stdio server and retry the call once.

Tool names are mapped to what chat LLM APIs accept (`^[a-zA-Z0-9_-]{1,64}$`): invalid characters become `_`;
a name already taken (by a Python tool or an earlier server, in config order) becomes `<server>__<tool>`,
then `<server>__<tool>_2`, ... so the mapping is deterministic. `structured_content` is preferred as the
result's data; `is_error` results are failures. A stdio server gets only PATH-like basics from the `mcp`
package's safe list, the variables named in `env_allow` and the literal `env` values.

Example:
    >>> from duetaspan.config import MCPServerConfig
    >>> from duetaspan.registry import ToolRegistry
    >>> servers = [MCPServerConfig(name="time", command="python", args=["-m", "mcp_server_time"])]
    >>> async def main():
    ...     registry = ToolRegistry()
    ...     async with MCPToolset(servers) as mcp:
    ...         mcp.register(registry)
    ...         print(await registry.call("get_current_time", {"timezone": "Asia/Tokyo"}))
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

from mcp import Client, MCPError, StdioServerParameters, types

from duetaspan.config import MCPServerConfig
from duetaspan.errors import DuetaspanError
from duetaspan.registry import (
    CallContext,
    Tool,
    ToolDefinitionError,
    ToolFailed,
    ToolRegistry,
    ToolSpec,
    ToolTimeout,
)
from duetaspan.registry.render import render_compact
from duetaspan.registry.tool import SchemaTool

log = logging.getLogger(__name__)

_INVALID = re.compile(r"[^a-zA-Z0-9_-]")


class MCPConnectionError(DuetaspanError, ConnectionError):
    """An MCP server could not be started or reached; the message names the server and its command/url."""


def llm_tool_name(name: str) -> str:
    """An MCP tool name (SEP-986 allows `.` and 128 chars) made acceptable to chat LLM APIs."""
    return (_INVALID.sub("_", name) or "tool")[:64]


def stdio_environment(config: MCPServerConfig, parent: dict[str, str] | None = None) -> dict[str, str]:
    """The variables a stdio server gets on top of the `mcp` package's PATH/HOME/USER basics."""
    parent = dict(os.environ) if parent is None else parent
    env = {k: parent[k] for k in config.env_allow if k in parent}
    env.update(config.env)
    return env


class MCPServerConnection:
    """One MCP server. A background task owns the `mcp.Client` (anyio scopes must be exited by the task that
    entered them); calls are made from any task and fail fast when the connection drops.
    """

    def __init__(self, config: MCPServerConfig) -> None:
        self.config = config
        self.restarts = 0
        self._client: Client | None = None
        self._owner: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._dead = asyncio.Event()
        self._lock = asyncio.Lock()
        self._closed = False

    @property
    def name(self) -> str:
        return self.config.name

    def describe(self) -> str:
        c = self.config
        return c.url if c.url is not None else " ".join([c.command or "", *c.args]).strip()

    def _target(self) -> StdioServerParameters | str:
        c = self.config
        if c.url is not None:
            if c.headers:
                return _http_transport(c)  # type: ignore[return-value]
            return c.url
        return StdioServerParameters(
            command=c.command or "", args=list(c.args), env=stdio_environment(c), cwd=c.cwd
        )

    async def _own(self, ready: asyncio.Future[Client]) -> None:
        try:
            async with Client(self._target(), read_timeout_seconds=self.config.timeout_s) as client:
                self._client = client
                ready.set_result(client)
                await self._stop.wait()
        except BaseException as exc:  # the transport died (server crashed) or we were cancelled
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else ConnectionError(repr(exc)))
            elif not self._stop.is_set():
                log.warning("MCP server %r disconnected: %r", self.name, exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._client = None
            self._dead.set()

    async def start(self) -> None:
        """Connect (spawn the stdio process) within `connect_timeout_s`."""
        async with self._lock:
            await self._start_locked()

    async def _start_locked(self, force: bool = False) -> None:
        if self._closed:
            raise MCPConnectionError(f"MCP server {self.name!r} is closed")
        if not force and self._client is not None and not self._dead.is_set():
            return
        await self._stop_owner()
        self._stop = asyncio.Event()
        self._dead = asyncio.Event()
        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self._owner = asyncio.create_task(self._own(ready), name=f"mcp:{self.name}")
        try:
            async with asyncio.timeout(self.config.connect_timeout_s):
                await asyncio.shield(ready)
        except Exception as exc:
            await self._stop_owner()
            detail = self._connect_failure(exc)
            raise MCPConnectionError(
                f"mcp_servers {self.name!r}: cannot connect to `{self.describe()}`: {detail}"
            ) from exc

    def _connect_failure(self, exc: BaseException) -> str:
        """What failed, in words: the command not found, the server exiting, a timeout, or the leaf error."""
        leaf = _leaf_exception(exc)
        c = self.config
        if isinstance(exc, TimeoutError):
            return f"no MCP handshake within {c.connect_timeout_s:g} s (connect_timeout_s)"
        if c.url is None and isinstance(leaf, FileNotFoundError | PermissionError):
            what = "not found" if isinstance(leaf, FileNotFoundError) else "not executable"
            return (
                f"the command {c.command!r} is {what} (is it installed, e.g. `pip install <package>`, and on "
                "PATH? `command` may be an absolute path)"
            )
        text = _leaf(exc)
        if c.url is None and "connection closed" in text.lower():
            return (
                "the server process exited (or closed its stdout) before the MCP handshake; its own error "
                "output, if any, is just above"
            )
        return f"{type(leaf).__name__}: {text}"

    async def _stop_owner(self) -> None:
        owner, self._owner = self._owner, None
        if owner is None:
            return
        self._stop.set()
        try:
            async with asyncio.timeout(5):
                await asyncio.shield(owner)
        except (TimeoutError, Exception):
            owner.cancel()
            with contextlib.suppress(BaseException):
                await owner

    async def list_tools(self) -> list[types.Tool]:
        """All tools the server lists (every page)."""
        await self.start()
        assert self._client is not None
        tools: list[types.Tool] = []
        cursor: str | None = None
        while True:
            page = await self._client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Call `name`; a dropped connection (crashed server) is restarted and the call retried once.

        Cancelling the awaiting task cancels the request on the server (MCP 2.x sends the notification).
        """
        lost: Client | None = None
        for attempt in (1, 2):
            async with self._lock:
                # `lost`: our call saw the connection drop; another caller may have restarted it already.
                if self._client is None or self._dead.is_set() or (lost is not None and self._client is lost):
                    if self._owner is not None:  # it ran before: this is a restart
                        self.restarts += 1
                        log.warning("restarting MCP server %r (restart %d)", self.name, self.restarts)
                    await self._start_locked(force=True)
                client, dead = self._client, self._dead
            assert client is not None
            call = asyncio.ensure_future(client.call_tool(name, arguments))
            died = asyncio.ensure_future(dead.wait())
            try:
                done, _ = await asyncio.wait({call, died}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                died.cancel()
                if not call.done():
                    call.cancel()
                    with contextlib.suppress(BaseException):
                        await call
            if call in done and not (call.exception() and dead.is_set()):
                try:
                    return call.result()
                except MCPError as exc:
                    if exc.code == types.REQUEST_TIMEOUT:
                        raise ToolTimeout(f"MCP tool {name!r} on {self.name!r} timed out") from exc
                    if exc.code != types.CONNECTION_CLOSED:
                        raise ToolFailed(f"MCP server {self.name!r}: {exc.message}") from exc
            if attempt == 2:
                raise ToolFailed(f"MCP server {self.name!r} disconnected during {name!r} twice")
            lost = client
            log.warning("MCP server %r disconnected during %r; restarting and retrying once", self.name, name)
        raise AssertionError("unreachable")

    async def close(self) -> None:
        self._closed = True
        await self._stop_owner()


def _leaf_exception(exc: BaseException) -> BaseException:
    """The innermost exception of an (exception group) chain."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _leaf(exc: BaseException) -> str:
    """The innermost message of an (exception group) chain, for readable connect errors."""
    exc = _leaf_exception(exc)
    return str(exc) or type(exc).__name__


def _http_transport(config: MCPServerConfig) -> Any:
    """A streamable-HTTP transport carrying the configured headers (auth tokens...)."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(headers=config.headers, timeout=httpx2.Timeout(30, read=300))
    return streamable_http_client(config.url or "", http_client=http)


def _text(result: types.CallToolResult) -> str:
    parts = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        else:
            parts.append(f"[{block.type}]")
    return "\n".join(parts).strip()


def _json_or_none(text: str) -> Any:
    if not text or text[0] not in "[{":
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


class MCPTool(SchemaTool):
    """A tool of an MCP server, registered like any other (spec.source is `mcp:<server>`)."""

    def __init__(self, spec: ToolSpec, connection: MCPServerConnection, remote_name: str) -> None:
        try:
            super().__init__(spec)
        except ToolDefinitionError:  # servers publish sloppy schemas; let the server judge the arguments
            log.warning("MCP tool %r has an invalid input schema; arguments are not validated", remote_name)
            super().__init__(ToolSpec(**{**spec.__dict__, "parameters": {"type": "object"}}))
            object.__setattr__(self, "spec", spec)
        self.connection = connection
        self.remote_name = remote_name

    async def run(self, arguments: dict[str, Any], ctx: CallContext) -> types.CallToolResult:
        result = await self.connection.call_tool(self.remote_name, arguments)
        if result.is_error:
            raise ToolFailed(_text(result) or f"MCP tool {self.remote_name!r} reported an error")
        return result

    def data(self, raw: types.CallToolResult) -> Any:
        if raw.structured_content is not None:
            return raw.structured_content
        text = _text(raw)
        parsed = _json_or_none(text)
        return parsed if parsed is not None else text

    def render(self, raw: types.CallToolResult) -> str:
        text = _text(raw)
        parsed = _json_or_none(text)
        if text and parsed is None:
            return text  # the server's own prose is the best spoken form
        data = raw.structured_content if raw.structured_content is not None else parsed
        if isinstance(data, dict) and set(data) == {"result"}:
            data = data["result"]
        return render_compact(data)


def _spec_for(tool: types.Tool, name: str, config: MCPServerConfig) -> ToolSpec:
    annotations = tool.annotations
    schema = dict(tool.input_schema or {"type": "object"})
    schema.setdefault("type", "object")
    return ToolSpec(
        name=name,
        description=(tool.description or tool.title or "").strip(),
        parameters=schema,
        side_effect=bool(annotations and annotations.destructive_hint and not annotations.read_only_hint),
        timeout=config.timeout_s,
        source=f"mcp:{config.name}",
        meta={"server": config.name, "mcp_name": tool.name},
    )


class MCPToolset:
    """The configured MCP servers: `start()` connects them all (concurrently), `register(registry)` adds
    their allowed tools, `close()` stops them. Use as `async with MCPToolset(configs) as mcp: ...`.
    """

    def __init__(self, configs: Sequence[MCPServerConfig]) -> None:
        self.connections = [MCPServerConnection(c) for c in configs]
        self._listed: dict[str, list[types.Tool]] = {}

    async def start(self) -> None:
        results = await asyncio.gather(
            *(self._start_one(c) for c in self.connections), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.close()
            raise errors[0]

    async def _start_one(self, connection: MCPServerConnection) -> None:
        await connection.start()
        try:
            self._listed[connection.name] = await connection.list_tools()
        except MCPError as exc:
            raise MCPConnectionError(
                f"mcp_servers {connection.name!r}: tools/list failed: {exc.message}"
            ) from exc

    def tools(self, taken: Iterable[str] = ()) -> list[MCPTool]:
        """The allowed tools of every server with LLM-safe, collision-free names (see the module doc)."""
        used = set(taken)
        out: list[MCPTool] = []
        for connection in self.connections:
            config = connection.config
            for listed in self._listed.get(connection.name, []):
                if config.allow is not None and listed.name not in config.allow:
                    continue
                if listed.name in config.deny:
                    continue
                base = llm_tool_name(listed.name)
                name = f"{config.name}__{base}"[:64] if config.prefix or base in used else base
                n = 2
                while name in used:
                    name = f"{config.name}__{base}"[: 64 - len(str(n)) - 1] + f"_{n}"
                    n += 1
                used.add(name)
                out.append(MCPTool(_spec_for(listed, name, config), connection, listed.name))
        return out

    def register(self, registry: ToolRegistry) -> list[Tool]:
        """Add every allowed tool to `registry` (names already there are avoided)."""
        return registry.extend(self.tools(taken=registry.names()))

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.connections), return_exceptions=True)

    async def __aenter__(self) -> MCPToolset:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
