"""The pytest plugin of `duetaspan.testing` (entry point `pytest11`: installed with the package, nothing to
configure). Importing it is cheap: torch, Pipecat and the servers load only when a fixture is used.

Fixtures:
    tiny_engine    one `tiny-random` duplex engine (CPU, 4 call slots, seeded) shared by the whole session;
                   it never samples `<ret>` on its own, so a test decides when the model asks (`call.ask()`).
    scripted_llm   a running `ScriptedLLM` (no rules: add them with `.on(match, reply)`), one per test.
    scripted_asr   a running `ScriptedASR`, one per test (`scripted_call(asr=...)` makes it hear what is said).

The fixtures are async (scripted_llm, scripted_asr): run pytest-asyncio in auto mode (`asyncio_mode = "auto"`
in `[tool.pytest.ini_options]`), or mark your tests `@pytest.mark.asyncio` in strict mode.

Example (a conftest needs nothing; a test just names the fixtures):
    >>> # async def test_books(tiny_engine, scripted_llm, scripted_asr): ...
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

try:  # pytest-asyncio's async fixtures; without it the async fixtures say how to get it
    import pytest_asyncio

    _async_fixture: Any = pytest_asyncio.fixture
except ImportError:  # pragma: no cover - the testing extra brings pytest-asyncio
    _async_fixture = pytest.fixture

ENGINE_SLOTS = 4


def load_tiny_engine(max_slots: int = ENGINE_SLOTS) -> Any:
    """A `tiny-random` engine on the CPU (seed 0) that never samples `<ret>` on its own: the tests decide when
    the model asks (`call.ask()`), since a random model's own rare `<ret>` would add spans."""
    import os

    os.environ.setdefault("NO_TORCH_COMPILE", "1")
    os.environ.setdefault("NO_CUDA_GRAPH", "1")
    from duetaspan.model.engine import DuplexEngine, SamplingParams

    quiet = SamplingParams(allow_ret=False)
    return DuplexEngine.load("tiny-random", device="cpu", max_slots=max_slots, seed=0, sampling=quiet)


@pytest.fixture(scope="session")
def tiny_engine() -> Any:
    """One `tiny-random` engine (CPU, 4 slots, seed 0) for the session; every call still gets a fresh slot."""
    return load_tiny_engine()


@_async_fixture
async def scripted_llm() -> AsyncIterator[Any]:
    """A running `ScriptedLLM` for this test (`.base_url`, `.on(match, reply)`, `.requests`)."""
    from duetaspan.testing.llm import ScriptedLLM

    llm = ScriptedLLM()
    async with llm:
        yield llm


@_async_fixture
async def scripted_asr() -> AsyncIterator[Any]:
    """A running `ScriptedASR` for this test (`.transcribe_url`, `.hears(text)`, `.requests`)."""
    from duetaspan.testing.asr import ScriptedASR

    asr = ScriptedASR()
    async with asr:
        yield asr
