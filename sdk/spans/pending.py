"""The thread-safe queue of spans waiting to land, keyed by slot and slot generation.

`put` is called from any thread (the router's event loop); `take` from the engine thread right before a slot's
step. Every entry carries the slot's generation at queue time, so a span for a call that has ended is dropped
(and logged) instead of landing in the next call that reuses the slot.

Example:
    >>> q = SpanQueue()
    >>> q.put(QueuedSpan(slot=0, generation=1, reference="(tool result) 22 degrees", tokens=(5, 6)))
    >>> [s.reference for s in q.take(0, generation=1)]
    ['(tool result) 22 degrees']
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueuedSpan:
    slot: int
    generation: int
    reference: str
    tokens: tuple[int, ...]
    truncated: bool = False
    kind: str = "reference"
    span_id: int | None = None


@dataclass
class SpanQueue:
    """Spans per slot in arrival order; all methods are thread-safe."""

    _lock: threading.Lock = field(default_factory=threading.Lock)
    _items: dict[int, list[QueuedSpan]] = field(default_factory=dict)

    def put(self, span: QueuedSpan) -> None:
        with self._lock:
            self._items.setdefault(span.slot, []).append(span)

    def take(self, slot: int, generation: int) -> list[QueuedSpan]:
        """Remove and return the slot's spans of this generation; older generations are dropped with a log line."""
        with self._lock:
            items = self._items.pop(slot, [])
        current = [s for s in items if s.generation == generation]
        for stale in (s for s in items if s.generation != generation):
            log.warning(
                "dropped a span for slot %d generation %d (the slot now runs generation %d): %.60r",
                stale.slot, stale.generation, generation, stale.reference,
            )  # fmt: skip
        return current

    def drop_slot(self, slot: int, reason: str = "slot closed") -> int:
        """Forget every span queued for `slot`, logging each; returns how many were dropped."""
        with self._lock:
            items = self._items.pop(slot, [])
        for span in items:
            log.warning("dropped a span for slot %d (%s): %.60r", slot, reason, span.reference)
        return len(items)

    def pending(self, slot: int) -> int:
        with self._lock:
            return len(self._items.get(slot, ()))
