"""Fixtures of the reliability tests: one tiny-random engine per module (not the plugin's session-wide
`tiny_engine`: fault tests may take an engine down), shared by the agents of its tests."""

from __future__ import annotations

import pytest

from duetaspan.model.engine import DuplexEngine
from duetaspan.testing.plugin import load_tiny_engine


@pytest.fixture(scope="module")
def tiny_engine() -> DuplexEngine:
    return load_tiny_engine(max_slots=4)
