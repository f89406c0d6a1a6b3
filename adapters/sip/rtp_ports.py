"""RTP/RTCP port pairs for the calls of one SIP endpoint: an even port for RTP and the next for RTCP, drawn at
random (the OS's CSPRNG) among the free pairs of `[sip] rtp_port_min`-`rtp_port_max`, so a stranger cannot
guess the next call's media port from the last one (aiortp's own allocator hands them out in order from the
bottom of the range). `in_use` is what a leak check reads: every pair handed out and not yet released.

Example:
    >>> import asyncio
    >>> ports = RtpPorts((40000, 40999), host="127.0.0.1")
    >>> rtp, rtcp = asyncio.run(ports.allocate())
    >>> rtp % 2 == 0 and rtcp == rtp + 1 and 40000 <= rtp < 40999 and ports.in_use == 1
    True
"""

from __future__ import annotations

import asyncio
import secrets
import socket


class RtpPorts:
    """Random even/odd port pairs in `port_range` (inclusive), probed free on `host` before they are handed out."""

    def __init__(self, port_range: tuple[int, int], host: str = "") -> None:
        low, high = port_range
        self.low = low + (low % 2)  # the first even port
        self.high = high
        self.host = host
        self.allocated: set[int] = set()
        self._lock = asyncio.Lock()

    @property
    def pairs(self) -> int:
        return max(0, (self.high - self.low) // 2)

    @property
    def in_use(self) -> int:
        return len(self.allocated)

    async def allocate(self) -> tuple[int, int]:
        """A free pair (RTP, RTCP); raises `RuntimeError` when every pair of the range is taken."""
        async with self._lock:
            count = self.pairs
            start = secrets.randbelow(count) if count else 0
            for i in range(count):
                port = self.low + 2 * ((start + i) % count)
                if port in self.allocated or not _free(self.host, port):
                    continue
                self.allocated.add(port)
                return port, port + 1
        raise RuntimeError(f"no free RTP port pair in {self.low}-{self.high}")

    async def release(self, port: int) -> None:
        """Give the pair back (idempotent)."""
        async with self._lock:
            self.allocated.discard(port)


def _free(host: str, port: int) -> bool:
    """Whether UDP `port` and `port + 1` can both be bound on `host` now."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
    try:
        for offset, sock in enumerate(socks):
            sock.bind((host, port + offset))
        return True
    except OSError:
        return False
    finally:
        for sock in socks:
            sock.close()


__all__ = ["RtpPorts"]
