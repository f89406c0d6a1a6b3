"""Fixtures of the reliability tests: one tiny-random engine per module, shared by the agents of its tests."""

from __future__ import annotations

import pytest

from duetaspan.model.engine import DuplexEngine


@pytest.fixture(scope="module")
def tiny_engine() -> DuplexEngine:
    return DuplexEngine.load("tiny-random", max_slots=4, device="cpu", seed=0)
