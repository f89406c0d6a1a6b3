"""The seam between the engine runner and where the engine runs: the `EngineHost` protocol a host implements
and the `HostEvents` a host reports to.

The runner (`duetaspan.pipeline.runner.EngineRunner`) owns admission, call handles and crash bookkeeping once;
a host owns the engine and its 80 ms clock wherever they live: `ThreadHost` (an engine thread in this
process), `ProcessHost` (a child process per GPU, reached over a socket). Calls are known to a host only by
the integer key the runner gives them. See `CONTRIBUTING.md` (Adding an engine host) for how to add one.

Example (a runner on a host; `EngineRunner(engine)` is shorthand for the in-thread host):
    >>> async def main(engine):                                   # doctest: +SKIP
    ...     async with EngineRunner(host=ThreadHost(engine)) as runner:
    ...         call = await runner.attach("CA1", on_output=print)
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol

import numpy as np

from duetaspan.pipeline.ticks import SlotStats, TickOutput


class HostEvents(Protocol):
    """What a host tells its runner. May be called from any thread (the engine thread, a reader task)."""

    def tick(self, key: int, out: TickOutput) -> None:
        """One engine step's output for the call with this key."""

    def call_failed(self, key: int, exc: BaseException) -> None:
        """The engine step failed for this call; the call may go on (the next tick may succeed)."""

    def host_down(self, exc: BaseException, *, crashed: bool) -> None:
        """The host is gone (stopped, or `crashed`: its process died, or its steps kept failing, see
        `[engine] max_failed_steps`): every call on it is over and `exc` (an `EngineFailed`) says why."""


class EngineHost(Protocol):
    """Where one engine runs and ticks. Every method but `start`/`stop`/`open_slot`/`close_slot` is
    thread-safe and returns at once."""

    name: str
    clock: Any  # `ClockStats` or anything with `summary()`, `last_step_ms` and `timing` (for /metrics)

    @property
    def max_slots(self) -> int:
        """How many calls the engine can step at once (the runner's default admission limit)."""

    @property
    def running(self) -> bool:
        """True while calls can be attached and ticked."""

    @property
    def error(self) -> BaseException | None:
        """Why the host went down on its own (None while it runs, or after a plain stop); kept while a
        host that restarts (a fresh engine process) is not back yet, so admission refuses meanwhile."""

    def bind(self, events: HostEvents) -> None:
        """Called once by the runner before `start`: where ticks, call errors and the host's end go."""

    def start(self) -> Awaitable[None] | None:
        """Start the engine and its clock; return an awaitable when that takes a while (loading a model)."""

    async def stop(self) -> None:
        """Close every slot and stop ticking."""

    async def open_slot(
        self,
        key: int,
        call_id: str,
        *,
        persona: Any,
        sampling: Any,
        seed: int | None,
        hold_agent: bool = False,
    ) -> tuple[int, SlotStats]:
        """Open an engine slot for a call (its prompt prefill runs next to the engine); return the slot
        number and the call's live input figures. Ticks for `key` may be reported before this returns.
        `hold_agent`: the slot opens with its agent held at silence (see `hold_agent`)."""

    async def close_slot(self, key: int) -> None:
        """Stop ticking the call and free its slot."""

    def push(self, key: int, pcm: np.ndarray) -> None:
        """Queue one checked caller frame (float32[1920]) for the call's next free tick."""

    def backlog(self, key: int) -> int:
        """Caller frames queued for the call here (0 where the queue lives elsewhere)."""

    def inject(self, key: int, reference: str, span_id: int | None = None) -> bool:
        """Queue a Context Span for the call (its landed `SpanLanded` carries `span_id`); False when refused."""

    def force_ret(self, key: int) -> None:
        """Make the model sample `<ret>` on the call's next frame (tests, scripted demos)."""

    def hold_agent(self, key: int, on: bool) -> None:
        """From the call's next step, hold the model's own agent stream at silence (it listens, says nothing:
        `DuplexEngine.hold_agent`), or let it speak; engines without the switch ignore it."""
