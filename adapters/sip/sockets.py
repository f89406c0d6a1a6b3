"""The SIP listening sockets: aiosipua's UDP and TCP transports with a size bound on every message, and TLS
(TCP with an `ssl.SSLContext`).

A message longer than `max_bytes` is dropped before parsing and reported to `on_oversize(addr)`; one that does
not parse goes to `on_unparsable(addr)` (counted and logged by the endpoint, at most once per source a minute:
never a traceback per datagram); a bare CRLF (an RFC 5626 keep-alive) is ignored on UDP, and over TCP and TLS
a CRLFCRLF ping gets its CRLF pong on the same connection (RFC 5626 4.4.1: a trunk or phone keeping its flow
alive reconnects when none comes); CRLFs before a start line are skipped (RFC 3261 7.5). Over TCP aiosipua itself
already closes a connection whose headers pass 64 KiB or whose body passes 1 MiB; we also limit connections
(`max_connections` in all, `max_per_source` from one address: others are closed at once and reported to
`on_refused_connection(addr)`) and close one that sends nothing for `idle_timeout_s`.

Every message we send passes `txns.outgoing` first (`duetaspan.adapters.sip.transactions`: the transaction
layer's view of what we send); `resend` sends a retransmission without it.

Over TCP and TLS what we send names its transport: aiosipua writes a bare `<sip:host:port>` Contact and a
`SIP/2.0/UDP` Via in our own requests, so a real phone (baresip) would send its BYE over UDP to a port no
one listens on; `GuardedTcp.send` adds `;transport=tcp|tls` to the Contact and fixes our requests' Via.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiosipua.message import SipMessage, SipRequest, SipResponse, missing_required_headers
from aiosipua.transport import (
    SipTransport,
    TcpSipTransport,
    UdpSipTransport,
    _read_sip_message,
    _stamp_via_received,
    _UdpProtocol,
)

logger = logging.getLogger("duetaspan.sip")
_METHOD = re.compile(r"^[A-Za-z][A-Za-z0-9._!%*+`'~-]*$")  # RFC 3261 25.1 token
MAX_CONNECTIONS = 256
MAX_PER_SOURCE = 8
IDLE_TIMEOUT_S = 300.0


def _noop(addr: tuple[str, int]) -> None:
    return None


def _dispatch(transport: Any, data: bytes, addr: tuple[str, int]) -> None:
    """Bound, parse and hand on one message (aiosipua's `_dispatch`, without a traceback per bad datagram)."""
    if len(data) > transport.max_bytes:
        transport.on_oversize(addr)
        return
    if not data.strip():  # CRLF keep-alive (RFC 5626 4.4.1)
        return
    try:
        msg = SipMessage.parse(data)
        if not _well_formed(msg, data):
            raise ValueError("not a SIP/2.0 message with its mandatory headers")
        if isinstance(msg, SipRequest):
            _stamp_via_received(msg, addr)
    except Exception:
        transport.on_unparsable(addr)
        return
    if transport.on_message is not None:
        try:
            transport.on_message(msg, addr)
        except Exception as exc:  # a message our stack cannot handle: counted, logged once a minute
            transport.on_unparsable(addr, exc)


def _well_formed(msg: Any, data: bytes) -> bool:
    """A request line `METHOD uri SIP/2.0` (a method token) with RFC 3261 8.1.1's headers, or a status line
    with Via, Call-ID and CSeq; aiosipua's parser takes any bytes for a request."""
    first = data.split(b"\r\n", 1)[0]
    if isinstance(msg, SipRequest):
        return bool(_METHOD.match(msg.method)) and first.endswith(b" SIP/2.0") and not missing_required_headers(msg)
    return all(msg.headers.get(name) for name in ("via", "call-id", "cseq"))


def _send_safely(send: Callable[[Any, tuple[str, int]], None], message: Any, addr: tuple[str, int]) -> None:
    try:
        send(message, addr)
    except (OSError, RuntimeError) as exc:  # no TCP connection any more, a closed socket
        logger.debug("SIP resend to %s:%d failed: %s", addr[0], addr[1], exc)


class _LoopNeutralUdp(_UdpProtocol):
    """aiosipua asserts an `asyncio.DatagramTransport`, which uvloop's transports are not (uvicorn runs on
    uvloop where installed); `start` keeps the transport it is given either way."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        return None


@dataclass
class GuardedUdp(UdpSipTransport):
    max_bytes: int = 16384
    on_oversize: Callable[[tuple[str, int]], object] = field(default=_noop, repr=False)
    on_unparsable: Callable[..., object] = field(default=_noop, repr=False)
    txns: Any = field(default=None, repr=False)

    def send(self, message: SipRequest | SipResponse, addr: tuple[str, int]) -> None:
        if self.txns is not None:
            self.txns.outgoing(message, addr)
        super().send(message, addr)

    def resend(self, message: Any, addr: tuple[str, int]) -> None:
        _send_safely(super().send, message, addr)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._udp_transport, _ = await loop.create_datagram_endpoint(
            lambda: _LoopNeutralUdp(self), local_addr=self.local_addr
        )

    def _dispatch(self, data: bytes, addr: tuple[str, int]) -> None:
        _dispatch(self, data, addr)


@dataclass
class GuardedTcp(TcpSipTransport):
    max_bytes: int = 16384
    on_oversize: Callable[[tuple[str, int]], object] = field(default=_noop, repr=False)
    on_unparsable: Callable[..., object] = field(default=_noop, repr=False)
    on_refused_connection: Callable[[tuple[str, int]], object] = field(default=_noop, repr=False)
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False)
    txns: Any = field(default=None, repr=False)
    max_connections: int = MAX_CONNECTIONS
    max_per_source: int = MAX_PER_SOURCE
    idle_timeout_s: float = IDLE_TIMEOUT_S
    _open: Counter[str] = field(default_factory=Counter, init=False, repr=False)

    def resend(self, message: Any, addr: tuple[str, int]) -> None:
        _send_safely(super().send, message, addr)

    async def _handle_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        addr = (str(peer[0]), int(peer[1])) if peer else ("0.0.0.0", 0)
        if self._open.total() >= self.max_connections or self._open[addr[0]] >= self.max_per_source:
            self.on_refused_connection(addr)
            writer.close()
            return
        self._open[addr[0]] += 1
        self._connections[addr] = (reader, writer)
        try:
            while True:
                async with asyncio.timeout(self.idle_timeout_s):
                    data = await _read_sip_message(reader)
                if data is None:
                    break
                if not data.strip():  # an RFC 5626 4.4.1 keep-alive ping (CRLFCRLF): its pong is one CRLF
                    writer.write(b"\r\n")
                    continue
                self._dispatch(data.lstrip(b"\r\n"), addr)  # CRLFs before the start line: ignored (7.5)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, ValueError, ssl.SSLError):
            pass
        finally:
            self._open[addr[0]] -= 1
            if self._open[addr[0]] <= 0:
                del self._open[addr[0]]
            self._connections.pop(addr, None)
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError, ssl.SSLError):
                async with asyncio.timeout(5):
                    await writer.wait_closed()

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
        if self.txns is not None:
            self.txns.outgoing(message, addr)
        super().send(message, addr)

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle_connection, host=self.local_addr[0], port=self.local_addr[1], ssl=self.ssl_context
        )

    def _dispatch(self, data: bytes, addr: tuple[str, int]) -> None:
        _dispatch(self, data, addr)


def build_transport(
    kind: str,
    host: str,
    port: int,
    *,
    max_bytes: int,
    on_oversize: Callable[[tuple[str, int]], object],
    on_unparsable: Callable[..., object] = _noop,
    on_refused_connection: Callable[[tuple[str, int]], object] = _noop,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
) -> SipTransport:
    """The listening transport for `kind` (`udp`, `tcp` or `tls`)."""
    if kind == "udp":
        return GuardedUdp(
            local_addr=(host, port), max_bytes=max_bytes, on_oversize=on_oversize, on_unparsable=on_unparsable
        )
    context = None
    if kind == "tls":
        if tls_cert is None or tls_key is None:
            raise ValueError("SIP over TLS needs a certificate and a key ([sip] tls_cert, tls_key)")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(tls_cert, tls_key)
    return GuardedTcp(
        local_addr=(host, port), max_bytes=max_bytes, on_oversize=on_oversize, on_unparsable=on_unparsable,
        on_refused_connection=on_refused_connection, ssl_context=context,
    )  # fmt: skip


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
