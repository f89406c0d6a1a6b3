"""The suite's parallel run (scripts/test.sh: pytest-xdist, `-n N --dist loadgroup`) keeps its promises: the
tests of one group (tests/adapters/ray's cluster tests, `@pytest.mark.serial`) run on one worker, one after
another; each worker has its own RTP block; scripts/test.sh asks for the workers, the durations and the floor of
tests executed, and runs the serial tests in their own process beside the workers, which run at the lowest CPU
priority."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import support
from tests.support import REPO_ROOT

GROUPED = '''
import os
import pytest

@pytest.mark.parametrize("i", range(4))
@pytest.mark.serial
def test_serial(i, tmp_path_factory):
    (tmp_path_factory.getbasetemp().parent.parent / f"serial-{i}").write_text(os.environ["PYTEST_XDIST_WORKER"])

@pytest.mark.parametrize("i", range(4))
def test_free(i):
    pass
'''


def _run_two_workers(tmp_path: Path) -> subprocess.CompletedProcess:
    """pytest with two xdist workers (`--dist loadgroup`, as scripts/test.sh) on tmp_path's `tests` folder; it
    must pass."""
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("PYTEST_XDIST_WORKER", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
         "--basetemp", str(tmp_path / "base"), "tests"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_loadgroup_sends_a_group_to_one_worker(tmp_path: Path) -> None:
    """With the suite's own conftest (the `serial` marker becomes an xdist group), four serial tests among free
    ones land on one worker. Fails when the group is lost on the way (pytest-xdist issue 1386: pytest 9.2's
    node ids drop the `@group` suffix, which is why the dev extra pins pytest below 9.2)."""
    folder = tmp_path / "tests"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "conftest.py").write_text((REPO_ROOT / "tests" / "conftest.py").read_text())
    (folder / "support.py").write_text((REPO_ROOT / "tests" / "support.py").read_text())
    for plugin in ("cpu_report.py", "scheduling.py"):  # the conftest's plugins
        (folder / plugin).write_text((REPO_ROOT / "tests" / plugin).read_text())
    (folder / "store").mkdir()  # the conftest's PostgreSQL fixtures
    for name in ("__init__.py", "pg.py"):
        (folder / "store" / name).write_text((REPO_ROOT / "tests" / "store" / name).read_text())
    (folder / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\nmarkers = ["serial: one group"]\n'
    )
    done = _run_two_workers(tmp_path)
    assert "8 passed" in done.stdout, done.stdout[-2000:]
    workers = {(tmp_path / f"serial-{i}").read_text() for i in range(4)}
    assert len(workers) == 1, f"the serial group ran on several workers: {workers}"


ORDERED = '''
import os, time
import pytest

@pytest.mark.parametrize("i", range(6))
def test_short(i, tmp_path_factory):
    (tmp_path_factory.getbasetemp().parent.parent / f"start-short-{i}").write_text(str(time.monotonic_ns()))
    time.sleep(0.2)

def test_long(tmp_path_factory):  # collected last; the table says it is the longest
    (tmp_path_factory.getbasetemp().parent.parent / "start-long").write_text(str(time.monotonic_ns()))
    time.sleep(0.2)
'''


def test_a_free_worker_takes_the_longest_unit_first(tmp_path: Path) -> None:
    """tests/scheduling.py: the test the durations table names as the longest starts first although it is
    collected last (xdist's own order would run it last, after the short ones). Fails without the plugin's
    scheduler."""
    folder = tmp_path / "tests"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "scheduling.py").write_text((REPO_ROOT / "tests" / "scheduling.py").read_text())
    (folder / "conftest.py").write_text('pytest_plugins = ["tests.scheduling"]\n')
    (folder / "durations.json").write_text('{"tests/test_ordered.py::test_long": 120.0}')
    (folder / "test_ordered.py").write_text(ORDERED)
    done = _run_two_workers(tmp_path)
    assert "7 passed" in done.stdout, done.stdout[-2000:]
    starts = {p.name.removeprefix("start-"): int(p.read_text()) for p in tmp_path.glob("start-*")}
    order = sorted(starts, key=starts.get)
    assert "long" in order[:2], f"the longest test did not start first: {order}"


def test_the_durations_table_orders_units_and_is_read_from_junit(tmp_path: Path) -> None:
    from tests import scheduling

    units = {"a": ["x::a"], "group": ["x::g1@grp", "x::g2@grp"], "b": ["x::b"], "c": ["x::c"]}
    table = {"x::b": 30.0, "x::g1": 10.0, "x::g2": 10.0}
    assert scheduling.longest_first(units, table) == ["b", "group", "a", "c"]  # unknown ones: xdist's order
    assert scheduling.longest_first(units, {}) == ["group", "a", "b", "c"]  # no table: two unknowns > one
    report = tmp_path / "r.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_parallel" name="test_each_worker_has_its_own_rtp_block" time="2.5"/>'
        '<testcase classname="tests.test_parallel" name="test_quick" time="0.1"/>'
        '<testcase classname="tests.test_parallel" name="test_x[a]@grp" time="3.25"/>'
        "</testsuite></testsuites>"
    )
    got = scheduling.durations_from_reports([str(report)])
    assert got == {"tests/test_parallel.py::test_each_worker_has_its_own_rtp_block": 2.5,
                   "tests/test_parallel.py::test_x[a]": 3.2}  # fmt: skip
    assert scheduling.load_durations(tmp_path / "missing.json") == {}
    table_here = scheduling.load_durations()
    assert table_here and all(isinstance(v, float) for v in table_here.values())  # the committed table loads


def test_each_worker_has_its_own_rtp_block(monkeypatch) -> None:
    seen = []
    for worker in ["", "gw0", "gw1", "gw7", "gw24"]:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        low, high = support.worker_rtp_range()
        peer_low, peer_high = support.peer_rtp_ports()
        assert low % 2 == 0 and high < peer_low and peer_high < low + support.RTP_BLOCK <= 32768, worker
        assert support.worker_sip_settings() == {"rtp_port_min": low, "rtp_port_max": high}
        assert support.worker_sip_toml() == f"rtp_port_min = {low}\nrtp_port_max = {high}\n"
        seen.append((low, low + support.RTP_BLOCK - 1))
    for (a_low, a_high), (b_low, b_high) in itertools.combinations(seen, 2):
        assert a_high < b_low or b_high < a_low, seen  # no two workers share a port


def test_scripts_test_sh_runs_in_parallel_with_durations_and_a_floor() -> None:
    script = (REPO_ROOT / "scripts" / "test.sh").read_text()
    assert "--dist loadgroup" in script and "--durations=40" in script
    assert script.count("--durations=40 --cpu-report=25") == script.count("--durations=40")  # CPU beside wall
    # the workers at nice 19 in the background from the start; beside them, at normal priority, one process
    # at a time: the `alone` tests, then the serial tests. The three selections cover the suite
    workers = script.index('nice -n 19 python -m pytest -q -n "$WORKERS" --dist loadgroup \\\n')
    alone = script.index("-m alone --durations=40")
    serial = script.index('-m "serial and not alone"')
    assert workers < script.index('-m "not serial and not alone"') < alone < serial
    assert script.index('workers_pid=$!') < alone and script.index('wait "$workers_pid"') > serial
    floors = dict(re.findall(r"^MIN_TESTS_(31[13])=(\d+)", script, re.M))
    assert int(floors["311"]) >= 841 and int(floors["313"]) >= 796, floors  # raised, never lowered


def test_the_durations_table_names_tests_that_exist() -> None:
    """tests/durations.json (tests/scheduling.py) names test files that exist: a renamed or deleted module must
    leave it, or its entries silently rot (the table only orders work: refresh it from a full run)."""
    from tests import scheduling

    table = scheduling.load_durations()
    assert len(table) > 50
    missing = sorted({n.split("::")[0] for n in table if not (REPO_ROOT / n.split("::")[0]).is_file()})
    assert not missing, f"tests/durations.json names files that are gone: {missing}"


BURNING = '''
import subprocess
import sys


def test_burns_in_a_subprocess():
    subprocess.run([sys.executable, "-c", "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 1.5: pass"], check=True)


def test_burns_in_process():
    import time
    t = time.process_time()
    while time.process_time() - t < 0.8:
        pass


def test_idle():
    import time
    time.sleep(0.5)
'''


def test_the_cpu_report_counts_subprocesses_and_comes_back_from_the_workers(tmp_path: Path) -> None:
    """`--cpu-report` (tests/cpu_report.py, on in scripts/test.sh) ranks the tests by CPU time, a subprocess's
    included, and the figures reach the controller from xdist's workers; a test that only sleeps costs ~0."""
    (tmp_path / "test_burning.py").write_text(BURNING)
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("PYTEST_XDIST_WORKER", None)
    for xdist in ([], ["-n", "2"]):
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", *xdist, "-p", "no:cacheprovider", "-p", "tests.cpu_report",
             "--cpu-report=5", "test_burning.py"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        lines = re.findall(r"^ *([\d.]+)s cpu  test_burning.py::(\w+)$", done.stdout, re.M)
        spent = {name: float(s) for s, name in lines}
        assert [name for _, name in lines] == ["test_burns_in_a_subprocess", "test_burns_in_process", "test_idle"]
        assert spent["test_burns_in_a_subprocess"] >= 1.5 and spent["test_burns_in_process"] >= 0.8, spent
        assert spent["test_idle"] < 0.4, spent
        assert "most CPU 5 (of " in done.stdout and "in 3 tests" in done.stdout, done.stdout[-2000:]


def test_a_lane_test_must_be_where_the_lanes_grep_finds_it(tmp_path: Path) -> None:
    """scripts/test.sh runs the `serial` and `alone` lanes over the files its grep finds; the suite's conftest
    refuses a marked test in a file that grep would miss, and the grep finds exactly the files marking tests."""
    from tests.conftest import check_lane_marks

    class Item:
        def __init__(self, path: Path, marks: set[str]) -> None:
            self.path, self.nodeid, self.marks = path, f"{path.name}::t", marks

        def get_closest_marker(self, name: str) -> object | None:
            return name if name in self.marks else None

    tests = tmp_path / "tests"
    tests.mkdir()
    spelled = tests / "test_spelled.py"
    spelled.write_text("import pytest\n\npytestmark = pytest.mark.alone\n")
    aliased = tests / "test_aliased.py"
    aliased.write_text("from tests.lanes import SLOW as mark_it\n")
    helper = tests / "helpers.py"
    helper.write_text("import pytest\n\nserial = pytest.mark.serial\n")
    check_lane_marks([Item(spelled, {"alone"}), Item(aliased, set())], tmp_path)
    for item in (Item(aliased, {"serial"}), Item(helper, {"serial"}), Item(spelled, {"serial"})):
        with pytest.raises(pytest.UsageError, match="marked 'serial'"):
            check_lane_marks([item], tmp_path)
    grep = "source <(sed -n '/^marked_files()/,/^}/p' " + str(REPO_ROOT / "scripts" / "test.sh") + ")"
    (tmp_path / "examples").mkdir()
    for mark, files in (("alone", ["tests/test_spelled.py"]), ("serial", [])):  # helpers.py is no test file
        found = subprocess.run(
            ["bash", "-c", f"set -euo pipefail; {grep}; marked_files {mark}"],
            cwd=tmp_path, capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert found.stdout.split() == files, (mark, found.stdout)
    # and in this repository: the files the grep finds for `alone` are the ones that mark tests so
    listed = subprocess.run(
        ["bash", "-c", f"{grep}; marked_files alone"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert "tests/adapters/ray/test_cluster.py" in listed and "tests/adapters/ray/test_drain.py" in listed
    assert all(Path(path).name.startswith("test_") for path in listed), listed
    # the load test runs first in the serial lane (`lead`), no more alone
    serial = subprocess.run(
        ["bash", "-c", f"{grep}; marked_files serial"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert "tests/reliability/test_load.py" in serial and "tests/reliability/test_load.py" not in listed


def test_lead_tests_come_first_and_the_rest_keep_their_order() -> None:
    from tests.conftest import lead_first

    class Item:
        def __init__(self, name: str, *marks: str) -> None:
            self.name, self.marks = name, marks

        def get_closest_marker(self, name: str) -> object | None:
            return name if name in self.marks else None

    items = [Item("a", "serial"), Item("b"), Item("load", "serial", "lead"), Item("c", "serial")]
    lead_first(items)
    assert [i.name for i in items] == ["load", "a", "b", "c"]


def test_the_background_install_and_the_lint_run_on_idle_time_only() -> None:
    """scripts/test.sh's `idle_priority` puts the shell that calls it (and what it starts) under SCHED_IDLE, and
    the second Python's install and the lint call it first: they take only CPU time the tests leave."""
    script = (REPO_ROOT / "scripts" / "test.sh").read_text()
    function = re.search(r"^idle_priority\(\) \{\n.*?^\}\n", script, re.M | re.S)
    assert function, "scripts/test.sh has no idle_priority function"
    install = script.index('install "$python" "$(venv_dir "$version")"')
    assert script.rindex("idle_priority\n", 0, install) > script.index("for version in ${PYTHONS#* }; do")
    assert "(idle_priority && in_venv \"$venv\" ruff check ." in script
    probe = function.group(0) + "( idle_priority; chrt -p $BASHPID; sleep 30 & chrt -p $!; kill $! )\n"
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30)
    if "SCHED_IDLE" not in done.stdout and "chrt" in done.stderr + done.stdout:  # no chrt here: nice 19
        pytest.skip(f"chrt cannot set SCHED_IDLE here: {done.stderr.strip()}")
    assert done.stdout.count("policy: SCHED_IDLE") == 2, done.stdout + done.stderr  # the shell and its child
