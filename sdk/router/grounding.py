"""Where a side-effect call's arguments came from: every value must be something the caller said, the profile
holds or an earlier tool result returned; an invented one ("John Smith" when nobody said it) refuses the call.

Values are compared by meaning where spelling differs: spoken numbers ("fifteen hundred" is 1500), spoken
ids ("Q seven seven eight one" is Q-7781), clock times ("seven thirty" is 19:30), dates (a day of the month
or a day word), identifier-like values by their words, stems and synonyms (`min_bedrooms`, `credit_card`,
`pets_allowed`), booleans by the caller's yes or no, and a schema `enum` or default is the tool's own choice.

Example:
    >>> g = Grounding.of("minimum bedrooms should be two", [])
    >>> value_grounded("min_bedrooms", {}, g), value_grounded("2", {}, g), value_grounded("3", {}, g)
    (True, True, False)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from duetaspan.registry import ToolSpec
from duetaspan.router.lexicon import (
    DATE_WORDS,
    SYNONYMS,
    compact,
    identifier_words,
    numbers_in,
    parse_date,
    parse_time,
    stem,
    stems,
    words,
)

_IDENTIFIER = re.compile(r"^[a-z][a-z0-9]*(?:[_\-][a-z0-9]+)*$|^[a-z][a-zA-Z0-9]*[A-Z][a-zA-Z0-9]*$")
_FILLER = frozenset({"type", "the", "of", "a", "and", "to", "for", "on", "in", "is", "bill", "account"})
_YES = frozenset(
    "yes allow allowed need needs want must has have with only include friendly ok okay required on enable "
    "should".split()
)
_NO = frozenset("no not without exclude off disable don't dont none never".split())
_BOOL_STRINGS = {"true": True, "false": False, "yes": True, "no": False}


@dataclass(frozen=True)
class Grounding:
    """What arguments may come from, prepared once per call: words, stems, numbers and spoken-id text."""

    words: frozenset[str]
    stems: frozenset[str]
    numbers: frozenset[float]
    compact: str
    caller_words: frozenset[str]
    digit_runs: frozenset[str] = frozenset()

    @classmethod
    def of(cls, question: str, others: Sequence[str], caller: Sequence[str] = ()) -> Grounding:
        text = " ".join([question, *others])
        said = " ".join([question, *caller])
        return cls(
            frozenset(words(text)),
            frozenset(stems(text)),
            frozenset(numbers_in(text)),
            compact(text),
            frozenset(words(said)),
            frozenset(re.findall(r"\d+", compact(text))),
        )


def _number_grounded(value: float, g: Grounding) -> bool:
    if float(value) in g.numbers:
        return True
    if float(value).is_integer() and f"{int(value)}" in g.digit_runs:  # "four two four two" is 4242
        return True
    return float(value) == 1.0 and bool({"a", "an", "one", "it", "this", "that", "single"} & g.words)


def _time_grounded(hour: int, minute: int, g: Grounding) -> bool:
    hours = {hour, hour - 12 if hour > 12 else hour + 12, 12 if hour == 0 else hour}
    said_hour = any(float(h) in g.numbers for h in hours) or (hour == 12 and "noon" in g.words)
    if minute == 0:
        return said_hour
    said_minute = (
        float(minute) in g.numbers
        or (minute == 30 and "half" in g.words)
        or (minute in (15, 45) and "quarter" in g.words)
    )
    if said_hour and said_minute:
        return True
    # "quarter to eight", "ten to seven": minutes before the next hour
    following = (hour + 1) % 24
    next_said = any(
        float(h) in g.numbers for h in (following, following - 12 if following > 12 else following + 12)
    )
    before = 60 - minute
    return (
        "to" in g.words
        and next_said
        and (float(before) in g.numbers or (before == 15 and "quarter" in g.words))
    )


def _word_meant(word: str, g: Grounding) -> bool:
    if word.isdigit():
        return float(word) in g.numbers or word in g.compact
    if stem(word) in g.stems or word in g.words:
        return True
    return any(stem(s) in g.stems for s in SYNONYMS.get(word, ()))


def _identifier_grounded(value: str, g: Grounding) -> bool:
    meaningful = [w for w in identifier_words(value) if w not in _FILLER]
    return bool(meaningful) and all(_word_meant(w, g) for w in meaningful)


def _bool_grounded(value: bool, g: Grounding) -> bool:
    said = g.caller_words
    return bool((_YES if value else _NO) & said) or (not value and bool(_NO & said))


def value_grounded(value: Any, schema: dict[str, Any], g: Grounding) -> bool:
    """Whether one argument value comes from the caller, the profile or a tool result (see the module)."""
    if value is None or ("default" in schema and schema["default"] == value):
        return True
    if isinstance(schema.get("enum"), list) and value in schema["enum"]:
        return True  # a choice among the tool's own options is not invented data
    if isinstance(value, bool):
        return _bool_grounded(value, g)
    if isinstance(value, int | float):
        return _number_grounded(value, g)
    if isinstance(value, list):
        return all(value_grounded(v, {}, g) for v in value)
    if isinstance(value, dict):
        return all(value_grounded(v, {}, g) for v in value.values())
    text = str(value).strip()
    if not text:
        return True
    if text.lower() in _BOOL_STRINGS:
        return _bool_grounded(_BOOL_STRINGS[text.lower()], g)
    if re.fullmatch(r"-?\d+(\.\d+)?", text.replace(",", "")):
        if len(text) >= 5 and text in g.compact:  # an account or document number said digit by digit
            return True
        return _number_grounded(float(text.replace(",", "")), g)
    clock = parse_time(text)
    if clock is not None:
        return _time_grounded(*clock, g)
    day = parse_date(text)
    if day is not None:
        return float(day) in g.numbers or bool(DATE_WORDS & g.words)
    flat = compact(text)
    if len(flat) >= 3 and flat in g.compact:
        return True
    if _IDENTIFIER.match(text):
        return _identifier_grounded(text, g)
    tokens = [t for t in words(text) if len(t) > 1 or t.isdigit()]
    return bool(tokens) and all(t in g.words or stem(t) in g.stems for t in tokens)


def _described(spec: ToolSpec, value: Any, g: Grounding) -> bool:
    """A value the tool's own description names ("driver license" in "(passport, driver license, ...)"), with
    one of its words said: the caller said "license", the LLM wrote the tool's word for it."""
    if not isinstance(value, str) or not value.strip():
        return False
    said = [t for t in words(value) if len(t) > 2]
    phrase = " ".join(words(value))
    return (
        bool(said)
        and _has_phrase(phrase, " ".join(words(spec.description)))
        and any(t in g.words or stem(t) in g.stems for t in said)
    )


def _has_phrase(phrase: str, text: str) -> bool:
    return re.search(rf"(?<![a-z0-9]){re.escape(phrase)}(?![a-z0-9])", text) is not None


def grounded(spec: ToolSpec, key: str, value: Any, g: Grounding, *, choices: bool = True) -> bool:
    """Whether argument `key` = `value` of a `spec` call comes from `g` (`choices=False`: a schema enum or
    default counts only when said, as a request said as its own details needs)."""
    properties = spec.parameters.get("properties", {}) if isinstance(spec.parameters, dict) else {}
    schema = properties.get(key, {}) if isinstance(properties, dict) else {}
    schema = schema if isinstance(schema, dict) else {}
    if not choices:
        schema = {k: v for k, v in schema.items() if k not in ("enum", "default")}
    return value_grounded(value, schema, g) or _described(spec, value, g)


def arguments_grounded(spec: ToolSpec, arguments: dict[str, Any], g: Grounding) -> tuple[bool, str]:
    """`(True, "")`, or `(False, "argument 'x' was not given by the caller")` for the first invented one."""
    for key, value in arguments.items():
        if not grounded(spec, key, value, g):
            return False, f"argument {key!r} was not given by the caller"
    return True, ""
