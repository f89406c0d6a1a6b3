"""Who may send a call's RTP, and where ours goes: latching (RFC 7362), instead of aiortp's symmetric RTP that
re-latched onto the sender of every packet (one forged packet redirected the agent's audio to its sender).

- Nothing moves before `open()`: the endpoint opens a call's media when the ACK confirms the dialog (an
  unACKed INVITE gets no RTP from us and its packets reach nobody).
- The first packet accepted must come from an allowed host: the SDP's `c=` address or the INVITE's source
  IP (a phone behind NAT sends from its NAT's public address, not the private one its SDP names). With SRTP
  only a packet that authenticated reaches the latch (`srtp.SrtpRTPSession` checks first), so a forgery
  cannot latch.
- Then the latch holds: that address (host and port) and that SSRC. Packets from any other address, or
  with another SSRC while the latched one is live, are dropped and counted (`dropped`, by reason: `early`,
  `foreign`, `ssrc`, `malformed`); our RTP goes only to the latched address. A new SSRC from the latched
  address is taken once the old one has been silent `SSRC_HANDOVER_S` (a PBX re-anchoring its media, a test
  tool switching streams): never while the live stream runs.
- RTCP latches the same way, from the RTP host.
- A re-INVITE releases the SSRC lock (RFC 3550 lets the source change then), and the address when the offer
  moves it (`release`).

Example:
    >>> latch = RtpLatch({"203.0.113.5"})
    >>> latch.open()
    >>> latch.admit_rtp(bytes([128]) + bytes(11), ("198.51.100.9", 4000), now=0.0), latch.dropped["foreign"]
    (False, 1)
    >>> latch.admit_rtp(bytes([128]) + bytes(11), ("203.0.113.5", 4000), now=0.0), latch.addr
    (True, ('203.0.113.5', 4000))
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import aiortp

logger = logging.getLogger("duetaspan.sip")

SSRC_HANDOVER_S = 0.2  # a new SSRC from the latched address is taken once the old one is silent this long
DROP_REASONS = ("early", "foreign", "ssrc", "malformed")


class RtpLatch:
    """The latch of one call's media (see the module docstring). `last_rx` is the monotonic time of the last
    RTP packet accepted (the media timeout reads it)."""

    def __init__(self, allowed: Iterable[str]) -> None:
        self.allowed = {host for host in allowed if host}
        self.opened = False
        self.addr: tuple[str, int] | None = None
        self.rtcp_addr: tuple[str, int] | None = None
        self.ssrc: int | None = None
        self.last_rx: float | None = None
        self.dropped: Counter[str] = Counter()
        self.on_latch: Callable[[tuple[str, int]], None] = lambda addr: None

    def open(self) -> None:
        """The dialog is confirmed: from now on packets are taken in and ours go out."""
        self.opened = True

    def release(self, allowed: Iterable[str], *, moved: bool) -> None:
        """A re-INVITE: the SSRC lock goes; the address too when the offer `moved` it."""
        self.ssrc = None
        if moved:
            self.allowed = {host for host in allowed if host}
            self.addr = self.rtcp_addr = None

    def _drop(self, reason: str) -> bool:
        self.dropped[reason] += 1
        n = self.dropped[reason]
        if n in (1, 100, 10000):
            logger.warning(
                "RTP: %d packet(s) dropped (%s); latched to %s", n, reason, self.addr or "nothing yet"
            )
        return False

    def admit_rtp(self, data: bytes, addr: tuple[str, int], now: float | None = None) -> bool:
        """Whether this RTP packet reaches the call (latching it when it is the first good one)."""
        if not self.opened:
            return self._drop("early")
        if len(data) < 12 or data[0] >> 6 != 2:
            return self._drop("malformed")
        now = time.monotonic() if now is None else now
        ssrc = int.from_bytes(data[8:12], "big")
        if self.addr is None:
            if addr[0] not in self.allowed:
                return self._drop("foreign")
            self.addr = addr
            logger.info("RTP latched to %s:%d (SSRC %08x)", addr[0], addr[1], ssrc)
            self.on_latch(addr)
        elif addr != self.addr:
            return self._drop("foreign")
        if self.ssrc is not None and ssrc != self.ssrc:
            if self.last_rx is not None and now - self.last_rx < SSRC_HANDOVER_S:
                return self._drop("ssrc")
            logger.info("RTP: SSRC %08x -> %08x from the latched address", self.ssrc, ssrc)
        self.ssrc = ssrc
        self.last_rx = now
        return True

    def admit_rtcp(self, data: bytes, addr: tuple[str, int]) -> bool:
        """Whether this RTCP packet reaches the call: from the latched RTCP address, or the first from the RTP
        host (before any RTP: from an allowed host)."""
        if not self.opened:
            return self._drop("early")
        if self.rtcp_addr is None:
            host_ok = addr[0] == self.addr[0] if self.addr is not None else addr[0] in self.allowed
            if not host_ok:
                return self._drop("foreign")
            self.rtcp_addr = addr
            return True
        return addr == self.rtcp_addr or self._drop("foreign")

    def figures(self) -> dict[str, int]:
        return {f"rtp_dropped_{reason}": int(self.dropped[reason]) for reason in DROP_REASONS}


class LatchedRTPSession(aiortp.RTPSession):
    """An `aiortp.RTPSession` behind an `RtpLatch` (set `latch` right after `create`; until it is opened
    nothing is sent or taken in)."""

    latch: RtpLatch | None = None

    async def _bind_transports(self, local_addr: tuple[str, int], remote_addr: tuple[str, int]) -> None:
        await super()._bind_transports(local_addr, remote_addr)
        for transport in (self._rtp_transport, self._rtcp_transport):
            if transport is not None:
                transport.send = self._gated_send(transport.send)  # type: ignore[method-assign]

    def _gated_send(self, send: Callable[..., None]) -> Callable[..., None]:
        def gated(data: bytes, addr: Any = None) -> None:
            if self.latch is not None and self.latch.opened:
                send(data, addr)

        return gated

    def _latch_rtp_addr(self, addr: tuple[str, int]) -> None:
        latched = self.latch.addr if self.latch is not None else None
        if latched is not None and latched != self._remote_addr:
            self._remote_addr = latched
            if self.latch is not None and self.latch.rtcp_addr is None:  # until its RTCP latches
                self._remote_rtcp_addr = self._compute_rtcp_addr(latched)

    def _latch_rtcp_addr(self, addr: tuple[str, int]) -> None:
        if self.latch is not None and self.latch.rtcp_addr is not None:
            self._remote_rtcp_addr = self.latch.rtcp_addr

    def _handle_rtp(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.latch is not None and self.latch.admit_rtp(data, addr):
            super()._handle_rtp(data, addr)

    def _handle_rtcp(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.latch is not None and self.latch.admit_rtcp(data, addr):
            super()._handle_rtcp(data, addr)


__all__ = ["DROP_REASONS", "SSRC_HANDOVER_S", "LatchedRTPSession", "RtpLatch"]
