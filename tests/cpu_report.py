"""`--cpu-report=N`: the N tests that cost the most CPU time, beside pytest's `--durations` (wall time).

On CI's 2 cores the suite's wall time follows its CPU time once the waits are filled (CONTRIBUTING, "Running
in parallel"), so this is the list to shorten. Each test's figure is the CPU its process spent from the start
of its setup to the end of its teardown (every thread: in-process servers, the engine, the event loop) plus
what its subprocesses spent, counted when they were waited for (`serve`, SIPp, baresip, a wheel build). A
module or session fixture's cost falls on the test that set it up or tore it down, and a subprocess that
outlives its test on the test that reaps it. Under xdist each worker measures its own tests; the figures
travel to the controller in the reports' `user_properties`.
"""

from __future__ import annotations

import resource

import pytest

KEY = "cpu_s"


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("terminal reporting").addoption(
        "--cpu-report",
        type=int,
        default=0,
        metavar="N",
        help="show the N tests that cost the most CPU time (with subprocesses; 0: none)",
    )


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    item.stash[_START] = _cpu_s()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    if call.when == "teardown" and _START in item.stash:
        outcome.get_result().user_properties.append((KEY, round(_cpu_s() - item.stash[_START], 3)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "teardown":
        return
    for name, value in report.user_properties:
        if name == KEY:
            _SPENT[report.nodeid] = float(value)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    count = config.getoption("cpu_report")
    if not count or not _SPENT:
        return
    total = sum(_SPENT.values())
    terminalreporter.write_sep("=", f"most CPU {count} (of {total:.0f} s in {len(_SPENT)} tests, with subprocesses)")
    for nodeid, spent in sorted(_SPENT.items(), key=lambda kv: -kv[1])[:count]:
        terminalreporter.write_line(f"{spent:7.2f}s cpu  {nodeid}")


_START = pytest.StashKey[float]()
_SPENT: dict[str, float] = {}
