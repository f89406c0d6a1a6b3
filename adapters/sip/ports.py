"""RTP/RTCP port pairs for the SIP endpoint's calls, safe against other processes on the same host.

aiortp's `PortAllocator` probes a pair by binding it and closing the sockets at once: between that probe and
the call's media binding the port (the whole ringing time, for a call we place), another process using the
same range (a second server, another PBX component, a parallel test run) can take it, and the call fails with
EADDRINUSE. `RtpPorts` keeps both probe sockets bound from `allocate()` until `hand_over()` (just before the
media binds, in the same event-loop turn where possible) and `bind()` retries on the next free pair when the
port was taken in the moment between them, so two processes on one host never fail a call over a port.
Pairs are drawn at random (the OS's CSPRNG) among the free ones, so a stranger cannot guess the next call's
media port from the last one (aiortp's allocator hands them out in order from the bottom of the range).
`in_use` / `allocated` are what a leak check reads: every pair handed out and not yet released.

Example:
    >>> ports = RtpPorts((20000, 20999))
    >>> # port, media = await ports.bind(lambda port: CallMedia.open(offer, bind_ip=host, port=port))
"""

from __future__ import annotations

import asyncio
import errno
import logging
import secrets
import socket
from collections.abc import Awaitable, Callable
from typing import TypeVar

logger = logging.getLogger("duetaspan.sip")
T = TypeVar("T")
BIND_TRIES = 8  # pairs tried by `bind()` when the port is taken between the hand-over and the media's bind


class RtpPorts:
    """Even RTP ports with RTCP on the next one, from `[low, high]`; a pair is held (both sockets bound, on
    every interface) from `allocate()` until `hand_over()` or `release()`."""

    def __init__(self, port_range: tuple[int, int], host: str = "") -> None:
        low, high = port_range
        self.low, self.high = low + (low % 2), high
        self.host = host  # where the media binds; pairs are held on every interface whatever it is
        self._allocated: set[int] = set()
        self._held: dict[int, tuple[socket.socket, socket.socket]] = {}
        self._lock = asyncio.Lock()

    @property
    def allocated(self) -> set[int]:
        """The RTP ports handed out and not yet released."""
        return set(self._allocated)

    @property
    def in_use(self) -> int:
        return len(self._allocated)

    async def allocate(self) -> tuple[int, int]:
        """A free pair (RTP, RTCP), held until `hand_over` or `release`; RuntimeError when none is free."""
        async with self._lock:
            span = max(0, (self.high - self.low + 1) // 2)  # pairs whose RTCP port is still <= high
            start = secrets.randbelow(span) if span else 0
            for step in range(span):
                port = self.low + 2 * ((start + step) % span)
                if port in self._allocated:
                    continue
                held = _hold(port)
                if held is None:
                    continue
                self._allocated.add(port)
                self._held[port] = held
                return port, port + 1
            raise RuntimeError(f"no free RTP port pair in {self.low}-{self.high}")

    def hand_over(self, port: int) -> None:
        """Close the holding sockets of `port`: its media binds it next."""
        for sock in self._held.pop(port, ()):
            sock.close()

    async def release(self, port: int) -> None:
        """The pair is free again (its call ended or never started)."""
        self.hand_over(port)
        async with self._lock:
            self._allocated.discard(port)

    async def bind(self, open_media: Callable[[int], Awaitable[T]]) -> tuple[int, T]:
        """Allocate a pair and run `open_media(port)` on it; when the port was taken in the moment between
        the hand-over and the bind (EADDRINUSE), try the next free pair. Any other failure releases the pair
        and propagates."""
        for attempt in range(BIND_TRIES):
            port, _ = await self.allocate()
            self.hand_over(port)
            try:
                return port, await open_media(port)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or attempt == BIND_TRIES - 1:
                    await self.release(port)
                    raise
                logger.warning("RTP port %d was taken by another process as the call bound it; next pair", port)
                async with self._lock:
                    self._allocated.discard(port)
            except BaseException:
                await self.release(port)
                raise
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def _hold(port: int) -> tuple[socket.socket, socket.socket] | None:
    """Both sockets of the pair bound on every interface, or None when either is in use."""
    rtp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rtcp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rtp.bind(("", port))
        rtcp.bind(("", port + 1))
    except OSError:
        rtp.close()
        rtcp.close()
        return None
    return rtp, rtcp
