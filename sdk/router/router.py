"""The LLM router: one question in, one reference line (or nothing) out, over a `ToolRegistry`.

Outcomes, in the three shapes the speech model was trained on:
  - tools ran: their reference, `(tool result) <clause>` (`(tool result) (no information found)` when it found
    nothing; `(no information found)` when it failed, unless `on_tool_error="no_span"`). A reply with several
    tool calls (a two-part request) runs them all, in order, each under the side-effect policy, and the
    reference carries every result within `max_reference_chars` (`RouteResult.calls`, one per call);
  - general knowledge: one plain factual sentence from the LLM;
  - the LLM abstains: no span by default (`speak_abstain=True` sends `(no information found)`);
  - small talk, an empty question, a refused side-effect call, an LLM failure: no span (`reference=None`).

One repair retry is made when the reply is unusable (garbage, unknown tool, arguments that are not JSON or
do not match the schema); every call of a reply is checked before any runs, so a retry never repeats one.
Side-effect tools run only when the `SideEffectPolicy` agrees (`duetaspan.router.policy`). Calls whose
`call_key` the caller passes in `skip` (calls already made) are not run again (`decision="repeat"`).

Example:
    >>> from duetaspan.adapters.llm import ChatClient   # any `duetaspan.router.ports.ChatModel`
    >>> from duetaspan.registry import ToolRegistry
    >>> router = Router(ToolRegistry(), ChatClient("http://127.0.0.1:8004/v1", "gemma"), mode="json")
    >>> # result = await router.route("what time is it in tokyo", db=db)
    >>> # result.reference -> '(tool result) It is 9:05 PM in Tokyo.'
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Container
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
from duetaspan.router.outcome import MAX_CALLS, CallOutcome, call_key, combine_references
from duetaspan.router.parse import (
    ParsedCall,
    ParsedReply,
    canonical_tool_name,
    parse_arguments,
    parse_reply,
)
from duetaspan.router.policy import SideEffectPolicy
from duetaspan.router.ports import ChatModel, ChatModelError, ChatReply
from duetaspan.router.prompt import build_messages

log = logging.getLogger(__name__)

Decision = Literal["tool", "answer", "abstain", "none", "refused", "repeat", "invalid", "error"]


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
    """What the router decided; `reference` is the span text, or None for no span.

    `calls` has one `CallOutcome` per tool call of the reply, in order; `tool`, `arguments` and `tool_result`
    are those of the first call that ran (else the first call), for code that expects one call.
    `decision` is "tool" when any call ran, else "refused" when the policy refused one, else "repeat".
    """

    decision: Decision
    reference: str | None
    llm_ms: float = 0.0
    tool_ms: float = 0.0
    attempts: int = 0
    tool: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)  # redacted
    tool_result: ToolResult | None = None
    detail: str | None = None
    calls: list[CallOutcome] = field(default_factory=list)

    @property
    def ran(self) -> list[CallOutcome]:
        """The calls that ran (ok or failed)."""
        return [c for c in self.calls if c.decision == "tool"]


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
        max_reference_chars: cap for direct answers and tool references (all results of a reply together).
        extra_instructions: appended to the system rules (domain hints, persona facts...).
        policy: the side-effect policy (default: keyword mode; an "llm" policy without its own model asks
            this router's `llm`).
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
        policy: SideEffectPolicy | None = None,
    ) -> None:
        self.registry = registry
        self.policy = policy if policy is not None else SideEffectPolicy()
        if self.policy.llm is None:
            self.policy.llm = llm
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
        skip: Container[str] = (),
    ) -> RouteResult:
        """Route one question. Never raises for LLM or tool failures (they become `decision="error"`);
        cancellation propagates. `skip`: `call_key`s of calls already made, which are not run again."""
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
            problem = await self._act(parsed, question, db, ctx, result, on_step, skip)
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
            calls = []
            for call in reply.tool_calls:
                arguments, error = parse_arguments(call.arguments_json)
                if arguments is None:
                    return ParsedReply("invalid", name=call.name, error=f"{call.name}: {error}")
                calls.append(ParsedCall(call.name, arguments))
            return ParsedReply.of_calls(calls)
        return parse_reply(reply.content)

    async def _act(
        self,
        parsed: ParsedReply,
        question: str,
        db: ContextDB | None,
        ctx: CallContext | None,
        result: RouteResult,
        on_step: Callable[[RouteStep], None] | None,
        skip: Container[str],
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
        if not parsed.calls:
            result.decision, result.detail = "invalid", "a tool call without a name"
            return "a tool call without a name"
        if len(parsed.calls) > MAX_CALLS:
            log.warning("router reply has %d tool calls; only the first %d run", len(parsed.calls), MAX_CALLS)
        # every call is checked before any runs, so a repair retry never repeats one that already ran
        planned: list[tuple[str, dict[str, Any], str]] = []
        for call in parsed.calls[:MAX_CALLS]:
            name = canonical_tool_name(call.name, self.registry.names())
            if name is None:
                result.decision, result.detail = "invalid", f"unknown tool {call.name!r}"
                return f"there is no tool named {call.name!r}"
            try:
                validated = self.registry.get(name).validate(call.arguments)
            except ToolArgumentsInvalid as exc:
                result.decision, result.detail, result.tool = "invalid", str(exc), name
                return f"the arguments for {name!r} are invalid: {exc}"
            planned.append((name, call.arguments, call_key(name, validated)))
        result.calls = []
        this_reply: set[str] = set()
        for name, arguments, key in planned:
            seen = key in this_reply or key in skip  # the same call twice in one reply runs once
            result.calls.append(await self._run_one(name, arguments, key, question, db, ctx, on_step, seen))
            this_reply.add(key)
        self._summarise(result)
        return None

    async def _run_one(
        self,
        name: str,
        arguments: dict[str, Any],
        key: str,
        question: str,
        db: ContextDB | None,
        ctx: CallContext | None,
        on_step: Callable[[RouteStep], None] | None,
        repeat: bool,
    ) -> CallOutcome:
        spec = self.registry.get(name).spec
        if repeat:
            return CallOutcome(
                name, _redact(arguments, spec.redact), "repeat", key=key, detail="already made"
            )
        verdict = await self.policy.check(spec, arguments, question=question, db=db)
        if not verdict.allowed:
            redacted = _redact(arguments, spec.redact)
            return CallOutcome(name, redacted, "refused", key=key, detail=verdict.reason)
        tool_result = await self.registry.call(name, arguments, ctx, allow_side_effects=True)
        outcome = CallOutcome(
            name, tool_result.redacted_arguments(), "tool", tool_result=tool_result, key=key
        )
        if on_step is not None:
            on_step(
                RouteStep(
                    "tool",
                    tool_result.elapsed_ms,
                    tool=name,
                    arguments=outcome.arguments,
                    ok=tool_result.ok,
                    error=tool_result.error,
                )
            )
        if tool_result.ok:
            reference = tool_result.reference or NO_INFO
            outcome.reference = TOOL_RESULT_PREFIX + NO_INFO if reference == NO_INFO else reference
        else:
            outcome.detail = tool_result.error
            outcome.reference = NO_INFO if self.on_tool_error == "no_info" else None
        return outcome

    def _summarise(self, result: RouteResult) -> None:
        """The result's decision, reference and first-call fields from its calls."""
        ran = [c for c in result.calls if c.decision == "tool"]
        main = ran[0] if ran else result.calls[0]
        result.tool, result.arguments, result.tool_result = main.tool, main.arguments, main.tool_result
        result.tool_ms = sum(c.tool_result.elapsed_ms for c in ran if c.tool_result is not None)
        if ran:
            result.decision = "tool"
            result.reference = combine_references([c.reference for c in ran], self.max_reference_chars)
            failed = [c.detail for c in ran if c.detail]
            refused = [f"{c.tool}: {c.detail}" for c in result.calls if c.decision == "refused"]
            result.detail = "; ".join([*failed, *refused]) or None
            return
        refusals = [c for c in result.calls if c.decision == "refused"]
        result.decision = "refused" if refusals else "repeat"
        result.reference = None
        result.detail = "; ".join(c.detail or "" for c in (refusals or result.calls[:1]))


def _redact(arguments: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    return {k: ("[redacted]" if k in fields else v) for k, v in arguments.items()}


def _echo(reply: ChatReply) -> dict[str, Any]:
    """The assistant's previous reply as plain text, so the retry works on servers without tool messages."""
    if reply.tool_calls:
        calls = [{"name": c.name, "arguments": c.arguments_json} for c in reply.tool_calls[:MAX_CALLS]]
        text = json.dumps({"calls": calls} if len(calls) > 1 else calls[0], ensure_ascii=False)
    else:
        text = reply.content or "(empty reply)"
    return {"role": "assistant", "content": text[:1000]}


def _repair_prompt(problem: str, router: Router) -> str:
    names = ", ".join(router.registry.names()) or "(none)"
    how = (
        "Make the whole reply again: call the tools the request needs (all of them, correctly), or reply "
        "with the answer sentence, or NONE."
        if router.mode == "native"
        else 'Reply with ONE JSON object: {"name": ..., "arguments": {...}}, or {"calls": [{"name": ..., '
        '"arguments": {...}}, ...]} for several tools, or {"answer": ...} or {"none": true}.'
    )
    return f"Your reply could not be used: {problem}. Available tools: {names}. {how}"
