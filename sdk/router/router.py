"""The LLM router: one question in, one reference line (or nothing) out, over a `ToolRegistry`.

Outcomes, in the three shapes the speech model was trained on:
  - a tool ran: its reference, `(tool result) <clause>` (`(tool result) (no information found)` when it found
    nothing; `(no information found)` when it failed, unless `on_tool_error="no_span"`);
  - general knowledge: one plain factual sentence from the LLM;
  - the LLM abstains: no span by default (`speak_abstain=True` sends `(no information found)`);
  - small talk, an empty question, a refused side-effect call, an LLM failure: no span (`reference=None`).

One repair retry is made when the reply is unusable (garbage, unknown tool, arguments that are not JSON or
do not match the schema). Side-effect tools run only when `duetaspan.router.policy.explicit_request` agrees.

Example:
    >>> from duetaspan.adapters.llm import ChatClient   # any `duetaspan.router.ports.ChatModel`
    >>> from duetaspan.registry import ToolRegistry
    >>> router = Router(ToolRegistry(), ChatClient("http://127.0.0.1:8004/v1", "gemma"), mode="json")
    >>> # result = await router.route("what time is it in tokyo", db=db)
    >>> # result.reference -> '(tool result) It is 9:05 PM in Tokyo.'
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from duetaspan.registry import (
    NO_INFO,
    TOOL_RESULT_PREFIX,
    CallContext,
    ToolArgumentsInvalid,
    ToolRegistry,
    ToolResult,
)
from duetaspan.registry.render import one_line
from duetaspan.router.context_db import ContextDB
from duetaspan.router.parse import ParsedReply, canonical_tool_name, parse_arguments, parse_reply
from duetaspan.router.policy import explicit_request
from duetaspan.router.ports import ChatModel, ChatModelError, ChatReply
from duetaspan.router.prompt import build_messages

Decision = Literal["tool", "answer", "abstain", "none", "refused", "invalid", "error"]


@dataclass
class RouteStep:
    """Progress reported while routing: `kind` "llm" (one LLM request) or "tool" (one tool call)."""

    kind: Literal["llm", "tool"]
    ms: float
    tool: str | None = None
    arguments: dict[str, Any] | None = None  # redacted
    ok: bool = True
    error: str | None = None


@dataclass
class RouteResult:
    """What the router decided; `reference` is the span text, or None for no span."""

    decision: Decision
    reference: str | None
    llm_ms: float = 0.0
    tool_ms: float = 0.0
    attempts: int = 0
    tool: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)  # redacted
    tool_result: ToolResult | None = None
    detail: str | None = None


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'])")


def first_sentence(text: str, max_chars: int) -> str:
    """The first sentence of a direct answer, one line, at most `max_chars`."""
    text = one_line(text)
    parts = _SENTENCE_END.split(text, maxsplit=1)
    if len(parts) > 1 and len(parts[0].split()) >= 3:
        text = parts[0]
    return one_line(text, max_chars)


class Router:
    """Routes questions with an LLM over a tool registry. Stateless between calls: per-call memory is the
    `ContextDB` passed to `route`, so one router can serve every call of an agent.

    Args:
        registry: the tools.
        llm: the chat model (`duetaspan.router.ports.ChatModel`, e.g. `duetaspan.adapters.llm.ChatClient`).
        mode: "native" (tools via the API's `tools=`) or "json" (catalogue in the prompt, JSON reply).
        speak_abstain: deliver `(no information found)` when the LLM abstains without running a tool.
        on_tool_error: a failed tool gives `(no information found)` ("no_info") or no span ("no_span").
        max_reference_chars: cap for direct answers and tool references.
        extra_instructions: appended to the system rules (domain hints, persona facts...).
    """

    def __init__(
        self,
        registry: ToolRegistry,
        llm: ChatModel,
        *,
        mode: Literal["native", "json"] = "native",
        speak_abstain: bool = False,
        on_tool_error: Literal["no_info", "no_span"] = "no_info",
        max_reference_chars: int = 1000,
        extra_instructions: str = "",
    ) -> None:
        self.registry = registry
        self.llm = llm
        self.mode = mode
        self.speak_abstain = speak_abstain
        self.on_tool_error = on_tool_error
        self.max_reference_chars = max_reference_chars
        self.extra_instructions = extra_instructions

    async def aclose(self) -> None:
        await self.llm.aclose()

    async def route(
        self,
        question: str,
        *,
        db: ContextDB | None = None,
        agent_said: str = "",
        ctx: CallContext | None = None,
        on_step: Callable[[RouteStep], None] | None = None,
    ) -> RouteResult:
        """Route one question. Never raises for LLM or tool failures (they become `decision="error"`);
        cancellation propagates."""
        question = " ".join(question.split())
        if not question:
            return RouteResult("none", None, detail="empty question")
        ctx = ctx if ctx is not None else (db.ctx if db is not None else None)
        if agent_said == "" and db is not None:
            agent_said = db.agent_text
        specs = self.registry.specs()
        messages: list[dict[str, Any]] = build_messages(
            question,
            mode=self.mode,
            specs=specs,
            db=db,
            agent_said=agent_said,
            extra_instructions=self.extra_instructions,
        )
        tools = self.registry.openai_tools() if self.mode == "native" and specs else None
        result = RouteResult("invalid", None)
        for attempt in (1, 2):
            result.attempts = attempt
            try:
                reply = await self.llm.complete(messages, tools=tools)
            except ChatModelError as exc:
                result.decision, result.detail = "error", str(exc)
                return result
            result.llm_ms += reply.elapsed_ms
            if on_step is not None:
                on_step(RouteStep("llm", reply.elapsed_ms))
            parsed = self._interpret(reply)
            problem = await self._act(parsed, question, db, ctx, result, on_step)
            if problem is None:
                return result
            if attempt == 1:
                messages = [
                    *messages,
                    _echo(reply),
                    {"role": "user", "content": _repair_prompt(problem, self)},
                ]
        result.decision = result.decision if result.decision != "invalid" else "invalid"
        result.reference = None
        return result

    def _interpret(self, reply: ChatReply) -> ParsedReply:
        if reply.tool_calls:
            call = reply.tool_calls[0]
            arguments, error = parse_arguments(call.arguments_json)
            if arguments is None:
                return ParsedReply("invalid", name=call.name, error=error)
            return ParsedReply("call", name=call.name, arguments=arguments)
        return parse_reply(reply.content)

    async def _act(
        self,
        parsed: ParsedReply,
        question: str,
        db: ContextDB | None,
        ctx: CallContext | None,
        result: RouteResult,
        on_step: Callable[[RouteStep], None] | None,
    ) -> str | None:
        """Carry out one parsed reply into `result`; returns a problem to repair, or None when done."""
        if parsed.kind == "invalid":
            result.decision, result.detail = "invalid", parsed.error
            return parsed.error or "unusable reply"
        if parsed.kind == "none":
            result.decision, result.reference = "none", None
            return None
        if parsed.kind == "abstain":
            result.decision = "abstain"
            result.reference = NO_INFO if self.speak_abstain else None
            return None
        if parsed.kind == "answer":
            result.decision = "answer"
            result.reference = first_sentence(parsed.answer or "", self.max_reference_chars)
            return None
        name = canonical_tool_name(parsed.name or "", self.registry.names())
        if name is None:
            result.decision, result.detail = "invalid", f"unknown tool {parsed.name!r}"
            return f"there is no tool named {parsed.name!r}"
        spec = self.registry.get(name).spec
        grounding = _grounding(db)
        allowed, reason = explicit_request(spec, parsed.arguments, question, grounding)
        result.tool = name
        if not allowed:
            result.decision, result.reference, result.detail = "refused", None, reason
            result.arguments = _redact(parsed.arguments, spec.redact)
            return None
        tool_result = await self.registry.call(name, parsed.arguments, ctx, allow_side_effects=True)
        result.tool_result = tool_result
        result.tool_ms += tool_result.elapsed_ms
        result.arguments = tool_result.redacted_arguments()
        if on_step is not None:
            on_step(
                RouteStep(
                    "tool",
                    tool_result.elapsed_ms,
                    tool=name,
                    arguments=result.arguments,
                    ok=tool_result.ok,
                    error=tool_result.error,
                )
            )
        if not tool_result.ok and isinstance(tool_result.exception, ToolArgumentsInvalid):
            result.decision, result.detail = "invalid", tool_result.error
            return f"the arguments for {name!r} are invalid: {tool_result.error}"
        result.decision = "tool"
        if tool_result.ok:
            reference = tool_result.reference or NO_INFO
            if reference == NO_INFO:
                reference = TOOL_RESULT_PREFIX + NO_INFO
            result.reference = one_line(reference, self.max_reference_chars)
        else:
            result.detail = tool_result.error
            result.reference = NO_INFO if self.on_tool_error == "no_info" else None
        return None


def _redact(arguments: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    return {k: ("[redacted]" if k in fields else v) for k, v in arguments.items()}


def _grounding(db: ContextDB | None) -> list[str]:
    if db is None:
        return []
    texts = db.caller_utterances()[-6:]
    texts += list(db.profile.as_dict().values())
    texts += [t.text for t in db.tool_turns()[-5:]]
    return texts


def _echo(reply: ChatReply) -> dict[str, Any]:
    """The assistant's previous reply as plain text, so the retry works on servers without tool messages."""
    if reply.tool_calls:
        call = reply.tool_calls[0]
        text = json.dumps({"name": call.name, "arguments": call.arguments_json}, ensure_ascii=False)
    else:
        text = reply.content or "(empty reply)"
    return {"role": "assistant", "content": text[:1000]}


def _repair_prompt(problem: str, router: Router) -> str:
    names = ", ".join(router.registry.names()) or "(none)"
    how = (
        "Call one of the tools correctly, or reply with the answer sentence, or NONE."
        if router.mode == "native"
        else 'Reply with ONE JSON object: {"name": ..., "arguments": {...}} or {"answer": ...} or {"none": true}.'
    )
    return f"Your reply could not be used: {problem}. Available tools: {names}. {how}"
