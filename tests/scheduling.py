"""Longest first: the order in which the parallel lane's xdist workers take the suite's work units.

`--dist loadgroup` hands each worker one work unit at a time (an `xdist_group`, or a single test), in
collection order after the groups with the most tests. A test that waits two minutes (the GPU suite's CPU
smoke run, a browser call) collected near the end then runs alone on one worker while the others sit idle:
the lane's tail. Here each free worker takes the unit that took longest in a measured run
(`tests/durations.json`: seconds per test id), which is the classic longest-processing-time-first schedule;
units the table does not know count `UNKNOWN_S` and keep xdist's order among themselves. The table only
orders work: a stale or missing one makes the lane slower, never wrong.

Refresh the table from a full run's JUnit reports (scripts/test.sh writes them; `--junitxml`):

    python -m tests.scheduling /tmp/tmp.*/parallel.xml > tests/durations.json
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
UNKNOWN_S = 0.5  # a test the table does not name: most take well under a second
KEEP_S = 2.0  # the table names the tests that took at least this long


def test_id(nodeid: str) -> str:
    """A node id without the `@group` xdist's loadgroup appends to it."""
    return nodeid.split("@", 1)[0]


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)} if isinstance(data, dict) else {}


def unit_cost(nodeids: Any, durations: dict[str, float]) -> float:
    return sum(durations.get(test_id(n), UNKNOWN_S) for n in nodeids)


def longest_first(units: dict[str, Any], durations: dict[str, float]) -> list[str]:
    """The work units' names, longest first (stable: equal costs keep their order)."""
    return sorted(units, key=lambda name: -unit_cost(units[name], durations))


def _scheduler_class() -> Any:
    from xdist.scheduler import LoadGroupScheduling

    class LongestFirstScheduling(LoadGroupScheduling):
        """`loadgroup` whose free worker gets the longest unit left (see the module docstring)."""

        def __init__(self, config: pytest.Config, log: Any = None) -> None:
            super().__init__(config, log)
            self.durations = load_durations()
            self._order: list[str] | None = None
            self._next = 0

        def _assign_work_unit(self, node: Any) -> None:
            queue: OrderedDict[str, dict[str, bool]] = self.workqueue
            if self._order is None:  # the first call sees the whole queue
                self._order = longest_first(queue, self.durations)
            while self._next < len(self._order) and self._order[self._next] not in queue:
                self._next += 1
            if self._next < len(self._order):
                queue.move_to_end(self._order[self._next], last=False)
            # else: a unit put back after a worker crashed, not in the order: xdist's own choice
            super()._assign_work_unit(node)

    return LongestFirstScheduling


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist", None) != "loadgroup":
        return None
    return _scheduler_class()(config, log)


def durations_from_reports(paths: list[str]) -> dict[str, float]:
    """Seconds per test id (setup, call and teardown: JUnit's `time`) of the tests in JUnit reports `paths` that
    took at least `KEEP_S`."""
    out: dict[str, float] = {}
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            module = (case.get("classname") or "").split(".")
            name = case.get("name") or ""
            # a class's tests: classname "tests.x.test_y.TestZ"; find where the module path ends
            for cut in range(len(module), 0, -1):
                candidate = Path(*module[:cut]).with_suffix(".py")
                if candidate.is_file():
                    nodeid = "::".join([candidate.as_posix(), *module[cut:], test_id(name)])
                    break
            else:
                continue
            seconds = float(case.get("time") or 0.0)
            if seconds >= KEEP_S:
                out[nodeid] = round(max(seconds, out.get(nodeid, 0.0)), 1)
    return dict(sorted(out.items()))


if __name__ == "__main__":
    json.dump(durations_from_reports(sys.argv[1:]), sys.stdout, indent=0)
    sys.stdout.write("\n")
