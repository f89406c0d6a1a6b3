#!/usr/bin/env python
"""The published Full-Duplex-Bench v3 file through `duetaspan eval`, offline: loader, text mode, export, guard.

    python benchmarks/fdb_v3.py benchmark_data_v2.json                 # the figures of docs/evals.md
    python benchmarks/fdb_v3.py benchmark_data_v2.json --json          # the same as one JSON object
    python benchmarks/fdb_v3.py benchmark_data_v2.json --keep DIR      # keep the script, report and export

Nothing here reaches a network or needs a key. The router's LLM is `duetaspan.testing.llm` on loopback with
an *oracle* script written from the file itself: for each scenario's request it replies with exactly the
scenario's `expected_tool_calls`, all in one reply where there are several (a `$RESULT_n...` value takes the
value that the n-th call's mock result holds there), and `NONE` when asked again after the tools ran. So the
router always makes the expected calls, and what stops a call is the SDK: the tools' schemas, the
side-effect policy (keyword mode, the default where no model is reachable), the loader. The run is
`duetaspan eval FILE --format fdb-v3 --text --export-fdb DIR` as a user types it (docs/evals.md's recipe).

It prints the loader's warnings, the eval's scores (ours and the benchmark scorers' `fdb_v3` numbers), and
the side-effect guard on the benchmark's action calls: how many it let run, and how many it refused, split
into "the caller did not ask" (the action check) and "an argument was not given" (the argument check), with
the scenario ids (never their sentences: the file is not ours to copy).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from duetaspan.eval.fdb_v3 import TOOL_SPECS, load_fdb_v3, mock_result
from duetaspan.testing.llm import ScriptedLLM

_REF = re.compile(r"^\$RESULT_(\d+)((?:\.\w+|\[\d+\])*)$")
_STEP = re.compile(r"\.(\w+)|\[(\d+)\]")


def resolve(value: Any, results: list[dict[str, Any]]) -> Any:
    """A `$RESULT_n.path[0].key` value read from the n-th expected call's mock result (else kept as is)."""
    if not isinstance(value, str):
        return value
    match = _REF.match(value)
    if not match or int(match.group(1)) >= len(results):
        return value
    node: Any = results[int(match.group(1))]
    for key, index in _STEP.findall(match.group(2)):
        try:
            node = node[key] if key else node[int(index)]
        except (KeyError, IndexError, TypeError):
            return value
    return node


def oracle_script(path: Path, *, one_reply: bool = False) -> dict[str, Any]:
    """The scripted router's rules: each request's words answered with its expected calls.

    All of a request's calls come in one reply, except (unless `one_reply`) those with a `$RESULT_n` value:
    nobody knows that value before the n-th call ran, so they come when the router is asked again after the
    first round of tools, as a real router would make them.
    """
    loader_log = logging.getLogger("duetaspan.eval.fdb_v3")
    level = loader_log.level
    loader_log.setLevel(logging.ERROR)  # the eval run prints the warnings
    try:
        suite = load_fdb_v3(path)
    finally:
        loader_log.setLevel(level)
    first: list[dict[str, Any]] = []
    again: list[dict[str, Any]] = []
    for scenario in suite.scenarios:
        request = next(t.text for t in scenario.turns if t.route)
        results: list[dict[str, Any]] = []
        now, later = [], []
        for call in scenario.expected_calls:
            args = {k: resolve(v, results) for k, v in call.args.items()}
            refers = any(isinstance(v, str) and _REF.match(v) for v in call.args.values())
            (later if refers and not one_reply else now).append({"name": call.tool, "arguments": args})
            try:
                results.append(mock_result(call.tool, args))
            except KeyError:
                results.append({})
        # the router's message carries the question's last 480 characters, whitespace collapsed
        needle = " ".join(request.split())[-120:]
        first.append({"match": needle, "reply": {"tool_calls": now} if now else {"content": "NONE"}})
        if later:  # asked again after the first round: the calls that use its results (repeats end the chain)
            again.append({"match": ["TOOL CALLS ALREADY MADE", needle], "reply": {"tool_calls": later}})
    done = {"match": "TOOL CALLS ALREADY MADE", "reply": {"content": "NONE"}}
    return {"rules": [*again, done, *first], "default": {"content": "NONE"}}


def guard_figures(report: dict[str, Any], side_effect_tools: set[str]) -> dict[str, Any]:
    """The side-effect calls of the run: how many ran, how many the policy refused and why."""
    ran = refused_action = refused_argument = 0
    action_ids: list[str] = []
    argument_ids: list[str] = []
    reasons: Counter[str] = Counter()
    for row in report["scenarios"]:
        for step in row.get("trace") or []:
            for call in step.get("calls") or []:
                if call.get("tool") not in side_effect_tools:
                    continue
                if call.get("decision") == "tool":
                    ran += 1
                elif call.get("decision") == "refused":
                    detail = str(call.get("detail") or "")
                    if detail.startswith("argument"):
                        refused_argument += 1
                        argument_ids.append(f"{row['id']}:{call['tool']}")
                        reasons[re.sub(r"'[^']*'", "'…'", detail)[:80]] += 1
                    else:
                        refused_action += 1
                        action_ids.append(f"{row['id']}:{call['tool']}")
    expected = sum(
        1 for row in report["scenarios"] for c in row["expected_calls"] if c["tool"] in side_effect_tools
    )
    return {
        "side_effect_calls_expected": expected,
        "ran": ran,
        "refused_not_asked": refused_action,
        "refused_argument": refused_argument,
        "refused_not_asked_ids": action_ids,
        "refused_argument_ids": argument_ids,
    }


async def _eval(command: list[str], script: dict[str, Any]) -> tuple[int, str, str]:
    """`duetaspan eval` (a child process, as a user runs it) against the scripted router on loopback."""
    async with ScriptedLLM(script) as base_url:
        command = [part.replace("{URL}", base_url) for part in command]
        env = {**os.environ, "OPENAI_API_KEY": ""}
        child = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
        )
        out, err = await asyncio.wait_for(child.communicate(), 900)
    return int(child.returncode or 0), out.decode(), err.decode()


def run(path: Path, workdir: Path, jobs: int, one_reply: bool = False) -> dict[str, Any]:
    script = oracle_script(path, one_reply=one_reply)
    (workdir / "router_script.json").write_text(json.dumps(script, indent=1))
    # the keyword mode, named: unset, a router on loopback would make it keywords+llm (the scripted server
    # would then be asked as the judge too)
    (workdir / "offline.toml").write_text('[router]\napi_key_env = ""\n\n[router.side_effects]\nmode = "keywords"\n')
    report_path, export = workdir / "report.json", workdir / "fdb-results"
    command = [
        sys.executable, "-m", "duetaspan", "eval", str(path), "--format", "fdb-v3", "--text",
        "--config", str(workdir / "offline.toml"), "--router-base-url", "{URL}",
        "--report", str(report_path), "--export-fdb", str(export), "--jobs", str(jobs),
    ]  # fmt: skip
    code, _out, err = asyncio.run(_eval(command, script))
    if code != 0:
        raise SystemExit(f"duetaspan eval failed ({code}):\n{err[-3000:]}")
    report = json.loads(report_path.read_text())
    side_effect_tools = {name for name, (_d, _s, side) in TOOL_SPECS.items() if side}
    warnings = [line for line in err.splitlines() if "FDB-v3 data:" in line]
    return {
        "file": str(path),
        "scenarios": len(report["scenarios"]),
        "exported_samples": len(list(export.glob("*/result_duetaspan.json"))),
        "loader_warnings": [line.split("FDB-v3 data: ", 1)[1][:110] for line in warnings],
        "pass_at_1": report["pass_at_1"],
        "tool_selection_f1": report["tool_selection_f1"],
        "argument_accuracy": report["argument_accuracy"],
        "errors": report["errors"],
        "splits": {k: v.get("pass_at_1") for k, v in report["splits"].items()},
        "fdb_v3": report.get("fdb_v3"),
        "failed": [row["id"] for row in report["scenarios"] if not row["passed"]],
        "guard": guard_figures(report, side_effect_tools),
        "one_reply": one_reply,
        "command": " ".join(["duetaspan", *command[3:]]),
    }


def show(f: dict[str, Any]) -> str:
    g, scorers = f["guard"], f["fdb_v3"] or {}
    lines = [
        f"{f['file']}: {f['scenarios']} scenarios, {f['exported_samples']} samples exported",
        *(f"  loader warning: {w}" for w in f["loader_warnings"]),
        "oracle router (always the expected calls"
        + (", all in one reply" if f["one_reply"] else "; those using a result on the re-ask")
        + "), keyword side-effect policy:",
        f"  pass@1 {f['pass_at_1']:.2f}   tool F1 {f['tool_selection_f1']:.4f}   argument accuracy "
        f"{f['argument_accuracy']:.4f}   errors {f['errors']}",
        "  splits pass@1: " + ", ".join(f"{k} {v:.2f}" for k, v in f["splits"].items() if v is not None),
        f"  the benchmark scorers' numbers: tool_selection_acc_all {scorers.get('tool_selection_acc_all')}, "
        f"argument_acc_all {scorers.get('argument_acc_all')}, overall_pass_rate "
        f"{scorers.get('overall_pass_rate')}",
        f"  failed ({len(f['failed'])}): {', '.join(f['failed'])}",
        f"side-effect guard: {g['side_effect_calls_expected']} expected action calls, {g['ran']} ran, "
        f"{g['refused_not_asked']} refused as not asked, {g['refused_argument']} refused for an argument",
        f"  not asked: {', '.join(g['refused_not_asked_ids']) or '-'}",
        f"  argument: {', '.join(g['refused_argument_ids']) or '-'}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("path", type=Path, help="benchmark_data_v2.json (or a file in its shape)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--keep", type=Path, help="write the script, report and export here")
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument(
        "--one-reply", action="store_true",
        help="every expected call in the first reply, also those using an earlier call's result",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        figures = run(args.path, args.keep, args.jobs, args.one_reply)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            figures = run(args.path, Path(tmp), args.jobs, args.one_reply)
    print(json.dumps(figures, indent=1) if args.json else show(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
