"""Writing an eval report: `report.json` (the contract: `pass_at_1` at the top, `scenarios[]` with `id`,
`passed`, expected and actual calls), a one-page HTML view of it, and the summary table for the terminal.

Example:
    >>> print(summary_table({"n": 2, "passed": 1, "pass_at_1": 0.5, "tool_selection_f1": 0.75,
    ...                      "argument_accuracy": 0.5, "latency_s": None, "splits": {}}).splitlines()[1])
    all                  2     0.500      0.750      0.500         -
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any


def write_json(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def summary_table(report: dict[str, Any]) -> str:
    """Pass@1, tool selection, argument accuracy and latency, overall and per split."""
    lines = [f"{'split':<16}{'n':>6}{'pass@1':>10}{'tool F1':>11}{'arg acc':>11}{'latency s':>10}"]
    for name, m in [("all", report), *report.get("splits", {}).items()]:
        lines.append(
            f"{name:<16}{m['n']:>6}{_fmt(float(m['pass_at_1'])):>10}{_fmt(m['tool_selection_f1']):>11}"
            f"{_fmt(m['argument_accuracy']):>11}{_fmt(m['latency_s']):>10}"
        )
    return "\n".join(lines + official_lines(report))


def official_lines(report: dict[str, Any]) -> list[str]:
    """The FDB-v3 scorers' numbers for this run (report["fdb_v3"]): in text mode the headline numbers are
    their `*_all` means; in audio mode both their turn-taken means and the `*_all` ones."""
    o = report.get("fdb_v3")
    if not o:
        return []
    out = [
        "FDB-v3 scorers (evaluate_tool_calls.py / evaluate_pass_rate.py, exact rule) on this run:",
        f"  all {o['n']} samples (*_all): tool_selection_acc_all {_fmt(o['tool_selection_acc_all'])}  "
        f"argument_acc_all {_fmt(o['argument_acc_all'])}  pass rate {_fmt(float(o['overall_pass_rate']))}",
    ]
    if report.get("mode") == "text":
        out.append("  text mode: the table's numbers are these *_all means (every sample; no agent audio, "
                   "so no turn-taking)")  # fmt: skip
    else:
        out.append(
            f"  turn-taken {o['turn_taken']}/{o['n']} (their headline): tool_selection_acc "
            f"{_fmt(o['tool_selection_acc'])}  argument_acc {_fmt(o['argument_acc'])}  interruption rate "
            f"{_fmt(o['interruption_rate'])}  latency s {_fmt(o['avg_response_latency_s'])}"
        )
    return out


def _calls(calls: list[dict[str, Any]]) -> str:
    if not calls:
        return "<i>none</i>"
    return "<br>".join(
        f"<code>{html.escape(c['tool'])}({html.escape(json.dumps(c['args'], ensure_ascii=False))})</code>"
        for c in calls
    )


def render_html(report: dict[str, Any]) -> str:
    """A self-contained page: the summary table and one row per scenario (failures first)."""
    esc = html.escape
    rows = sorted(report["scenarios"], key=lambda r: (r["passed"], r["id"]))
    body = []
    for r in rows:
        status = "pass" if r["passed"] else "fail"
        body.append(
            f'<tr class="{status}"><td>{esc(r["id"])}</td><td>{status}</td>'
            f"<td>{esc(', '.join(r['splits']))}</td><td>{_calls(r['expected_calls'])}</td>"
            f"<td>{_calls(r['actual_calls'])}</td><td>{r['tool_selection']['f1']:.2f}</td>"
            f"<td>{r['argument_accuracy']:.2f}</td><td>{esc(r['reason'] or '')}</td>"
            f"<td>{esc(r['answer'][:300])}</td></tr>"
        )
    title = esc(f"duetaspan eval: {report.get('suite') or report.get('format')}")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 4px 8px; vertical-align: top; }}
tr.fail td:nth-child(2) {{ color: #b00; font-weight: bold; }} tr.pass td:nth-child(2) {{ color: #070; }}
pre {{ background: #f6f6f6; padding: 1em; }}
</style></head><body>
<h1>{title}</h1>
<p>mode: {esc(str(report.get("mode")))} &middot; format: {esc(str(report.get("format")))} &middot;
pass@1 <b>{float(report["pass_at_1"]):.3f}</b> ({report["passed"]}/{report["n"]}) &middot;
errors: {report["errors"]} &middot; finished {esc(str(report.get("finished_at", "")))}</p>
<pre>{esc(summary_table(report))}</pre>
<table><thead><tr><th>id</th><th>result</th><th>splits</th><th>expected calls</th><th>actual calls</th>
<th>tool F1</th><th>arg acc</th><th>why</th><th>answer</th></tr></thead>
<tbody>
{chr(10).join(body)}
</tbody></table></body></html>
"""


def write_html(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(report), encoding="utf-8")
