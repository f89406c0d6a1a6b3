"""Fixtures for the whole suite: deterministic seeds, the caller audio fixtures, loopback ports."""

from __future__ import annotations

import gc
import os
import random
import sys

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
pytest_plugins = ["duetaspan.testing.plugin"]


def pytest_configure(config: pytest.Config) -> None:
    import torch

    torch.set_num_threads(1)


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


@pytest.fixture
def free_port() -> int:
    return support.free_port()


# A real PostgreSQL server per session (worker) and a fresh database per test (tests/store/pg.py).
from tests.store.pg import pg_url, postgres_server  # noqa: E402, F401


@pytest.fixture(autouse=True)
def _own_store(request, monkeypatch):
    """Every test's servers (in-process and `serve` subprocesses, which inherit the variable) keep their store
    (duetaspan.store) in a folder of the test's own, never a shared `data/` under the working directory."""
    if "no_own_store" not in request.keywords:
        path = request.getfixturevalue("tmp_path_factory").mktemp("store") / "duetaspan.sqlite3"
        monkeypatch.setenv("DUETASPAN_STORE_URL", str(path))
