"""Tolerant parsing of router LLM replies: code fences, JSON inside prose, key aliases, prose answers.

A reply becomes one `ParsedReply`: tool `call`s (one or several, in order: `calls`, the first also as
`name` + `arguments`), a direct `answer` sentence, an `abstain` ("(no information found)"), `none` (no span
needed) or `invalid` (with the reason, which is sent back to the LLM in the one repair retry). Several calls
come as `{"calls": [...]}`, `{"tool_calls": [...]}`, a JSON array, or several objects one after another.

Example:
    >>> parse_reply('```json\\n{"tool": "get_time", "args": {"timezone": "Asia/Tokyo"}}\\n```').arguments
    {'timezone': 'Asia/Tokyo'}
    >>> parse_reply("Paris is the capital of France.").kind
    'answer'
    >>> [c.name for c in parse_reply('[{"name": "a"}, {"name": "b", "arguments": {}}]').calls]
    ['a', 'b']
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from duetaspan.registry import NO_INFO

NAME_KEYS = ("name", "tool", "tool_name", "function", "call", "function_name", "action")
ARG_KEYS = ("arguments", "args", "parameters", "params", "input", "kwargs")
ANSWER_KEYS = ("answer", "response", "reply", "text", "content", "final_answer")
NONE_KEYS = ("none", "no_span", "skip", "no_tool")

_FENCE = re.compile(r"```[a-zA-Z0-9_-]*\s*(.*?)```", re.S)
_ABSTAIN = re.compile(
    r"no information found|couldn'?t find|could not find|unable to find|don'?t have (any )?information|"
    r"no (relevant )?information|i'?m not sure|i do not know|i don'?t know",
    re.I,
)
_NONE_WORDS = frozenset({"", "none", "null", "no span", "nothing", "no_span", "skip", "n/a", "no tool"})


@dataclass(frozen=True)
class ParsedCall:
    """One tool call of a reply: the name as the LLM wrote it and its arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedReply:
    """One reply; for `kind="call"`, `calls` holds every call in order and `name`/`arguments` the first."""

    kind: Literal["call", "answer", "abstain", "none", "invalid"]
    name: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    answer: str | None = None
    error: str | None = None
    calls: list[ParsedCall] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.kind == "call" and not self.calls and self.name is not None:
            self.calls = [ParsedCall(self.name, self.arguments)]

    @classmethod
    def of_calls(cls, calls: list[ParsedCall]) -> ParsedReply:
        """A `call` reply of one or several calls (at least one)."""
        return cls("call", name=calls[0].name, arguments=calls[0].arguments, calls=list(calls))


def strip_fences(text: str) -> str:
    """The content of the first code fence, or the text itself."""
    match = _FENCE.search(text)
    if match:
        return match.group(1).strip()
    return text.strip().removeprefix("```").removesuffix("```").strip()


def find_json_object(text: str) -> str | None:
    """The first balanced `{...}` in `text` (string-aware), or None."""
    found = _balanced_object(text, 0)
    return None if found is None else text[found[0] : found[1]]


def find_json_objects(text: str, limit: int = 16) -> list[str]:
    """Every top-level balanced `{...}` in `text`, in order (at most `limit`)."""
    out: list[str] = []
    pos = 0
    while len(out) < limit:
        found = _balanced_object(text, pos)
        if found is None:
            break
        out.append(text[found[0] : found[1]])
        pos = found[1]
    return out


def _balanced_object(text: str, pos: int) -> tuple[int, int] | None:
    start = text.find("{", pos)
    while start != -1:
        depth = 0
        in_string = False
        escaped = False
        for i in range(start, len(text)):
            ch = text[i]
            if in_string:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string = True
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return start, i + 1
        start = text.find("{", start + 1)
    return None


def loads_lenient(text: str) -> Any:
    """`json.loads`, then again after fixing trailing commas and Python literals; raises ValueError."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    fixed = re.sub(r",\s*([}\]])", r"\1", text)
    fixed = re.sub(r"\bTrue\b", "true", re.sub(r"\bFalse\b", "false", re.sub(r"\bNone\b", "null", fixed)))
    if "'" in fixed and '"' not in fixed:
        fixed = fixed.replace("'", '"')
    return json.loads(fixed)


def parse_arguments(raw: Any) -> tuple[dict[str, Any] | None, str | None]:
    """Arguments as a dict (from a dict, a JSON string, or nothing), or `(None, reason)`."""
    if raw is None or raw == "":
        return {}, None
    if isinstance(raw, dict):
        return raw, None
    if isinstance(raw, str):
        try:
            value = loads_lenient(strip_fences(raw))
        except ValueError:
            return None, f"arguments are not valid JSON: {raw[:120]!r}"
        if isinstance(value, dict):
            return value, None
    return None, f"arguments must be a JSON object, got {type(raw).__name__}"


def _first(obj: dict[str, Any], keys: Iterable[str]) -> Any:
    lowered = {str(k).lower(): v for k, v in obj.items()}
    for key in keys:
        if key in lowered and lowered[key] not in (None, ""):
            return lowered[key]
    return None


def _call_list(items: list[Any]) -> ParsedReply:
    """Several replies that must all be tool calls (a list, `calls`, `tool_calls`)."""
    parsed = [parse_object(item) for item in items[:16]]
    if len(parsed) == 1:
        return parsed[0]
    calls: list[ParsedCall] = []
    for i, item in enumerate(parsed, 1):
        if item.kind == "invalid":
            return ParsedReply("invalid", name=item.name, error=f"call {i}: {item.error}")
        if item.kind != "call":
            return ParsedReply("invalid", error=f"item {i} of a list of calls is not a tool call")
        calls.extend(item.calls)
    return ParsedReply.of_calls(calls)


def parse_object(obj: Any) -> ParsedReply:
    """Interpret one decoded JSON value from the LLM."""
    if isinstance(obj, list):
        return _call_list(obj) if obj else ParsedReply("none")
    if not isinstance(obj, dict):
        return ParsedReply("invalid", error="expected a JSON object")
    for key in ("calls", "tool_calls"):
        calls = obj.get(key)
        if isinstance(calls, list) and calls:
            return _call_list(calls)
    name = _first(obj, NAME_KEYS)
    if isinstance(name, dict):  # OpenAI shape: {"function": {"name": ..., "arguments": ...}}
        return parse_object(name)
    if isinstance(name, str) and name.strip():
        arguments, error = parse_arguments(_first(obj, ARG_KEYS))
        if arguments is None:
            return ParsedReply("invalid", name=name.strip(), error=error)
        return ParsedReply("call", name=name.strip(), arguments=arguments)
    answer = _first(obj, ANSWER_KEYS)
    if isinstance(answer, str):
        return parse_text_answer(answer)
    if any(k in {str(x).lower() for x in obj} for k in NONE_KEYS) or not obj:
        return ParsedReply("none")
    return ParsedReply("invalid", error=f"no tool name or answer in keys {sorted(obj)[:6]}")


def looks_like_sentence(text: str) -> bool:
    """A speakable sentence: several words, mostly letters, no code or markup characters."""
    if any(ch in text for ch in "{}[]<>`|\\") or len(text) > 400:
        return False
    words = text.split()
    letters = sum(ch.isalpha() for ch in text)
    return len(words) >= 3 and letters >= 0.6 * len(text.replace(" ", ""))


def parse_text_answer(text: str) -> ParsedReply:
    """A prose reply: nothing, an abstain, a speakable answer sentence, or invalid garbage."""
    text = " ".join(text.split()).strip()
    if text.lower().strip(" .!\"'") in _NONE_WORDS:
        return ParsedReply("none")
    if text == NO_INFO or _ABSTAIN.search(text):
        return ParsedReply("abstain")
    if looks_like_sentence(text):
        return ParsedReply("answer", answer=text)
    return ParsedReply("invalid", error=f"reply is neither JSON nor a speakable sentence: {text[:80]!r}")


def parse_reply(text: str) -> ParsedReply:
    """Parse a JSON-mode (or stray native-mode) text reply."""
    body = strip_fences(text or "")
    if body.lstrip().startswith("["):
        try:
            return parse_object(loads_lenient(body))
        except ValueError:
            pass
    candidates = find_json_objects(body)
    if candidates:
        try:
            first = parse_object(loads_lenient(candidates[0]))
        except ValueError:
            if body.lstrip().startswith("{"):
                return ParsedReply("invalid", error="reply looks like JSON but does not parse")
        else:
            if first.kind != "call" or len(candidates) == 1:
                return first
            return _more_objects(first, candidates[1:])
    return parse_text_answer(body)


def _more_objects(first: ParsedReply, rest: list[str]) -> ParsedReply:
    """Several JSON call objects one after another (one per line, or separated by prose)."""
    calls = list(first.calls)
    for i, candidate in enumerate(rest, 2):
        try:
            item = parse_object(loads_lenient(candidate))
        except ValueError:
            return ParsedReply("invalid", error=f"call {i} does not parse as JSON")
        if item.kind == "invalid":
            return ParsedReply("invalid", name=item.name, error=f"call {i}: {item.error}")
        if item.kind == "call":
            calls.extend(item.calls)
    return ParsedReply.of_calls(calls)


def canonical_tool_name(name: str, known: Iterable[str]) -> str | None:
    """The registered name the LLM meant: exact, case/separator-insensitive, then a close spelling."""
    names = list(known)
    if name in names:
        return name
    squash = {re.sub(r"[^a-z0-9]", "", n.lower()): n for n in names}
    key = re.sub(r"[^a-z0-9]", "", name.lower().split(".")[-1].split("::")[-1])
    if key in squash:
        return squash[key]
    close = difflib.get_close_matches(key, list(squash), n=1, cutoff=0.85)
    return squash[close[0]] if close else None
