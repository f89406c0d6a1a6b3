"""Turning a tool's result into the one-line reference the speech model reads as a Context Span.

The model was trained on two surface forms: `(tool result) <spoken clause>` for tool output and a plain
sentence for direct answers, plus `(no information found)` when nothing was found. Tools return structured
data; their `render` (or `render_compact` by default) makes the clause and `as_reference` adds the prefix.

Example:
    >>> as_reference(render_compact({"city": "Busan", "temp_c": 26.1}))
    '(tool result) city: Busan, temp c: 26.1.'
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from pydantic import BaseModel

TOOL_RESULT_PREFIX = "(tool result) "
NO_INFO = "(no information found)"

_SPACES = re.compile(r"\s+")


def _plain(value: Any) -> Any:
    """JSON-like data from models and dataclasses, so results can be logged and rendered alike."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    return value


def to_jsonable(value: Any) -> Any:
    """`value` as JSON-serialisable data (unknown objects become their `str`)."""
    return json.loads(json.dumps(_plain(value), default=str))


def _clause(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        parts = []
        for key, item in value.items():
            text = _clause(item)
            if text:
                parts.append(f"{key.replace('_', ' ')}: {text}")
        return ", ".join(parts)
    if isinstance(value, list):
        items = [_clause(v) for v in value]
        grouped = [
            f"({t})" if isinstance(v, dict) and len(value) > 1 else t
            for t, v in zip(items, value, strict=True)
        ]
        return "; ".join(t for t in grouped if t)
    return str(value)


def render_compact(result: Any) -> str:
    """Default rendering: strings as they are, mappings as `key: value, ...`, lists joined with `; `."""
    if isinstance(result, str):
        return one_line(result)
    if result is None:
        return "Done."
    if isinstance(result, int | float):
        return _clause(result)
    text = one_line(_clause(_plain(result)))
    if text and text[-1] not in ".!?":
        text += "."
    return text


def one_line(text: str, max_chars: int | None = None) -> str:
    """Collapse whitespace to one line; cut at a word boundary to `max_chars` with an ellipsis."""
    text = _SPACES.sub(" ", text).strip()
    if max_chars is not None and len(text) > max_chars:
        cut = text[: max_chars - 1]
        if " " in cut[max_chars // 2 :]:
            cut = cut[: cut.rindex(" ")]
        text = cut.rstrip(" ,;:") + "…"
    return text


def as_reference(clause: str, max_chars: int | None = None) -> str:
    """The span-ready line: one line, prefixed with `(tool result) ` unless it already is (or is NO_INFO)."""
    text = one_line(clause, max_chars)
    if not text:
        return NO_INFO
    if text.startswith(TOOL_RESULT_PREFIX.strip()) or text == NO_INFO:
        return text
    return TOOL_RESULT_PREFIX + text
