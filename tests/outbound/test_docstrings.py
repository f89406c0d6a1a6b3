"""The docstring examples of answer detection's modules run as written (one in `tones` had gone stale)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["detector", "dsp", "gate", "ivr", "judge", "phrases", "syllables", "tones", "verdicts", "windows"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(f"duetaspan.outbound.{name}")
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0, module.__name__
