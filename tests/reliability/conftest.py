"""Fixtures of the reliability tests: one tiny-random engine per module, shared by the agents of its tests."""

from __future__ import annotations

import pytest

from duetaspan.model.engine import DuplexEngine, SamplingParams


@pytest.fixture(scope="module")
def tiny_engine() -> DuplexEngine:
    # the scripts decide when the model asks (force_ret): a random model's own rare <ret> would add retrievals
    quiet = SamplingParams(allow_ret=False)
    return DuplexEngine.load("tiny-random", max_slots=4, device="cpu", seed=0, sampling=quiet)
