"""Scores of one scenario and of a whole run, following Full-Duplex-Bench v3's definitions.

- Tool selection: precision, recall and F1 over the MULTISETS of tool names (an extra or repeated call
  lowers precision; a missing one lowers recall). No expected and no actual calls is a perfect 1.0.
- Argument accuracy: expected calls are matched to actual calls of the same tool first-in first-out; each
  expected call scores 1 when every expected argument is right, else 0 (not called: 0); the scenario's
  score is the mean (1.0 when no call is expected). "Right" is the benchmark's deterministic rule: the key
  must be present; values starting with `$` (references to earlier results) accept anything; strings compare
  after lowercasing, stripping and replacing `_` by a space; other values compare equal. An optional LLM
  judge (`ArgumentJudge`) may accept what the rule rejects (dates, aliases, +-5 % numbers).
- Pass@1 (strict): recall = precision = 1, every argument right and, in our own format, every expected word
  present and no forbidden word (a scenario that errored fails).

Example:
    >>> sel = tool_selection(["search_flights", "book_flight"], ["search_flights"])
    >>> (sel.precision, sel.recall, round(sel.f1, 3))
    (1.0, 0.5, 0.667)
    >>> args_match({"doc_type": "driver_license", "ref": "$RESULT_0.id"}, {"doc_type": "Driver License ", "ref": 7})
    (True, 'all arguments match')
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# judge(tool, expected_args, actual_args) -> (ok, explanation)
ArgumentJudge = Callable[[str, dict[str, Any], dict[str, Any]], Awaitable[tuple[bool, str]]]


@dataclass
class Selection:
    precision: float
    recall: float
    f1: float
    missing: list[str]
    unexpected: list[str]


def tool_selection(expected: Sequence[str], actual: Sequence[str]) -> Selection:
    """Multiset precision / recall / F1 of tool names."""
    remaining = list(actual)
    missing: list[str] = []
    for name in expected:
        if name in remaining:
            remaining.remove(name)
        else:
            missing.append(name)
    matched = len(expected) - len(missing)
    recall = matched / len(expected) if expected else 1.0
    precision = matched / len(actual) if actual else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return Selection(precision, recall, f1, missing, remaining)


def _normal(value: Any) -> Any:
    return value.lower().strip().replace("_", " ") if isinstance(value, str) else value


def args_match(expected: dict[str, Any], actual: dict[str, Any]) -> tuple[bool, str]:
    """The deterministic argument rule (see the module docstring); returns (ok, why)."""
    for key, want in expected.items():
        if key not in actual:
            return False, f"missing argument {key!r}"
        if isinstance(want, str) and want.startswith("$"):
            continue  # a reference to an earlier tool result: any value is accepted
        if _normal(want) != _normal(actual[key]):
            return False, f"argument {key!r}: expected {want!r}, got {actual[key]!r}"
    return True, "all arguments match"


@dataclass
class ArgumentCheck:
    tool: str
    expected: dict[str, Any]
    actual: dict[str, Any] | None
    ok: bool
    why: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "expected": self.expected,
            "actual": self.actual,
            "ok": self.ok,
            "why": self.why,
        }


async def check_arguments(
    expected: Sequence[tuple[str, dict[str, Any]]],
    actual: Sequence[tuple[str, dict[str, Any]]],
    judge: ArgumentJudge | None = None,
) -> list[ArgumentCheck]:
    """Match expected to actual calls per tool, first in first out, and check each pair's arguments."""
    queues: dict[str, list[dict[str, Any]]] = {}
    for name, args in actual:
        queues.setdefault(name, []).append(args)
    checks: list[ArgumentCheck] = []
    for name, want in expected:
        queue = queues.get(name)
        if not queue:
            checks.append(ArgumentCheck(name, want, None, False, "not called"))
            continue
        got = queue.pop(0)
        ok, why = args_match(want, got)
        if not ok and judge is not None:
            try:
                ok, why = await judge(name, want, got)
                why = f"judge: {why}"
            except Exception as exc:  # the judge is optional: its failure leaves the deterministic verdict
                why = f"{why} (judge failed: {type(exc).__name__}: {exc})"
        checks.append(ArgumentCheck(name, want, got, ok, why))
    return checks


def _word_in(word: str, text: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(word.lower())}(?!\w)", text.lower()) is not None


@dataclass
class ScenarioScore:
    """A scenario's metrics and verdict."""

    selection: Selection
    arguments: list[ArgumentCheck]
    argument_accuracy: float
    missing_words: list[str] = field(default_factory=list)
    forbidden_words: list[str] = field(default_factory=list)
    passed: bool = False
    reason: str = ""


async def score_scenario(
    expected: Sequence[tuple[str, dict[str, Any]]],
    actual: Sequence[tuple[str, dict[str, Any]]],
    *,
    answer: str = "",
    expect_words: Sequence[str] = (),
    forbid_words: Sequence[str] = (),
    error: str | None = None,
    judge: ArgumentJudge | None = None,
) -> ScenarioScore:
    """Score one scenario run (see the module docstring)."""
    selection = tool_selection([n for n, _ in expected], [n for n, _ in actual])
    checks = await check_arguments(expected, actual, judge)
    accuracy = sum(c.ok for c in checks) / len(checks) if checks else 1.0
    missing = [w for w in expect_words if not _word_in(w, answer)]
    forbidden = [w for w in forbid_words if _word_in(w, answer)]
    reasons = []
    if error:
        reasons.append(f"error: {error}")
    if selection.missing:
        reasons.append(f"missing tools {selection.missing}")
    if selection.unexpected:
        reasons.append(f"unexpected tools {selection.unexpected}")
    if not selection.missing and not selection.unexpected and accuracy < 1.0:
        reasons.append("wrong arguments for " + ", ".join(c.tool for c in checks if not c.ok))
    if missing:
        reasons.append(f"answer lacks {missing}")
    if forbidden:
        reasons.append(f"answer says {forbidden}")
    return ScenarioScore(selection, checks, accuracy, missing, forbidden, not reasons, "; ".join(reasons))


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def aggregate(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Run-level metrics from the report's scenario rows: the means of the per-scenario scores."""
    latencies = [r["latency_s"] for r in rows if r.get("latency_s") is not None]
    return {
        "n": len(rows),
        "passed": sum(bool(r["passed"]) for r in rows),
        "pass_at_1": _mean([1.0 if r["passed"] else 0.0 for r in rows]) or 0.0,
        "tool_selection_f1": _mean([r["tool_selection"]["f1"] for r in rows]),
        "tool_precision": _mean([r["tool_selection"]["precision"] for r in rows]),
        "tool_recall": _mean([r["tool_selection"]["recall"] for r in rows]),
        "argument_accuracy": _mean([r["argument_accuracy"] for r in rows]),
        "errors": sum(1 for r in rows if r.get("error")),
        "latency_s": _mean(latencies),
    }


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The top level of report.json: overall metrics plus the same metrics per split."""
    out = aggregate(rows)
    names = sorted({s for r in rows for s in r.get("splits", [])})
    out["splits"] = {name: aggregate([r for r in rows if name in r.get("splits", [])]) for name in names}
    return out


def judge_prompt(tool: str, expected: dict[str, Any], actual: dict[str, Any]) -> str:
    """What the optional LLM judge is asked (rules as the benchmark documents them)."""
    return (
        "Decide whether a voice agent called a function with the right arguments.\n"
        f"Function: {tool}\nExpected arguments: {json.dumps(expected)}\nActual arguments: {json.dumps(actual)}\n"
        "Accept: values starting with '$' (references to an earlier result) match any plausible value; "
        "formatting differences ('August 20' and '2026-08-20', case, underscores versus spaces); common "
        "aliases and abbreviations ('Vegas' for 'Las Vegas'); numbers within 5 percent. Anything else that "
        "differs is wrong.\n"
        'Reply with only a JSON object: {"correct": true or false, "explanation": "..."}'
    )
