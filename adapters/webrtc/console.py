"""The page's tool console: the agent's tools with their schemas, run one by hand, land its reference as a
Context Span in a live page call (the same `deliver` the router uses, so the span is written into that call's
slot on the engine, recorded in its artifacts and shown on the page like any other).

Routes (each needs the admin role, `WebRTCService.admin_refusal`, never the page token; bodies are bounded):
    GET  /webrtc/tools          {"tools": [{"name", "description", "parameters", "side_effect", "source"}]}
    POST /webrtc/tools/run      {"name", "arguments": {...}, "call_id"?, "confirm"?: true}
                                -> {"result_id", "tool", "ok", "reference", "error", "arguments" (redacted),
                                    "data", "elapsed_ms", "side_effect"}
                                409 {"error", "confirm_required": true}: a side-effect tool without "confirm"
    POST /webrtc/tools/land     {"result_id", "call_id"} -> {"landed": true, "call_id", "reference"}
                                (404: no such result or live call; 409: the call's slot refused the span)

A side-effect tool (`@tool(side_effect=True)`, an MCP tool marked destructive) never runs without an explicit
`"confirm": true`: the page asks the developer first. Results are kept (the last `KEEP_RESULTS`) so that what
lands is exactly what the tool returned, never text sent by the page.

Example:
    >>> console = ToolConsole(service)                    # doctest: +SKIP
    >>> console.mount(app)                                 # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from duetaspan.adapters.webrtc.host import PageHost
from duetaspan.http_guard import BodyTooLarge, read_body

if TYPE_CHECKING:
    from duetaspan.registry import ToolRegistry, ToolResult

logger = logging.getLogger("duetaspan.webrtc")

TOOLS_PATH = "/webrtc/tools"
RUN_PATH = "/webrtc/tools/run"
LAND_PATH = "/webrtc/tools/land"
KEEP_RESULTS = 64
MAX_DATA_CHARS = 20_000  # a tool's full result as shown on the page (the reference is what lands)


class RunRequest(BaseModel):
    """The body of `POST /webrtc/tools/run`."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64)
    arguments: dict[str, Any] = Field(default_factory=dict)
    call_id: str | None = Field(None, max_length=128, description="run with this live call's context")
    confirm: StrictBool = Field(False, description="required (true) for side-effect tools")


class LandRequest(BaseModel):
    """The body of `POST /webrtc/tools/land`."""

    model_config = ConfigDict(extra="forbid")
    result_id: str = Field(min_length=1, max_length=64)
    call_id: str = Field(min_length=1, max_length=128)


class ConsoleRefused(Exception):
    """A console request that cannot be served; `status` is the HTTP answer."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.extra = extra


async def read_json_body(request: Request, limit: int, what: str) -> Any:
    """The request's JSON body, read with the server's one body limit (`duetaspan.http_guard`): 413 as soon
    as it passes `limit` bytes (declared or streamed), 400 when it is not JSON."""
    try:
        body = await read_body(request, limit)
    except BodyTooLarge as exc:
        raise ConsoleRefused(exc.status, f"{what} refused: {exc}") from None
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConsoleRefused(400, f"{what} is not JSON ({exc.__class__.__name__}: {exc})") from None


def _validated(model: type[BaseModel], data: Any, what: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
        raise ConsoleRefused(400, f"bad {what}: {problems}") from None


class ToolConsole:
    """The console's routes for one `WebRTCService` (its token, its agent's registry, its live calls)."""

    def __init__(self, service: PageHost) -> None:
        self.service = service
        self._results: OrderedDict[str, ToolResult] = OrderedDict()

    @property
    def available(self) -> bool:
        """True when this process holds the agent's tools (not while loading, not on a Ray ingress)."""
        return getattr(self.service.agent, "registry", None) is not None

    def mount(self, app: FastAPI) -> None:
        app.add_api_route(TOOLS_PATH, self.list_tools, methods=["GET"], include_in_schema=False)
        app.add_api_route(RUN_PATH, self.run, methods=["POST"], include_in_schema=False)
        app.add_api_route(LAND_PATH, self.land, methods=["POST"], include_in_schema=False)

    # --- HTTP ------------------------------------------------------------------------------------------
    async def list_tools(self, request: Request) -> Response:
        return await self._serve(request, self._list)

    async def run(self, request: Request) -> Response:
        return await self._serve(request, self._run)

    async def land(self, request: Request) -> Response:
        return await self._serve(request, self._land)

    async def _serve(self, request: Request, handler: Any) -> Response:
        refused = self.service.admin_refusal(request)
        if refused is not None:
            return refused
        try:
            body = await handler(request)
        except ConsoleRefused as exc:
            logger.warning("tool console: refused %s (HTTP %d): %s", request.url.path, exc.status, exc)
            headers = {"Connection": "close"} if exc.status == 413 else None  # the rest is never read
            return JSONResponse({"error": str(exc), **exc.extra}, status_code=exc.status, headers=headers)
        return JSONResponse(body, headers={"Cache-Control": "no-store"})

    def _registry(self) -> ToolRegistry:
        registry = getattr(self.service.agent, "registry", None)
        if registry is None:
            raise ConsoleRefused(
                503,
                "no agent tools in this process (the agent is still loading, or calls run on Ray replicas)",
            )
        return registry

    async def _list(self, request: Request) -> dict[str, Any]:
        return {"tools": [spec.listing() for spec in self._registry().specs()]}

    async def _run(self, request: Request) -> dict[str, Any]:
        limit = self.service.settings.max_tool_body_bytes
        req: RunRequest = _validated(
            RunRequest, await read_json_body(request, limit, "tool request"), "tool request"
        )
        registry = self._registry()
        if req.name not in registry:
            raise ConsoleRefused(
                404, f"no tool named {req.name!r} (registered: {', '.join(registry.names())})"
            )
        spec = registry.get(req.name).spec
        if spec.side_effect and not req.confirm:
            raise ConsoleRefused(
                409,
                f'{req.name} acts on the world (side effect): confirm to run it (send "confirm": true)',
                confirm_required=True,
            )
        ctx = None
        if req.call_id is not None:
            call = self.service.calls.get(req.call_id)
            ctx = getattr(call.session, "context", None) if call is not None else None
        result = await registry.call(req.name, req.arguments, ctx, allow_side_effects=req.confirm)
        result_id = uuid.uuid4().hex[:16]
        self._results[result_id] = result
        while len(self._results) > KEEP_RESULTS:
            self._results.popitem(last=False)
        logger.info(
            "tool console: ran %s%s (%s, %.0f ms)",
            req.name,
            " (confirmed side effect)" if spec.side_effect else "",
            "ok" if result.ok else f"failed: {result.error}",
            result.elapsed_ms,
        )
        data = json.dumps(result.data, ensure_ascii=False, default=str)
        return {
            "result_id": result_id,
            "tool": result.name,
            "ok": result.ok,
            "reference": result.reference,
            "error": result.error,
            "arguments": result.redacted_arguments(),
            "data": result.data if len(data) <= MAX_DATA_CHARS else data[:MAX_DATA_CHARS] + "…",
            "elapsed_ms": round(result.elapsed_ms, 1),
            "side_effect": result.side_effect,
        }

    async def _land(self, request: Request) -> dict[str, Any]:
        limit = self.service.settings.max_tool_body_bytes
        req: LandRequest = _validated(
            LandRequest, await read_json_body(request, limit, "land request"), "land request"
        )
        result = self._results.get(req.result_id)
        if result is None:
            raise ConsoleRefused(404, "no such tool result (run the tool again)")
        call = self.service.calls.get(req.call_id)
        if call is None:
            raise ConsoleRefused(404, f"no live page call {req.call_id!r} in this process (connect first)")
        meta = {"tool": result.name, "arguments": result.redacted_arguments(), "question": None}
        if not call.session.service.deliver(result.reference, meta):
            raise ConsoleRefused(409, f"call {req.call_id} did not take the span (it is ending)")
        logger.info("tool console: landing %s's reference in call %s", result.name, req.call_id)
        return {"landed": True, "call_id": req.call_id, "reference": result.reference}
