"""Which engine failures are fatal, and the test-only fault injection that provokes them.

An engine step that raises once may be a passing problem (a bad frame, a transient allocation failure); the
engine host counts consecutive failed steps and goes down after `[engine] max_failed_steps`. Some errors
leave the device unusable at once: after an illegal memory access or a device-side assert every later CUDA
call fails too (the error is sticky), so waiting for more failed steps only keeps callers in silence.
`is_fatal(exc)` says which: an exception marked `fatal = True` (`EngineFault`), PyTorch's
`torch.AcceleratorError` (what CUDA errors raise since PyTorch 2.8), and the `RuntimeError`s older PyTorch
raises with a CUDA error message. Nothing here imports torch.

**Test-only:** `DUETASPAN_TEST_ENGINE_FAULT` makes an engine host's steps fail on purpose, so that tests can
drive the real `duetaspan serve` (and its engine process) into an engine fault. Never set it in production.
Its value is `KIND:N[:ONCE_FILE]`: after `N` good steps every step raises, a plain `RuntimeError` for
`KIND=raise`, a fatal `EngineFault` for `KIND=fatal`; with `ONCE_FILE` the fault arms only while that file
does not exist and creates it when it first fires (so an engine process restarted after the fault runs clean).

Example:
    >>> is_fatal(RuntimeError("CUDA error: an illegal memory access was encountered"))
    True
    >>> is_fatal(RuntimeError("shape mismatch")), is_fatal(EngineFault("device lost"))
    (False, True)
    >>> TestFault.parse("raise:40").after, TestFault.parse("fatal:0").fatal
    (40, True)
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from duetaspan.errors import ConfigError, DuetaspanError

log = logging.getLogger(__name__)

TEST_FAULT_ENV = "DUETASPAN_TEST_ENGINE_FAULT"
_CUDA_MARKERS = (
    "CUDA error",
    "illegal memory access",
    "device-side assert",
    "CUBLAS_STATUS_",
    "CUDNN_STATUS_",
    "unspecified launch failure",
)


class EngineFault(DuetaspanError):
    """An engine failure the engine cannot recover from (its device state is lost): the host goes down."""

    fatal = True


def is_fatal(exc: BaseException) -> bool:
    """True when `exc` leaves the engine unusable, so its host must go down at once."""
    if getattr(exc, "fatal", False):
        return True
    cls = type(exc)
    if cls.__name__ == "AcceleratorError" and cls.__module__.split(".")[0] == "torch":
        return True
    return isinstance(exc, RuntimeError) and any(marker in str(exc) for marker in _CUDA_MARKERS)


@dataclass
class TestFault:
    """The test-only step fault of `DUETASPAN_TEST_ENGINE_FAULT` (see the module docstring)."""

    __test__ = False  # not a pytest test class

    after: int
    fatal: bool = False
    once_file: Path | None = None
    steps: int = 0

    @classmethod
    def parse(cls, value: str) -> TestFault:
        kind, _, rest = value.partition(":")
        count, _, once = rest.partition(":")
        if kind not in ("raise", "fatal") or not count.isdigit():
            raise ConfigError(
                f"{TEST_FAULT_ENV}={value!r}: expected raise:N or fatal:N (optionally :ONCE_FILE)"
            )
        return cls(int(count), kind == "fatal", Path(once) if once else None)

    @classmethod
    def from_env(cls) -> TestFault | None:
        """The fault `DUETASPAN_TEST_ENGINE_FAULT` asks for (None when unset, or spent: its file exists)."""
        value = os.environ.get(TEST_FAULT_ENV, "")
        if not value:
            return None
        fault = cls.parse(value)
        if fault.once_file is not None and fault.once_file.exists():
            return None
        log.warning("%s=%s: engine steps will fail on purpose (test-only)", TEST_FAULT_ENV, value)
        return fault

    def before_step(self) -> None:
        """Raise once the good steps are used up (called by the host before each engine step)."""
        self.steps += 1
        if self.steps <= self.after:
            return
        if self.once_file is not None and not self.once_file.exists():
            self.once_file.touch()
        message = f"injected engine fault after {self.after} steps ({TEST_FAULT_ENV}, test-only)"
        if self.fatal:
            raise EngineFault(message)
        raise RuntimeError(message)


__all__ = ["TEST_FAULT_ENV", "EngineFault", "TestFault", "is_fatal"]
