"""The one-shot GPU benchmark suite runs end to end on CPU with tiny sizes and writes one JSON file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_gpu_suite_smoke_on_cpu(tmp_path):
    out = tmp_path / "results.json"
    env = {**os.environ, "PYTHON": sys.executable, "NO_CUDA_GRAPH": "1"}
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_suite.sh"), str(out), "--device", "cpu", "--model",
         "tiny-random", "--quick"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    suite = json.loads(out.read_text())
    assert set(suite["benchmarks"]) == {"engine_b1", "spans", "capacity"}
    assert all(b["exit_code"] == 0 and "result" in b for b in suite["benchmarks"].values())
    capacity = suite["benchmarks"]["capacity"]["result"]
    assert [r["calls"] for r in capacity["by_calls"]] == [1, 2]
    assert [r["bucket"] for r in capacity["by_calls"]] == [1, 2]
    assert capacity["cuda_graphs"] is False and capacity["device"] == "cpu"
    assert suite["summary"]["failed"] == 0 and suite["summary"]["batch1_tick_p50_ms"] > 0
