"""Draining a server: stop admitting calls, let the live ones finish, then stop (what a deploy needs).

`Drain.begin(reason)` (the first SIGTERM/SIGINT, or `POST /admin/drain`) turns the server's `Admission` to
draining: `/health` and `/health/ready` answer 503 at once, new calls are refused (Twilio: the drain TwiML;
WebRTC offers: 503), live calls go on untouched. When the last live call ends, or `timeout_s` after the
drain began, whatever is left is ended the way a hang-up ends a call (each call's record is completed, with
`ended_by: "shutdown"`), and `stop()` is called (the web server then shuts down: transports close, traces
flush) so the process exits 0. A second signal ends every call at once (artifacts still written), a third
stops without waiting. Every change of state is one log line; `on_state` callbacks (the
`duetaspan_draining` gauge) hear each.

Example:
    >>> drain = Drain(Admission(2), stop=lambda force: None, timeout_s=300)
    >>> drain.state
    'serving'
    >>> # drain.signal(signal.SIGTERM)  (in the server: `serve(app, ..., drain=drain)` installs the handlers)
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable

from duetaspan.pipeline.admission import Admission

log = logging.getLogger("duetaspan.drain")

SHUTDOWN = "shutdown"  # `ended_by` of the calls a drain ends
END_GRACE_S = 15.0  # how long calls asked to end get to write their artifacts and go


class Drain:
    """The drain of one server (see the module docstring). `stop(force)` stops the web server (`serve` sets
    it when given this drain)."""

    def __init__(
        self,
        admission: Admission,
        *,
        stop: Callable[[bool], object] | None = None,
        timeout_s: float = 300.0,
        end_grace_s: float = END_GRACE_S,
    ) -> None:
        self.admission = admission
        self.stop_server = stop  # `serve(app, drain=...)` sets it to stop its web server
        self.timeout_s = timeout_s
        self.end_grace_s = end_grace_s
        self.state = "serving"  # -> draining -> ending -> stopped
        self.signals: list[int] = []  # the signals received, in order
        self.on_state: list[Callable[[str], object]] = []
        self._task: asyncio.Task[None] | None = None
        self._forced = asyncio.Event()

    @property
    def draining(self) -> bool:
        return self.state != "serving"

    def signal(self, signum: int) -> None:
        """A SIGTERM or SIGINT: the first drains, the second ends every call now, the third stops at once."""
        self.signals.append(signum)
        name = signal.Signals(signum).name
        if len(self.signals) == 1:
            self.begin(name)
        elif len(self.signals) == 2:
            log.warning("%s again: ending the %d live calls now", name, self.admission.held)
            self._forced.set()
        else:
            log.warning("%s a third time: stopping without waiting for the calls", name)
            self._set("stopped")
            self._call_stop(True)

    def begin(self, reason: str) -> bool:
        """Start draining (idempotent); True the first time."""
        if self.draining:
            return False
        self.admission.start_drain(reason)
        self._set("draining")
        log.warning(
            "draining (%s): refusing new calls, /health/ready is 503; waiting for %d live call(s) to end "
            "(at most %.0f s, then they are ended; signal again to end them now)",
            reason,
            self.admission.held,
            self.timeout_s,
        )
        self._task = asyncio.get_running_loop().create_task(self._run(), name="duetaspan-drain")
        return True

    async def _run(self) -> None:
        empty = asyncio.ensure_future(self.admission.wait_empty(self.timeout_s))
        forced = asyncio.ensure_future(self._forced.wait())
        try:
            await asyncio.wait({empty, forced}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            forced.cancel()
        if empty.done() and empty.result():
            log.warning("drained: the last live call ended; stopping")
        else:
            empty.cancel()
            why = "signalled again" if self._forced.is_set() else f"drain timeout {self.timeout_s:.0f} s"
            await self.end_calls(why)
        self._set("stopped")
        self._call_stop(False)

    async def end_calls(self, why: str) -> None:
        """End every live call as a hang-up does (`ended_by: "shutdown"`) and wait for their records."""
        self._set("ending")
        n = await self.admission.end_all(SHUTDOWN)
        log.warning(
            "%s: ended %d live call(s); waiting up to %.0f s for their records", why, n, self.end_grace_s
        )
        if not await self.admission.wait_empty(self.end_grace_s):
            log.error("%d call(s) still open %.0f s after being ended; stopping anyway", self.admission.held,
                      self.end_grace_s)  # fmt: skip

    def _set(self, state: str) -> None:
        if state == self.state:
            return
        self.state = state
        for callback in list(self.on_state):
            try:
                callback(state)
            except Exception:
                log.exception("drain state callback failed")

    def _call_stop(self, force: bool) -> None:
        if self.stop_server is None:
            log.error("drained, but no server to stop")
            return
        try:
            self.stop_server(force)
        except Exception:
            log.exception("stopping the server failed")


__all__ = ["SHUTDOWN", "Drain"]
