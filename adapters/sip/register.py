"""Registering as a PBX extension or a registering trunk (`[sip] registrar`, `[sip] user`, password in
`$DUETASPAN_SIP_PASSWORD`): aiosipua's `Registration` sends REGISTER, answers the digest challenge, and
refreshes at 90 % of the granted interval; we log each outcome (a failure as one ERROR line naming the
registrar and its answer), count it (`duetaspan_sip_registrations_total{outcome}`), and allow the registrar's
address to send INVITEs (the PBX routes its calls to us from there).

Example:
    >>> # reg = await start_registration(uac, gate, registrar="pbx:5060", user="7001", password=None,
    >>> #                                  expires=300, on_outcome=print)
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any

from aiosipua import Registration, SipDigestAuth, SipUAC

from duetaspan.adapters.sip.gate import SipGate

logger = logging.getLogger("duetaspan.sip")


def _split(registrar: str) -> tuple[str, int]:
    """`host[:port]` (or `sip:host[:port]`) -> (host, port); 5060 by default."""
    value = registrar.removeprefix("sip:")
    host, sep, port = value.rpartition(":")
    return (host, int(port)) if sep and port.isdigit() else (value, 5060)


async def start_registration(
    uac: SipUAC,
    gate: SipGate,
    *,
    registrar: str,
    user: str,
    password: str | None,
    expires: int,
    on_outcome: Callable[[str], object],
) -> Registration:
    """Register `user` at `registrar` (`host[:port]`) through `uac`; outcomes go to `on_outcome`."""
    host, port = _split(registrar)
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    address = str(infos[0][4][0])
    gate.trust(address)  # the PBX sends the calls of this extension from here
    auth = SipDigestAuth(user, password) if password else None
    registration = Registration(uac, f"sip:{user}@{host}", (address, port), expires=expires, auth=auth)

    def registered(reg: Any) -> None:
        logger.info("SIP registered as %s at %s:%d for %d s", reg.aor, address, port, reg.granted_expires)
        on_outcome("registered")

    def failed(reg: Any, status: int, reason: str) -> None:
        logger.error(
            "SIP registration as %s at %s:%d failed: %d %s (check [sip] user and $DUETASPAN_SIP_PASSWORD)",
            reg.aor, address, port, status, reason,
        )  # fmt: skip
        on_outcome("failed")

    def expired(reg: Any) -> None:
        logger.error("SIP registration as %s at %s:%d expired without a refresh", reg.aor, address, port)
        on_outcome("expired")

    registration.on_registered = registered
    registration.on_failed = failed
    registration.on_expired = expired
    registration.register()
    return registration


__all__ = ["start_registration"]
