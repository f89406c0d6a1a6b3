"""The one-shot GPU suite (cuda_logic tests, `duetaspan check`, benchmarks, the moshi reference) runs end to
end on CPU with tiny sizes and writes one JSON file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)  # it asserts no timing: the steps run and report (36 s alone, far under 280 s loaded)
def test_gpu_suite_smoke_on_cpu(tmp_path):
    out = tmp_path / "results.json"
    env = {**os.environ, "PYTHON": sys.executable, "NO_CUDA_GRAPH": "1"}
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_suite.sh"), str(out), "--device", "cpu", "--model",
         "tiny-random", "--quick", "--tests", "one_no_cuda_graph_parser"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    suite = json.loads(out.read_text())
    steps = {"cuda_logic", "check", "engine_b1", "spans", "capacity", "moshi_reference", "burst"}
    assert set(suite["benchmarks"]) == steps
    assert all(b["exit_code"] == 0 and "result" in b for b in suite["benchmarks"].values())
    tests = suite["benchmarks"]["cuda_logic"]["result"]
    assert tests["tests"] == 10 and tests["failures"] == tests["errors"] == tests["skipped"] == 0
    check = suite["benchmarks"]["check"]["result"]
    assert check["ok"] is True and check["ticks"] == 20 and check["span_frames"] > 0
    reference = suite["benchmarks"]["moshi_reference"]["result"]
    assert "skipped" in reference or reference["ratio_p50"] > 0  # moshi is optional (installed --no-deps)
    capacity = suite["benchmarks"]["capacity"]["result"]
    assert [r["calls"] for r in capacity["by_calls"]] == [1, 2]
    assert [r["bucket"] for r in capacity["by_calls"]] == [1, 2]
    assert capacity["cuda_graphs"] is False and capacity["device"] == "cpu"
    assert suite["summary"]["failed"] == 0 and suite["summary"]["batch1_tick_p50_ms"] > 0
    assert suite["summary"]["check_ok"] is True and suite["summary"]["cuda_logic_skipped"] == 0
    burst = suite["benchmarks"]["burst"]["result"]
    assert [r["mode"] for r in burst["results"]] == ["old", "new"] and burst["config"]["live"] == 1
    assert all(r["ticks"] > 0 and not r["failed"] for r in burst["results"])
    assert len(suite["summary"]["burst_skipped_ticks_old_new"]) == 2


def test_gpu_suite_only_runs_the_named_steps(tmp_path):
    out = tmp_path / "results.json"
    env = {**os.environ, "PYTHON": sys.executable, "NO_CUDA_GRAPH": "1"}
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_suite.sh"), str(out), "--device", "cpu", "--model",
         "tiny-random", "--quick", "--only", "check"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert set(json.loads(out.read_text())["benchmarks"]) == {"check"}


def test_moshi_reference_is_skipped_not_failed_without_moshi(tmp_path):
    shadow = tmp_path / "shadow" / "moshi"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('moshi is not installed here')\n")
    out = tmp_path / "ref.json"
    env = {**os.environ, "PYTHONPATH": str(shadow.parent), "NO_CUDA_GRAPH": "1"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "moshi_reference.py"), "--device", "cpu", "--model",
         "tiny-random", "--steps", "2", "--warmup", "0", "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert "pip install --no-deps 'moshi==0.2.13'" in result["skipped"] and "ratio_p50" not in result


def test_capacity_measures_every_count_when_asked_even_far_over_budget(tmp_path):
    # A budget no tick meets: without --every-count the counts stop after the first (its median is over twice
    # the budget); the suite's --quick smoke passes --every-count so a loaded CPU still measures 1 and 2 calls.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    figures = {}
    for flag in ([], ["--every-count"]):
        out = tmp_path / f"capacity{len(flag)}.json"
        proc = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "capacity.py"), "--calls", "1,2", "--ticks", "2",
             "--warmup", "1", "--no-refine", "--threads", "1", "--budget-ms", "0.001", "--json", str(out), *flag],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        figures[bool(flag)] = [r["calls"] for r in json.loads(out.read_text())["by_calls"]]
    assert figures == {False: [1], True: [1, 2]}
