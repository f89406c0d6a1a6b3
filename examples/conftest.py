"""Fixtures for the example tests: seeds, and imports that do not leak from one example into the next; the
shared `tiny_engine` and the scripted servers come from the `duetaspan.testing` pytest plugin.

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
# The installed package registers the plugin (entry point pytest11); naming it here too keeps a checkout whose
# install predates the entry point working (same name: pytest loads it once).
pytest_plugins = ["duetaspan.testing.plugin"]


@pytest.fixture(autouse=True)
def _seed() -> None:
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


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
