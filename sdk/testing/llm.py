"""`ScriptedLLM`: a loopback OpenAI-compatible chat-completions server that answers from rules and records
every request, so a test decides what the router's LLM says.

A script is a dict (or JSON file) with any of:
    steps:   replies used in order, one per request, before anything else;
    rules:   [{"match": "weather", "reply": {...}}]: the first rule whose `match` (case-insensitive) occurs in
             the request's last user message answers it; `match` may be a list (all must occur);
    default: the reply when no step or rule applies (else an empty assistant message).
A reply is a dict with any of (the helpers below build them):
    tool_call:  {"name": ..., "arguments": {...} or a raw string}           `tool_call(name, **arguments)`
    tool_calls: [{"name", "arguments"}, ...] several in one reply            `tool_calls(call, call, ...)`
    content:    assistant text (JSON-in-prompt replies, prose, garbage...)   `content(text)`
    status:     an HTTP error status to answer with (e.g. 500), `body` opt.  `error(500)`
    body:       a raw response body (not even JSON)
    delay_s:    sleep first;  hang: true  never answer                       `delay(s, reply)`, `hang()`
Replies come back in OpenAI's shape: `choices[0].message.tool_calls[i]` = `{"id": "call_...", "type":
"function", "function": {"name", "arguments": "<JSON string>"}}`, `finish_reason` "tool_calls" or "stop".

Example:
    >>> llm = ScriptedLLM({"please book": tool_call("book_table", people=4, time="7 PM"),
    ...                    "and the weather": tool_calls(tool_call("get_weather", city="Paris"),
    ...                                              tool_call("get_time", place="Paris"))})
    >>> [r["match"] for r in llm.rules]
    ['please book', 'and the weather']
    >>> # async with llm as base_url:   Agent(router={"base_url": base_url, "model": "scripted"}, ...)

Command line (for manual runs and examples):
    python -m duetaspan.testing.llm --port 8004 --script script.json
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from duetaspan.testing.servers import ScriptedServer, hang_until_disconnect

Reply = dict[str, Any]


def tool_call(name: str, /, **arguments: Any) -> Reply:
    """A reply that calls tool `name` with `arguments` (native tool calling)."""
    return {"tool_call": {"name": name, "arguments": arguments}}


def tool_calls(*calls: Reply | tuple[str, dict[str, Any]]) -> Reply:
    """A reply with several tool calls at once (OpenAI's parallel tool calls): each a `tool_call(...)` or a
    `(name, arguments)` pair."""
    out = []
    for call in calls:
        if isinstance(call, tuple):
            name, arguments = call
            out.append({"name": name, "arguments": arguments})
        else:
            out.append(call.get("tool_call", call))
    return {"tool_calls": out}


def content(text: str) -> Reply:
    """A reply that is assistant text (a direct answer, a JSON-in-prompt reply, garbage...)."""
    return {"content": text}


def error(status: int = 500, body: str = "scripted failure") -> Reply:
    """A reply that is an HTTP error."""
    return {"status": status, "body": body}


def hang() -> Reply:
    """A reply that never comes (until the client gives up)."""
    return {"hang": True}


def delay(seconds: float, reply: Reply | None = None) -> Reply:
    """`reply` (default: an empty message) after `seconds`."""
    return {**(reply or {}), "delay_s": seconds}


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            text = message.get("content")
            if isinstance(text, list):
                return " ".join(str(part.get("text", "")) for part in text if isinstance(part, dict))
            return str(text or "")
    return ""


def _matches(rule_match: str | Sequence[str], text: str) -> bool:
    needles = [rule_match] if isinstance(rule_match, str) else list(rule_match)
    low = text.lower()
    return all(n.lower() in low for n in needles)


def _rules(rules: Any) -> list[dict[str, Any]]:
    if isinstance(rules, Mapping):
        return [{"match": match, "reply": reply} for match, reply in rules.items()]
    out = []
    for rule in rules or []:
        out.append({"match": rule[0], "reply": rule[1]} if isinstance(rule, tuple) else dict(rule))
    return out


class ScriptedLLM(ScriptedServer):
    """Answers `/v1/chat/completions` from a script and records every request body in `requests`.

    Args:
        script: a script dict (`steps`, `rules`, `default`), or just the rules: a mapping `match -> reply`
            or a list of `(match, reply)` pairs / `{"match", "reply"}` dicts.
        default: the reply when nothing matches (overrides the script's).
    """

    description = "Scripted OpenAI-compatible chat server (tests only)."
    script_help = "JSON script (steps / rules / default)"

    def __init__(self, script: Any = None, *, default: Reply | None = None) -> None:
        if isinstance(script, Mapping) and ({"steps", "rules", "default"} & set(script) or not script):
            self.steps: list[Reply] = list(script.get("steps", []))
            self.rules: list[dict[str, Any]] = _rules(script.get("rules", []))
            self.default: Reply = dict(script.get("default", {}))
        else:
            self.steps, self.rules, self.default = [], _rules(script), {}
        if default is not None:
            self.default = default
        self.requests: list[dict[str, Any]] = []
        self.replies: list[Reply] = []  # the reply given to each request, in order

    def on(self, match: str | Sequence[str], reply: Reply) -> ScriptedLLM:
        """Add a rule (checked after the earlier ones); returns the server, to chain."""
        self.rules.append({"match": match, "reply": reply})
        return self

    @property
    def questions(self) -> list[str]:
        """The last user message of every request so far (what the router asked about)."""
        return [_last_user_text(r.get("messages", [])) for r in self.requests]

    def _pick(self, body: dict[str, Any]) -> Reply:
        if self.steps:
            return self.steps.pop(0)
        text = _last_user_text(body.get("messages", []))
        for rule in self.rules:
            if _matches(rule.get("match", ""), text):
                return dict(rule.get("reply", {}))
        return self.default

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_get("/v1/models", self._models)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        reply = self._pick(body)
        self.replies.append(reply)
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
        return web.json_response(completion(body, reply))


def summary(reply: Reply) -> str:
    """One line saying what a scripted reply was: `book_table({'people': 4})`, `'text'`, `HTTP 503`..."""
    calls = [*reply.get("tool_calls", []), *([reply["tool_call"]] if "tool_call" in reply else [])]
    parts = [f"{c.get('name')}({c.get('arguments', {})})" for c in calls]
    if reply.get("content") is not None:
        parts.append(repr(reply["content"]))
    if reply.get("hang"):
        parts.append("no reply (hang)")
    if "status" in reply:
        parts.append(f"HTTP {reply['status']}")
    if "body" in reply and "status" not in reply:
        parts.append(f"raw body {str(reply['body'])[:60]!r}")
    return " + ".join(parts) or "an empty message"


def completion(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    """The chat completion (OpenAI's shape) that answers request `body` with `reply`."""
    calls = list(reply.get("tool_calls", []))
    if "tool_call" in reply:
        calls.append(reply["tool_call"])
    made = []
    for call in calls:
        args = call.get("arguments", {})
        made.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": call.get("name", ""),
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
        )
    message: dict[str, Any] = {"role": "assistant", "content": reply.get("content")}
    if made:
        message["tool_calls"] = made
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "scripted"),
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if made else "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


main = ScriptedLLM.main

__all__ = [
    "ScriptedLLM",
    "completion",
    "content",
    "delay",
    "error",
    "hang",
    "main",
    "tool_call",
    "tool_calls",
]

if __name__ == "__main__":
    main()
