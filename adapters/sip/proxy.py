"""Placing calls through an outbound proxy or a carrier's trunk (`[sip] outbound_proxy`).

RFC 3261 8.1.2: a UA configured with an outbound proxy pre-loads its route set with that one URI. The INVITE
goes to the proxy's address while its Request-URI stays the callee's (`sip:+15551234567@trunk.example`),
with `Route: <sip:PROXY;lr>` (a loose route) on it, on the INVITE aiosipua re-sends after a 401/407 digest
challenge, on the CANCEL (copied from the INVITE by aiosipua) and, through the dialog's route set, on the
ACK and every in-dialog request (BYE). aiosipua sends all of them to the address the INVITE went to.
Digest answers (401 `WWW-Authenticate` and 407 `Proxy-Authenticate`) are aiosipua's own.

Example:
    >>> route_uri("trunk.example.com:5080;transport=udp")
    '<sip:trunk.example.com:5080;transport=udp;lr>'
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from aiosipua import SipUAC
from aiosipua.dialog import Dialog

from duetaspan.config.sip import parse_proxy


def route_uri(proxy: str) -> str:
    """The `Route` value naming the outbound proxy (a loose route)."""
    host, port, transport = parse_proxy(proxy)
    shown = f"[{host}]" if ":" in host else host
    return f"<sip:{shown}:{port}{f';transport={transport}' if transport else ''};lr>"


async def resolve(host: str, port: int) -> tuple[str, int]:
    """The address a host name and port resolve to (OSError, e.g. `socket.gaierror`, when they do not)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    return str(infos[0][4][0]), int(port)


class RoutedUAC(SipUAC):
    """aiosipua's UAC whose INVITEs carry the pre-loaded route of the outbound proxy (`route`, or none)."""

    def __init__(self, transport: Any, *, route: str | None = None, **kwargs: Any) -> None:
        super().__init__(transport, **kwargs)
        self.route = route

    def _build_invite(self, dialog: Dialog, **kwargs: Any) -> Any:
        # every INVITE of a dialog we start (the first and the one retried with credentials) is built here
        invite = super()._build_invite(dialog, **kwargs)
        if self.route is not None and not dialog.route_set:
            dialog.route_set = [self.route]  # the ACK and in-dialog requests (BYE) carry it too
        for route in dialog.route_set:
            invite.headers.append("Route", route)
        return invite


__all__ = ["RoutedUAC", "resolve", "route_uri"]
