"""Waiting on a condition in a test without sleeping and hoping: poll until it holds, fail naming it.

Example:
    >>> import asyncio
    >>> asyncio.run(wait_until(lambda: [1], within_s=1, what="a list"))
    [1]
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


async def wait_until(predicate: Callable[[], Any], within_s: float = 10.0, what: str = "condition") -> Any:
    """Poll `predicate` every 50 ms until it is truthy (returns its value); `AssertionError` after `within_s`."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within_s
    while True:
        value = predicate()
        if value:
            return value
        if loop.time() > end:
            raise AssertionError(f"timed out after {within_s:g} s waiting for {what}")
        await asyncio.sleep(0.05)


__all__ = ["wait_until"]
