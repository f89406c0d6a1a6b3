"""A scripted OpenAI-compatible chat-completions server for tests, examples and load tests.

A script is a dict (or JSON file) with any of:
    steps:   replies used in order, one per request, before anything else;
    rules:   [{"match": "weather", "reply": {...}}]: the first rule whose `match` (case-insensitive) occurs in
             the request's last user message answers it; `match` may be a list (all must occur);
    default: the reply when no step or rule applies (else an empty assistant message).
A reply is a dict with any of:
    tool_call: {"name": ..., "arguments": {...} or a raw string}  (native tool calling; also "tool_calls": [...])
    content:   assistant text (JSON-in-prompt replies, prose, code fences, garbage...)
    status:    an HTTP error status to answer with (e.g. 500), `body` optional
    body:      a raw response body (not even JSON)
    delay_s:   sleep first;  hang: true  never answer (until the client gives up)

Example:
    >>> server = ScriptedLLMServer({"rules": [{"match": "weather",
    ...     "reply": {"tool_call": {"name": "get_weather", "arguments": {"city": "Sydney"}}}}]})
    >>> # async with server.serve() as base_url: ChatClient(base_url + "/v1", "fake")...

Command line (for manual runs and examples):
    python -m tests.fakes.llm_server --port 8004 --script script.json
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from aiohttp import web

from tests.fakes.scripted import ScriptedServer, hang_until_disconnect


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
            return str(content or "")
    return ""


def _matches(rule_match: str | list[str], text: str) -> bool:
    needles = [rule_match] if isinstance(rule_match, str) else list(rule_match)
    low = text.lower()
    return all(n.lower() in low for n in needles)


class ScriptedLLMServer(ScriptedServer):
    """Answers `/v1/chat/completions` from a script and records every request body in `requests`."""

    description = "Scripted OpenAI-compatible chat server (tests only)."
    script_help = "JSON script (steps / rules / default)"

    def __init__(self, script: dict[str, Any] | None = None) -> None:
        script = script or {}
        self.steps: list[dict[str, Any]] = list(script.get("steps", []))
        self.rules: list[dict[str, Any]] = list(script.get("rules", []))
        self.default: dict[str, Any] = dict(script.get("default", {}))
        self.requests: list[dict[str, Any]] = []

    def _pick(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.steps:
            return self.steps.pop(0)
        text = _last_user_text(body.get("messages", []))
        for rule in self.rules:
            if _matches(rule.get("match", ""), text):
                return rule.get("reply", {})
        return self.default

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_get("/v1/models", self._models)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        reply = self._pick(body)
        if reply.get("delay_s"):
            await asyncio.sleep(float(reply["delay_s"]))
        if reply.get("hang"):
            await hang_until_disconnect(request)
            return web.Response(status=504)
        if "status" in reply:
            return web.json_response(
                {"error": {"message": reply.get("body", "scripted failure")}}, status=int(reply["status"])
            )
        if "body" in reply:
            return web.Response(text=str(reply["body"]), content_type="application/json")
        return web.json_response(self._completion(body, reply))

    @staticmethod
    def _completion(body: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
        calls = list(reply.get("tool_calls", []))
        if "tool_call" in reply:
            calls.append(reply["tool_call"])
        tool_calls = []
        for call in calls:
            args = call.get("arguments", {})
            tool_calls.append(
                {
                    "id": f"call_{uuid.uuid4().hex[:12]}",
                    "type": "function",
                    "function": {
                        "name": call.get("name", ""),
                        "arguments": args if isinstance(args, str) else json.dumps(args),
                    },
                }
            )
        message: dict[str, Any] = {"role": "assistant", "content": reply.get("content")}
        if tool_calls:
            message["tool_calls"] = tool_calls
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "fake"),
            "choices": [
                {"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }


main = ScriptedLLMServer.main


if __name__ == "__main__":
    main()
