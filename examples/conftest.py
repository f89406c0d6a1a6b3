"""Fixtures for the example tests: seeds, and imports that do not leak from one example into the next.

An example's `agent.toml` names its tool modules (`modules = ["reservations"]`), which the agent imports with
the example's folder on `sys.path`. Each test gets `sys.path` and the imported top-level modules restored
afterwards, so examples never see each other's modules.
"""

from __future__ import annotations

import os
import random
import sys

import numpy as np
import pytest

os.environ.setdefault("NO_TORCH_COMPILE", "1")
os.environ.setdefault("NO_CUDA_GRAPH", "1")


@pytest.fixture(autouse=True)
def _seed() -> None:
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_engine():
    """One `tiny-random` engine (2 call slots, CPU) shared by the example agents: loading it once saves
    seconds per example; every call still gets a fresh slot."""
    from duetaspan.model.engine import DuplexEngine, SamplingParams

    # the tests decide when the model asks (force_ret): a random model's own rare <ret> would add spans
    quiet = SamplingParams(allow_ret=False)
    return DuplexEngine.load("tiny-random", device="cpu", max_slots=2, seed=0, sampling=quiet)


@pytest.fixture(autouse=True)
def _isolated_imports():
    path, modules = list(sys.path), set(sys.modules)
    yield
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None) or ""
        # only the example's own modules: leave library modules imported during the test cached
        if origin.startswith(os.path.dirname(__file__)) and not name.startswith("examples."):
            del sys.modules[name]
