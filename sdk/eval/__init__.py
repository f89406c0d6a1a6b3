"""Measuring an agent (`duetaspan eval`): scenario files and Full-Duplex-Bench v3, run in text mode (the
router only) or audio mode (the full agent), scored for tool selection, arguments and pass@1.

Modules: `scenario` (file models and loader), `fdb_v3` (the benchmark's data and 12 mock tools), `tools`
(mock tools, the call log), `scoring`, `text` and `audio` (the runners), `run` (jobs, scoring, the report
dict), `report` (JSON / HTML), `cli`. Names are imported lazily so that `duetaspan --help` stays fast.

Example:
    >>> from duetaspan.eval import load_suite, TextRunner, run_suite   # doctest: +SKIP
    >>> suite = load_suite("scenarios.yaml")                            # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Scenario": "scenario",
    "Suite": "scenario",
    "load_suite": "scenario",
    "load_fdb_v3": "fdb_v3",
    "mock_result": "fdb_v3",
    "CallLog": "tools",
    "mock_tools": "tools",
    "score_scenario": "scoring",
    "tool_selection": "scoring",
    "args_match": "scoring",
    "TextRunner": "text",
    "AudioRunner": "audio",
    "ScenarioRun": "result",
    "run_suite": "run",
    "write_json": "report",
    "write_html": "report",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'duetaspan.eval' has no attribute {name!r}")
    return getattr(importlib.import_module(f"duetaspan.eval.{module}"), name)
