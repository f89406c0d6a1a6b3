"""When a SIP call's media may start and when a silent call is over.

- `AckWait`: an answered INVITE gets neither the agent nor RTP until its ACK confirms the dialog. RFC 3264
  lets the answerer send at once; holding media for the ACK is a security choice: a spoofed INVITE (a forged
  source address, its answers going nowhere) is never ACKed, so it costs nothing but its slot until the 200's
  retransmissions give up (64*T1, 32 s), and it cannot turn us into a reflector. The cost: a lost ACK delays
  the greeting until the caller's next ACK, at least 500 ms (the 200 is retransmitted after T1).
- `watch_media`: `[sip] media_timeout_s` (30 s) without an RTP packet accepted from the caller (the latch's
  `last_rx`, or the start of media when none came) ends the call with BYE and `ended_by: "media_timeout"`
  (a dropped mobile, a crashed PBX: no BYE ever comes). Not while the caller holds the call (its offer
  `sendonly` or `inactive`); the clock starts again when it resumes.

- `report_rtp`: the call's RTP figures reported once a second while it runs (live `/metrics`).

Example:
    >>> # acks = AckWait(); ...; acks.expect(call_id); dialog.accept(answer); if await acks.wait(dialog): media.start()
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from aiosipua.dialog import DialogState

logger = logging.getLogger("duetaspan.sip")

MEDIA_TIMEOUT = "media_timeout"  # the call's end reason and its record's `ended_by`
RTP_REPORT_S = 1.0  # a running call's RTP figures into /metrics this often


class AckWait:
    """Wakes whoever waits for a dialog's ACK: `wake(call_id)` when the ACK of our 200 confirmed it (the UAS's
    `on_ack`, which also marks the dialog `acked`) or when it never will (no ACK in 64*T1, a BYE, shutdown)."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def expect(self, call_id: str) -> None:
        """Before the 200 goes out (its ACK may come before `wait`)."""
        self._events.setdefault(call_id, asyncio.Event())

    def wake(self, call_id: str) -> None:
        event = self._events.get(call_id)
        if event is not None:
            event.set()

    async def wait(self, dialog: Any) -> bool:
        """True once the ACK confirmed `dialog`; False when it never will."""
        event = self._events.setdefault(dialog.call_id, asyncio.Event())
        try:
            await event.wait()
        finally:
            self._events.pop(dialog.call_id, None)
        return bool(getattr(dialog, "acked", False)) and dialog.dialog.state == DialogState.CONFIRMED


async def watch_media(call: Any, timeout_s: float, hang_up: Callable[[Any], object]) -> None:
    """End `call` (BYE, `media_timeout`) after `timeout_s` without caller RTP, except while it is held."""
    media = call.media
    quiet_from = time.monotonic()
    step = max(0.05, min(1.0, timeout_s / 10))
    while not call.ended.is_set():
        try:
            await asyncio.wait_for(call.ended.wait(), step)
            return
        except TimeoutError:
            pass
        now = time.monotonic()
        if media.held:
            quiet_from = now  # hold: the caller need not send; the clock starts again when it resumes
            continue
        last = max(quiet_from, media.latch.last_rx or 0.0)
        if now - last >= timeout_s:
            logger.warning(
                "call %s: no RTP from the caller for %.0f s; hanging up (BYE)", call.call_sid, now - last
            )
            hang_up(call)
            call._end(MEDIA_TIMEOUT)
            return


async def report_rtp(call: Any, report: Callable[[Any], object], every_s: float = RTP_REPORT_S) -> None:
    """`report(call)` every `every_s` while the call runs (its RTP figures into `/metrics` as they grow, not
    only at its end); a report that fails is logged."""
    while not call.ended.is_set():
        try:
            await asyncio.wait_for(call.ended.wait(), every_s)
            return
        except TimeoutError:
            pass
        try:
            report(call)
        except Exception:
            logger.exception("call %s: RTP report failed", call.call_sid)


__all__ = ["MEDIA_TIMEOUT", "AckWait", "report_rtp", "watch_media"]
