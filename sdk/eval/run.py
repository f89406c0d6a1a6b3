"""Runs a suite on a runner (text or audio) with N scenarios at a time, scores each, and builds the report
(`report.json`'s shape: `pass_at_1` and the other metrics at the top, per-split metrics, one row per
scenario with its expected and actual calls). A progress bar goes to stderr on long runs.

Example:
    >>> async def main(config, suite):                            # doctest: +SKIP
    ...     async with TextRunner(config, suite) as runner:
    ...         report = await run_suite(runner, suite, jobs=4, mode="text")
    ...     print(report["pass_at_1"])
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from duetaspan import __version__
from duetaspan.eval.fdb_export import official_summary
from duetaspan.eval.result import ScenarioRun
from duetaspan.eval.scenario import Scenario, Suite
from duetaspan.eval.scoring import ArgumentJudge, judge_prompt, score_scenario, summarize


class Runner(Protocol):
    async def run(self, scenario: Scenario) -> ScenarioRun: ...


def llm_judge(client: Any) -> ArgumentJudge:
    """An argument judge on a `duetaspan.adapters.llm.ChatClient` (the benchmark used gpt-4o at temperature
    0); a reply that is not the asked-for JSON raises, which leaves the deterministic verdict."""

    async def judge(tool: str, expected: dict[str, Any], actual: dict[str, Any]) -> tuple[bool, str]:
        reply = await client.complete([{"role": "user", "content": judge_prompt(tool, expected, actual)}])
        text = reply.content.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
        verdict = json.loads(text)
        return bool(verdict["correct"]), str(verdict.get("explanation", ""))

    return judge


async def scenario_row(
    scenario: Scenario, run: ScenarioRun, *, fdb_v3: bool, judge: ArgumentJudge | None = None
) -> dict[str, Any]:
    """A report row: the run, its expected and actual calls, and its scores."""
    expected = [(c.tool, c.args) for c in scenario.expected_calls]
    actual = [(c.tool, c.args) for c in run.calls]
    score = await score_scenario(
        expected,
        actual,
        answer=run.answer,
        expect_words=() if fdb_v3 else scenario.expect_words,
        forbid_words=() if fdb_v3 else scenario.forbid_words,
        error=run.error,
        judge=judge,
    )
    sel = score.selection
    return {
        "id": scenario.id,
        "example_id": str(scenario.meta.get("example_id", scenario.id)),
        "passed": score.passed,
        "reason": score.reason,
        "splits": scenario.splits,
        "tags": scenario.tags,
        "expected_calls": [
            {"tool": c.tool, "args": c.args} | ({"note": c.note} if c.note is not None else {})
            for c in scenario.expected_calls
        ],
        "actual_calls": [c.as_dict() for c in run.calls],
        "tool_selection": {
            "precision": round(sel.precision, 4),
            "recall": round(sel.recall, 4),
            "f1": round(sel.f1, 4),
            "missing": sel.missing,
            "unexpected": sel.unexpected,
        },
        "argument_accuracy": round(score.argument_accuracy, 4),
        "arguments": [c.as_dict() for c in score.arguments],
        "answer": run.answer,
        "missing_words": score.missing_words,
        "forbidden_words": score.forbidden_words,
        "error": run.error,
        "latency_s": None if run.latency_s is None else round(run.latency_s, 3),
        "response_latency_s": None if run.response_latency_s is None else round(run.response_latency_s, 3),
        "elapsed_s": round(run.elapsed_s, 3),
        "turns": [t.text for t in scenario.turns],
        "meta": scenario.meta,
        "trace": run.trace,
        "stream": run.stream,
    }


# which of the FDB-v3 scorers' means our headline numbers are, per mode (report["fdb_v3"]["headline"])
_HEADLINE = {
    "text": "text mode: pass_at_1, tool_selection_f1 and argument_accuracy are the scorers' *_all means "
    "(overall_pass_rate, tool_selection_acc_all, argument_acc_all: every sample); no agent audio, no turn-taking",
    "audio": "audio mode: the scorers' headline is tool_selection_acc / argument_acc (turn-taken samples); "
    "our table's numbers are their *_all means (every sample)",
}


def _progress(total: int, enabled: bool | None) -> Any:
    """A tqdm bar on stderr (shown for runs of more than a few scenarios, or when asked)."""
    from tqdm import tqdm

    show = total > 3 if enabled is None else enabled
    return tqdm(total=total, desc="eval", unit="scenario", file=sys.stderr, disable=not show, leave=True)


async def run_suite(
    runner: Runner,
    suite: Suite,
    *,
    jobs: int = 1,
    mode: str = "text",
    judge: ArgumentJudge | None = None,
    progress: bool | None = None,
    settings: dict[str, Any] | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run every scenario (`jobs` at a time), score them, and return the report dict."""
    semaphore = asyncio.Semaphore(max(1, jobs))
    fdb_v3 = suite.format == "fdb-v3"
    rows: dict[str, dict[str, Any]] = {}
    bar = _progress(len(suite.scenarios), progress)
    started = time.monotonic()

    async def one(scenario: Scenario) -> None:
        async with semaphore:
            try:
                run = await runner.run(scenario)
            except Exception as exc:  # one broken scenario is a failed row, never a failed run
                run = ScenarioRun(scenario.id, error=f"{type(exc).__name__}: {exc}")
            row = await scenario_row(scenario, run, fdb_v3=fdb_v3, judge=judge)
            rows[scenario.id] = row
            bar.update(1)
            if on_row is not None:
                on_row(row)

    try:
        await asyncio.gather(*(one(s) for s in suite.scenarios))
    finally:
        bar.close()
    ordered = [rows[s.id] for s in suite.scenarios]
    return {
        **summarize(ordered),
        "fdb_v3": official_summary(ordered) | {"headline": _HEADLINE.get(mode, "")},
        "suite": suite.name,
        "format": suite.format,
        "mode": mode,
        "judge": judge is not None,
        "settings": settings or {},
        "duetaspan": __version__,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "elapsed_s": round(time.monotonic() - started, 3),
        "scenarios": ordered,
    }
