"""What became of each tool call of one router reply, the key that tells a repeated call, and the reference
that carries the results of several calls within the span's size cap.

Example:
    >>> call_key("book_flight", {"passenger_name": "Ada"}) == call_key("book_flight", {"passenger_name": "Ada"})
    True
    >>> call_key("book_flight", {"passenger_name": "Ada"}) == call_key("book_flight", {"passenger_name": "Bo"})
    False
    >>> combine_references(["(tool result) Flight TP123 at 9:05.", "(tool result) Order Q-7781: shipped."], 200)
    '(tool result) Flight TP123 at 9:05. Order Q-7781: shipped.'
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from duetaspan.registry import NO_INFO, TOOL_RESULT_PREFIX, ToolResult
from duetaspan.registry.render import one_line

# Most tool calls run for one reply (a model that answers with dozens is misbehaving).
MAX_CALLS = 8


@dataclass
class CallOutcome:
    """One tool call of a reply.

    Attributes:
        tool: the registered tool name.
        arguments: the arguments, redacted (`[redacted]` for the tool's `redact` fields).
        decision: "tool" (it ran, ok or failed), "refused" (side-effect policy), "repeat" (a call already
            made, not run again).
        tool_result: the registry's result when it ran.
        reference: its share of the span (None when it gives none).
        detail: the refusal reason, the tool's error, or why it is a repeat.
        key: `call_key` of the tool and its real (validated, unredacted) arguments.
    """

    tool: str
    arguments: dict[str, Any]
    decision: Literal["tool", "refused", "repeat"]
    tool_result: ToolResult | None = None
    reference: str | None = None
    detail: str | None = None
    key: str = ""


def call_key(name: str, arguments: dict[str, Any]) -> str:
    """A digest of a tool name and its real arguments: equal for the same call, different for any other
    value (redacted values included), and it does not reveal the values it was made from."""
    text = json.dumps([name, arguments], sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _body(reference: str) -> str:
    return one_line(reference).removeprefix(TOOL_RESULT_PREFIX.strip()).strip()


def _shares(sizes: list[int], budget: int) -> list[int]:
    """Split `budget` characters fairly: short bodies keep their length, long ones share the rest."""
    shares = [0] * len(sizes)
    remaining = budget
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    for n, i in enumerate(order):
        share = max(remaining // (len(sizes) - n), 0)
        shares[i] = min(sizes[i], share)
        remaining -= shares[i]
    return shares


def combine_references(references: Sequence[str | None], max_chars: int) -> str | None:
    """One span line for the results of several calls, in order, at most `max_chars` characters.

    One reference stays as it is (cut to `max_chars`). Several share one `(tool result)` prefix, each
    result cut to a fair share of the cap so every call's result is in the span. A failed call's
    `(no information found)` is kept in its place only when another call gave a result.
    """
    texts = [r for r in references if r]
    if not texts:
        return None
    if len(texts) == 1:
        return one_line(texts[0], max_chars)
    bodies = [_body(t) for t in texts]
    if all(b == NO_INFO for b in bodies):
        return NO_INFO
    budget = max_chars - len(TOOL_RESULT_PREFIX) - (len(bodies) - 1)
    shares = _shares([len(b) for b in bodies], budget)
    parts = [one_line(b, s) if len(b) > s else b for b, s in zip(bodies, shares, strict=True)]
    return TOOL_RESULT_PREFIX + " ".join(p for p in parts if p)
