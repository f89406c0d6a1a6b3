"""One call budget for a server: `Admission` owns every call slot, whichever transport asks (Twilio stream
tokens, WebRTC offers, Pipecat services, SIP), and is the one place that answers "draining".

`try_acquire(transport, call_id)` returns a `Slot` or a `Refusal` (`reason`: `draining`, `busy`,
`not_ready`). Acquiring again for a call id that holds a slot returns the same slot with one more reference
(the Twilio webhook reserves the slot, the call's Pipecat service takes it again when the stream starts, each
releases its own reference); the slot is free once every reference is released. A reservation may lapse:
`try_acquire(..., ttl_s=30)` is released by itself unless `slot.hold()` is called in time (a stream token
never redeemed). Once `start_drain()` is called, new call ids are refused (`draining`) while the calls
already admitted go on; `end_all(reason)` asks each live call to end (its `on_end` callbacks) and marks it
`ended_by = reason` for its record. Event loop only (not thread-safe).

Example:
    >>> admission = Admission(capacity=2)
    >>> slot = admission.try_acquire("twilio", "CA1")
    >>> admission.try_acquire("webrtc", "web-1").call_id, admission.free
    ('web-1', 0)
    >>> admission.try_acquire("webrtc", "web-2").reason
    'busy'
    >>> slot.release(); admission.start_drain("SIGTERM"); admission.try_acquire("sip", "x").reason
    'draining'
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from duetaspan.pipeline.ticks import EngineFull

log = logging.getLogger("duetaspan.admission")

DRAINING, BUSY, NOT_READY = "draining", "busy", "not_ready"
POLL_S = 0.05  # how often `wait_empty` looks
# A reservation made before a drain still gets its call (Twilio opens the stream about a second after the
# webhook's answer), but one nobody redeems holds the drain up for this long at most, not its whole TTL.
DRAIN_RESERVATION_GRACE_S = 10.0


@dataclass(frozen=True)
class Refusal:
    """Why a call was not admitted (`reason`: `draining`, `busy` or `not_ready`) and a line saying so."""

    reason: str
    message: str

    def __bool__(self) -> bool:  # `if slot := admission.try_acquire(...)` reads naturally
        return False


@dataclass(eq=False)
class Slot:
    """One admitted call. `ended_by` is set when the server ends it (drain: `"shutdown"`)."""

    admission: Admission
    transport: str
    call_id: str
    expires_at: float | None = None  # a reservation that lapses unless `hold()` is called
    refs: int = 1
    ended_by: str | None = None
    since: float = field(default_factory=time.monotonic)
    _enders: list[Callable[[], object]] = field(default_factory=list)

    def hold(self) -> None:
        """The reserved call has arrived: keep the slot until it is released."""
        self.expires_at = None

    def on_end(self, ender: Callable[[], object]) -> Callable[[], None]:
        """Register how to end this call when the server must (`end_all`); returns the undo."""
        self._enders.append(ender)

        def remove() -> None:
            if ender in self._enders:
                self._enders.remove(ender)

        return remove

    def release(self) -> None:
        """Give back one reference; the slot is free once all are given back (idempotent past zero)."""
        self.admission._release(self)


class NotAdmitted(EngineFull):
    """`Admission.admit` refused the call; `refusal` says why (an `EngineFull`: handled as a full engine)."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


class Admission:
    """The call slots of one server. `capacity` is a number or a callable read on every decision (the
    engine's slots while it runs, 0 while it loads or is down)."""

    def __init__(self, capacity: int | Callable[[], int] = 0, *, clock: Callable[[], float] = time.monotonic):
        self._capacity = capacity
        self._clock = clock
        self.slots: dict[str, Slot] = {}
        self.draining = False
        self.drain_reason = ""
        self.on_change: list[Callable[[], object]] = []  # called when a slot is freed or draining starts

    def set_capacity(self, capacity: int | Callable[[], int]) -> None:
        self._capacity = capacity

    @property
    def capacity(self) -> int:
        return max(0, int(self._capacity() if callable(self._capacity) else self._capacity))

    @property
    def held(self) -> int:
        self._sweep()
        return len(self.slots)

    @property
    def free(self) -> int:
        return 0 if self.draining else max(0, self.capacity - self.held)

    def get(self, call_id: str) -> Slot | None:
        self._sweep()
        return self.slots.get(call_id)

    def try_acquire(self, transport: str, call_id: str, *, ttl_s: float | None = None) -> Slot | Refusal:
        """A slot for `call_id` (the one it holds, with one more reference), or why not."""
        slot = self.get(call_id)
        if slot is not None:
            slot.refs += 1
            if ttl_s is None:
                slot.hold()
            return slot
        if self.draining:
            return Refusal(DRAINING, f"the server is draining ({self.drain_reason}): no new calls")
        capacity = self.capacity
        if capacity <= 0:
            return Refusal(NOT_READY, "the engine is not running (loading, or down)")
        if len(self.slots) >= capacity:
            return Refusal(BUSY, f"all {capacity} call slots are busy")
        expires = self._clock() + ttl_s if ttl_s is not None else None
        slot = self.slots[call_id] = Slot(self, transport, call_id, expires_at=expires)
        return slot

    def admit(self, transport: str, call_id: str, ender: Callable[[], object]) -> Slot:
        """`try_acquire` for a call's own pipeline: raises `NotAdmitted`; `ender` ends the call at shutdown
        unless its transport registered its own way already (reserving the slot first)."""
        got = self.try_acquire(transport, call_id)
        if isinstance(got, Refusal):
            raise NotAdmitted(got)
        if not got._enders:
            got.on_end(ender)
        return got

    def start_drain(self, reason: str) -> bool:
        """Refuse new calls from now on (reservations not yet redeemed lapse within
        `DRAIN_RESERVATION_GRACE_S`); True the first time."""
        if self.draining:
            return False
        self.draining, self.drain_reason = True, reason
        latest = self._clock() + DRAIN_RESERVATION_GRACE_S
        for slot in self.slots.values():
            if slot.expires_at is not None and slot.expires_at > latest:
                slot.expires_at = latest
        self._changed()
        return True

    async def end_all(self, reason: str) -> int:
        """Ask every live call to end now (`ended_by = reason`); returns how many were asked."""
        slots = list(self.slots.values())
        waits = []
        for slot in slots:
            slot.ended_by = slot.ended_by or reason
            if slot.expires_at is not None:  # reserved, never arrived (a stream token not yet used): gone
                self._free(slot)
                continue
            for ender in list(slot._enders):
                try:
                    result = ender()
                except Exception:
                    log.exception("ending call %s (%s) failed", slot.call_id, slot.transport)
                    continue
                if inspect.isawaitable(result):
                    waits.append(asyncio.ensure_future(result))
        for outcome in await asyncio.gather(*waits, return_exceptions=True):  # all calls end at once
            if isinstance(outcome, Exception):
                log.error("ending a call failed: %s: %s", type(outcome).__name__, outcome)
        return len(slots)

    async def wait_empty(self, timeout_s: float | None = None) -> bool:
        """Wait until no slot is held (reservations lapse on their own); False at `timeout_s`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.held:  # polled (no event bound to one loop; lapsed reservations free slots silently)
            if deadline is not None and time.monotonic() >= deadline:
                return False
            await asyncio.sleep(POLL_S)
        return True

    def _release(self, slot: Slot) -> None:
        if self.slots.get(slot.call_id) is not slot:
            return
        slot.refs -= 1
        if slot.refs <= 0:
            self._free(slot)

    def _free(self, slot: Slot) -> None:
        self.slots.pop(slot.call_id, None)
        slot._enders.clear()
        self._changed()

    def _sweep(self) -> None:
        now = self._clock()
        for slot in [s for s in self.slots.values() if s.expires_at is not None and now > s.expires_at]:
            log.info("call %s (%s): reservation lapsed unused; slot freed", slot.call_id, slot.transport)
            self._free(slot)

    def _changed(self) -> None:
        for callback in list(self.on_change):
            try:
                callback()
            except Exception:
                log.exception("admission change callback failed")


__all__ = ["BUSY", "DRAINING", "NOT_READY", "Admission", "NotAdmitted", "Refusal", "Slot"]
