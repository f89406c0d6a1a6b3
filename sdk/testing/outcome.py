"""What one retrieval of a scripted call gave (`await call.ask()`), with assertions that read like the call.

An `Outcome` holds the pipeline's frame (a span, no span, or a late span) and the retrieval's events from the
call's event log (question heard, router decision, tool calls with their redacted arguments). Each
`expect_*` returns the outcome, so they chain; a failed one raises `AssertionError` showing the question
heard, the router's decision and every tool call with its arguments.

Example:
    >>> o = Outcome(kind="span", reference="(tool result) Booked for 4 at 7 PM.", events=[
    ...     {"kind": "question", "text": "please book for four at seven"},
    ...     {"kind": "router", "decision": "tool", "tool": "book_table"},
    ...     {"kind": "tool", "tool": "book_table", "arguments": {"people": 4, "time": "7 PM"}, "ok": True}])
    >>> o.expect_tool("book_table", people=4).expect_span(contains="7 PM").tool
    'book_table'
    >>> o.expect_no_tool()
    Traceback (most recent call last):
    ...
    AssertionError: expected no tool call, got book_table
      question heard: 'please book for four at seven'
      router: tool (book_table)
      tool book_table({'people': 4, 'time': '7 PM'}) ok
      outcome: span '(tool result) Booked for 4 at 7 PM.'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["span", "no_span", "late"]


@dataclass
class Outcome:
    """One retrieval's result: `kind` ("span", "no_span", "late"), the span's `reference`, and its events."""

    kind: Kind
    reference: str | None = None
    reason: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)
    frame: Any = None  # the pipeline's SpanFrame / NoSpanFrame / LateSpanFrame
    llm_replies: list[str] = field(default_factory=list)  # what the ScriptedLLM answered, one line each

    # what happened ------------------------------------------------------------------------------
    def _of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("kind") == kind]

    @property
    def question(self) -> str | None:
        """The question the router was asked (what the question capture heard)."""
        found = self._of("question")
        if found:
            return str(found[-1].get("text"))
        return getattr(self.frame, "question", None)

    @property
    def decision(self) -> str | None:
        """The router's decision: tool, answer, abstain, none, refused, invalid, error (None: never asked)."""
        found = self._of("router")
        return str(found[-1].get("decision")) if found else None

    @property
    def detail(self) -> str | None:
        found = self._of("router")
        return found[-1].get("detail") if found else None

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """Every tool that ran for this retrieval: `{"tool", "arguments" (redacted), "ok", "error"}`."""
        return [e for e in self._of("tool")]

    @property
    def tool(self) -> str | None:
        """The (first) tool that ran, or the tool the router chose (also when refused)."""
        if self.tool_calls:
            return str(self.tool_calls[0]["tool"])
        found = self._of("router")
        return found[-1].get("tool") if found else getattr(self.frame, "tool", None)

    @property
    def arguments(self) -> dict[str, Any] | None:
        if self.tool_calls:
            return dict(self.tool_calls[0].get("arguments") or {})
        return getattr(self.frame, "arguments", None)

    def describe(self) -> str:
        """What the retrieval did, one line per step (the body of every failure message)."""
        lines = [f"  question heard: {self.question!r}"]
        lines += [f"  scripted LLM replied: {reply}" for reply in self.llm_replies]
        if self.decision is None:
            lines.append("  router: not asked")
        else:
            router = self._of("router")[-1]
            extra = ", ".join(str(x) for x in (router.get("tool"), router.get("detail")) if x)
            lines.append(f"  router: {self.decision}" + (f" ({extra})" if extra else ""))
        for call in self.tool_calls:
            state = "ok" if call.get("ok") else f"failed: {call.get('error')}"
            lines.append(f"  tool {call.get('tool')}({call.get('arguments')}) {state}")
        for failure in self._of("error"):
            lines.append(f"  error in {failure.get('stage')}: {failure.get('error')}")
        shown = self.reference if self.kind != "no_span" else self.reason
        lines.append(f"  outcome: {self.kind} {shown!r}")
        return "\n".join(lines)

    def _fail(self, message: str) -> AssertionError:
        return AssertionError(f"{message}\n{self.describe()}")

    # assertions ---------------------------------------------------------------------------------
    def expect_tool(self, name: str, /, **arguments: Any) -> Outcome:
        """A tool `name` ran (successfully) for this retrieval, with at least these `arguments`."""
        calls = [c for c in self.tool_calls if c.get("tool") == name]
        if not calls:
            ran = ", ".join(str(c.get("tool")) for c in self.tool_calls) or "no tool"
            raise self._fail(f"expected tool {name!r} to run, but {ran} ran")
        for call in calls:
            got = call.get("arguments") or {}
            if all(k in got and got[k] == v for k, v in arguments.items()) and call.get("ok", True):
                return self
        wrong = {k: (calls[0].get("arguments") or {}).get(k, "<missing>") for k in arguments}
        raise self._fail(f"tool {name!r} ran, but not with {arguments} (got {wrong})")

    def expect_no_tool(self) -> Outcome:
        """No tool ran for this retrieval."""
        if self.tool_calls:
            raise self._fail(
                "expected no tool call, got " + ", ".join(str(c.get("tool")) for c in self.tool_calls)
            )
        return self

    def expect_span(self, contains: str | None = None) -> Outcome:
        """A Context Span landed (in time), whose reference contains `contains` (case-insensitive)."""
        if self.kind != "span":
            raise self._fail(f"expected a span, got {self.kind}")
        if contains is not None and contains.lower() not in (self.reference or "").lower():
            raise self._fail(f"expected the span to contain {contains!r}")
        return self

    def expect_no_span(self) -> Outcome:
        """No span landed for this retrieval."""
        if self.kind == "span":
            raise self._fail("expected no span")
        return self

    def expect_late(self) -> Outcome:
        """The retrieval missed its deadline (no span landed)."""
        if self.kind != "late":
            raise self._fail(f"expected a late span, got {self.kind}")
        return self

    def expect_refused(self, reason: str | None = None, tool: str | None = None) -> Outcome:
        """The router refused a side-effect call (the side-effect policy), optionally `tool`, with `reason`
        in its explanation (case-insensitive); nothing ran and no span landed."""
        if self.decision != "refused":
            raise self._fail(f"expected the router to refuse a side effect, got {self.decision}")
        if tool is not None and self.tool != tool:
            raise self._fail(f"expected {tool!r} to be refused, got {self.tool!r}")
        if reason is not None and reason.lower() not in (self.detail or "").lower():
            raise self._fail(f"expected the refusal to say {reason!r}")
        if self.kind == "span" or self.tool_calls:
            raise self._fail("refused, yet something ran or a span landed")
        return self

    async def judge(self, criterion: str) -> Outcome:
        """Ask the judge model whether this retrieval did `criterion` ("books a table for four"); fails with
        its explanation when not. Real-router mode only (`DUETASPAN_TEST_ROUTER=real`, see `duetaspan.testing
        .judge`); skipped with the reason when no judge key is set."""
        from duetaspan.testing.judge import judge

        verdict, why = await judge(self.describe(), criterion)
        if not verdict:
            raise self._fail(f"the judge says the call did not {criterion!r}: {why}")
        return self


__all__ = ["Outcome"]
