"""`duetaspan check`, the first-contact self-test: on the CPU with tiny-random (the GPU figures come when a GPU
is lent, issue 19): one screen, every figure in its JSON, exit 0 when the device serves real time and 1 when
it cannot (tick over budget, or not even one call fits in memory)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from duetaspan.cli import main as cli_main
from duetaspan.model import check

pytestmark = pytest.mark.cuda_logic

ENV_THREADS = ["--threads", "1"]


@pytest.mark.timeout(300)
def test_check_cli_on_cpu_tiny_random(tmp_path):
    out = tmp_path / "check.json"
    proc = subprocess.run(
        [sys.executable, "-m", "duetaspan", "check", "--model", "tiny-random", "--device", "cpu", *ENV_THREADS,
         "--max-calls", "2", "--budget-ms", "60000", "--json", str(out)],
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    screen = proc.stdout.splitlines()
    assert len(screen) <= 24, "one screen"
    labels = [line.split()[0] for line in screen[1:]]
    assert labels == ["memory", "load", "graphs", "persona", "span", "ticks", "capacity", "verdict"]
    assert "verdict   OK" in proc.stdout and "off (eager ticks)" in proc.stdout
    report = json.loads(out.read_text())
    assert report["ok"] is True and report["device"] == "cpu" and report["random_weights"] is True
    assert report["ticks"] == 20 and 0 < report["tick_p50_ms"] <= report["tick_p99_ms"]
    assert report["persona_frames"] > 0 and report["span_frames"] > 3 and report["span_ms"] > 0
    assert [c["calls"] for c in report["capacity"]] == [1, 2] and report["capacity_calls"] == 2
    assert report["memory_calls"] > 2 and report["weights_gib"] > 0 and report["per_call_gib"] > 0


def test_check_exits_nonzero_when_the_tick_is_over_budget(tmp_path, capsys):
    rc = cli_main(["check", "--model", "tiny-random", "--device", "cpu", *ENV_THREADS, "--max-calls", "1",
                   "--ticks", "3", "--budget-ms", "0.01", "--json", str(tmp_path / "c.json")])  # fmt: skip
    screen = capsys.readouterr().out
    assert rc == 1
    assert "verdict   FAIL" in screen and "over the 0.01 ms budget" in screen
    assert "not even one call fits the tick budget" in screen
    assert json.loads((tmp_path / "c.json").read_text())["ok"] is False


def test_check_refuses_before_loading_when_memory_is_short(monkeypatch, capsys):
    monkeypatch.setattr(check, "_device_memory", lambda dev: ("small box", 8.0 * check.GIB, 6.0 * check.GIB))

    def no_load(*a, **k):
        raise AssertionError("loaded a model that cannot fit")

    monkeypatch.setattr("duetaspan.model.engine.DuplexEngine.load", no_load)
    assert cli_main(["check", "--model", "duetaspan-7b", "--device", "cpu", "--random-weights"]) == 1
    screen = capsys.readouterr().out
    assert "room for 0 calls" in screen and "do not fit in 6.0 GiB free" in screen


def test_memory_arithmetic_of_the_7b_on_a_gpu():
    weights, per_call = check.footprint("duetaspan-7b", "cuda")
    assert 14.5 < weights / check.GIB < 17.0  # bf16 LM (~15.4 GB) + float32 Mimi
    assert 1.5 < per_call / check.GIB < 1.9  # ~1.7 GB of KV per call, as docs/gpu.md says


def test_check_without_cuda_says_so(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # what a CPU-only PyTorch reports
    assert cli_main(["check", "--device", "cuda", "--random-weights"]) == 1
    assert "sees no CUDA device" in capsys.readouterr().err


def _check_with(tmp_path) -> tuple[int, dict]:
    rc = cli_main(["check", "--model", "tiny-random", "--device", "cpu", *ENV_THREADS, "--max-calls", "1",
                   "--ticks", "4", "--budget-ms", "60000", "--json", str(tmp_path / "c.json")])  # fmt: skip
    return rc, json.loads((tmp_path / "c.json").read_text())


def test_check_fails_when_the_span_does_not_land(tmp_path, capsys, monkeypatch):
    """An engine that accepts a reference and never lands it (a span queue that loses it) fails the check:
    exit 1 and a line that says so, however fast its ticks are (issue 23 point 7)."""
    from duetaspan.model.engine import DuplexEngine

    monkeypatch.setattr(DuplexEngine, "inject", lambda self, slot, reference: True)  # queued nowhere
    rc, report = _check_with(tmp_path)
    screen = capsys.readouterr().out
    assert rc == 1 and report["ok"] is False and report["span_frames"] == 0
    assert "span      did not land" in screen
    assert "- span: the Context Span injected at tick 5 did not land in the 7 ticks run" in screen
    assert "verdict   FAIL" in screen and "persona:" not in screen


def test_check_fails_when_the_persona_prefill_does_not_land(tmp_path, capsys, monkeypatch):
    """A slot opened without its persona prefill (0 frames prefilled) fails the check (issue 23 point 7)."""
    from duetaspan.model.engine import DuplexEngine

    open_slot = DuplexEngine.open_slot
    monkeypatch.setattr(
        DuplexEngine, "open_slot", lambda self, persona=None, **kw: open_slot(self, None, **kw)
    )
    rc, report = _check_with(tmp_path)
    screen = capsys.readouterr().out
    assert rc == 1 and report["ok"] is False and report["persona_frames"] == 0, report
    assert "- persona: the persona prefill did not land (0 frames prefilled at call start)" in screen
    assert "span:" not in screen


def test_free_ram_counts_the_page_cache_linux_can_reclaim(tmp_path):
    """The CPU's free memory is `MemAvailable` (what a new process can get, page cache included), not
    `MemFree`: on a machine whose page cache fills the RAM, `MemFree` alone left no room for one call."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:          500000 kB\nMemAvailable:   12000000 kB\n")
    assert check._available_ram(meminfo) == 12000000 * 1024
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:          500000 kB\n")  # an old kernel: none
    assert check._available_ram(meminfo) is None
    assert check._available_ram(tmp_path / "absent") is None
    _name, total, free = check._device_memory(torch.device("cpu"))
    if Path("/proc/meminfo").is_file():  # this machine: the figure is MemAvailable's
        available = check._available_ram(Path("/proc/meminfo"))
        assert available is not None and abs(free - available) < 0.05 * total
