"""The SIP listening sockets: aiosipua's UDP and TCP transports with a size bound on every message, and TLS
(TCP with an `ssl.SSLContext`).

A message longer than `max_bytes` is dropped before parsing and reported to `on_oversize(addr)`. Over TCP
aiosipua itself already closes a connection whose headers pass 64 KiB or whose body passes 1 MiB.

Over TCP and TLS what we send names its transport: aiosipua writes a bare `<sip:host:port>` Contact and a
`SIP/2.0/UDP` Via in our own requests, so a real phone (baresip) would send its BYE over UDP to a port no
one listens on; `GuardedTcp.send` adds `;transport=tcp|tls` to the Contact and fixes our requests' Via.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiosipua.message import SipRequest, SipResponse
from aiosipua.transport import SipTransport, TcpSipTransport, UdpSipTransport, _UdpProtocol


def _noop(addr: tuple[str, int]) -> None:
    return None


class _LoopNeutralUdp(_UdpProtocol):
    """aiosipua asserts an `asyncio.DatagramTransport`, which uvloop's transports are not (uvicorn runs on
    uvloop where installed); `start` keeps the transport it is given either way."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        return None


@dataclass
class GuardedUdp(UdpSipTransport):
    max_bytes: int = 16384
    on_oversize: Callable[[tuple[str, int]], object] = field(default=_noop, repr=False)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._udp_transport, _ = await loop.create_datagram_endpoint(
            lambda: _LoopNeutralUdp(self), local_addr=self.local_addr
        )

    def _dispatch(self, data: bytes, addr: tuple[str, int]) -> None:
        if len(data) > self.max_bytes:
            self.on_oversize(addr)
            return
        super()._dispatch(data, addr)


@dataclass
class GuardedTcp(TcpSipTransport):
    max_bytes: int = 16384
    on_oversize: Callable[[tuple[str, int]], object] = field(default=_noop, repr=False)
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False)

    @property
    def kind(self) -> str:
        return "tls" if self.ssl_context is not None else "tcp"

    def send(self, message: SipRequest | SipResponse, addr: tuple[str, int]) -> None:
        contact = message.headers.get_first("Contact")
        if contact and contact.endswith(">") and "transport=" not in contact.lower():
            message.headers.set_single("Contact", f"{contact[:-1]};transport={self.kind}>")
        vias = message.headers.get("Via")
        if isinstance(message, SipRequest) and vias and vias[0].upper().startswith("SIP/2.0/UDP "):
            vias[0] = f"SIP/2.0/{self.kind.upper()} {vias[0][len('SIP/2.0/UDP ') :]}"
        super().send(message, addr)

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle_connection, host=self.local_addr[0], port=self.local_addr[1], ssl=self.ssl_context
        )

    def _dispatch(self, data: bytes, addr: tuple[str, int]) -> None:
        if len(data) > self.max_bytes:
            self.on_oversize(addr)
            return
        super()._dispatch(data, addr)


def build_transport(
    kind: str,
    host: str,
    port: int,
    *,
    max_bytes: int,
    on_oversize: Callable[[tuple[str, int]], object],
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
) -> SipTransport:
    """The listening transport for `kind` (`udp`, `tcp` or `tls`)."""
    if kind == "udp":
        return GuardedUdp(local_addr=(host, port), max_bytes=max_bytes, on_oversize=on_oversize)
    context = None
    if kind == "tls":
        if tls_cert is None or tls_key is None:
            raise ValueError("SIP over TLS needs a certificate and a key ([sip] tls_cert, tls_key)")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(tls_cert, tls_key)
    return GuardedTcp(
        local_addr=(host, port), max_bytes=max_bytes, on_oversize=on_oversize, ssl_context=context
    )


def bound_port(transport: SipTransport) -> int:
    """The port actually bound (for port 0)."""
    udp = getattr(transport, "_udp_transport", None)
    if udp is not None:
        return int(udp.get_extra_info("sockname")[1])
    server = getattr(transport, "_server", None)
    if server is not None and server.sockets:
        return int(server.sockets[0].getsockname()[1])
    return transport.local_addr[1]


__all__ = ["GuardedTcp", "GuardedUdp", "bound_port", "build_transport"]
