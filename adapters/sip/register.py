"""Registering as a PBX extension or a registering trunk (`[sip] registrar`, `[sip] user`, password in
`$DUETASPAN_SIP_PASSWORD`): aiosipua's `Registration` sends REGISTER, answers the digest challenge, and
refreshes at 90 % of the granted interval; we log each outcome (a failure as one ERROR line naming the
registrar and its answer), count it (`duetaspan_sip_registrations_total{outcome}`), and allow the registrar's
address to send INVITEs (the PBX routes its calls to us from there).

Registration never gives up for good: after a failure, an expiry, or a REGISTER whose transaction got no
answer in 64*T1 (it is retransmitted until then, `duetaspan.adapters.sip.transactions`), `Registrar` registers
again after a backoff (`RETRY_MIN_S`, doubling to `RETRY_MAX_S`; back to the minimum once registered). While
registered, a NAT keep-alive goes to the registrar every `KEEPALIVE_S`: an OPTIONS over UDP (its answer
keeps the NAT binding open), a CRLF pair over TCP/TLS (RFC 5626 4.4.1).

Example:
    >>> # reg = await start_registration(uac, gate, registrar="pbx:5060", user="7001", password=None,
    >>> #                                  expires=300, on_outcome=print)
    >>> RETRY_MIN_S, RETRY_MAX_S
    (2.0, 300.0)
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

RETRY_MIN_S = 2.0
RETRY_MAX_S = 300.0
KEEPALIVE_S = 25.0


class Registrar:
    """One registration kept alive: aiosipua's `Registration`, retried with backoff, and NAT keep-alives."""

    def __init__(self, registration: Registration, *, retry_min_s: float = RETRY_MIN_S,
                 keepalive_s: float = KEEPALIVE_S) -> None:  # fmt: skip
        self.registration = registration
        self.retry_min_s = retry_min_s
        self.backoff_s = retry_min_s
        self.keepalive_s = keepalive_s
        self.retries = 0
        self._retry: asyncio.TimerHandle | None = None
        self._keepalive: asyncio.Task[None] | None = None

    @property
    def state(self) -> Any:
        return self.registration.state

    def registered(self) -> None:
        self.backoff_s = self.retry_min_s
        if self._keepalive is None:
            self._keepalive = asyncio.get_running_loop().create_task(self._keep_alive())

    def retry_later(self, why: str) -> None:
        """Register again after the backoff (one pending retry at a time)."""
        if self._retry is not None:
            return
        delay, self.backoff_s = self.backoff_s, min(self.backoff_s * 2, RETRY_MAX_S)
        logger.warning("SIP registration as %s: %s; registering again in %.0f s", self.registration.aor, why, delay)
        self._retry = asyncio.get_running_loop().call_later(delay, self._again)

    def _again(self) -> None:
        self._retry = None
        self.retries += 1
        self.registration.register()

    async def _keep_alive(self) -> None:
        reg = self.registration
        while True:
            await asyncio.sleep(self.keepalive_s)
            transport = reg.uac.transport
            if getattr(transport, "reliable", False):
                conn = getattr(transport, "_connections", {}).get(reg.registrar)
                if conn is not None:
                    conn[1].write(b"\r\n\r\n")
                continue
            transport.send(_options(reg), reg.registrar)

    def unregister(self) -> None:
        self.close()
        self.registration.unregister()

    def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        self.registration._cancel_timers()


def _options(reg: Registration) -> Any:
    """An out-of-dialog OPTIONS to the registrar (a keep-alive; its answer is only logged)."""
    from aiosipua.dialog import Dialog

    addr = reg.uac._local_addr()
    dialog = Dialog(call_id=f"ka-{reg.call_id}", local_tag=reg._from_tag, local_uri=reg.aor,
                    remote_uri=reg.registrar_uri, remote_target=reg.registrar_uri)  # fmt: skip
    request = dialog.create_request("OPTIONS", via_host=addr[0], via_port=addr[1])
    request.headers.set_single("Content-Length", "0")
    return request


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
    retry_min_s: float = RETRY_MIN_S,
    keepalive_s: float = KEEPALIVE_S,
) -> Registrar:
    """Register `user` at `registrar` (`host[:port]`) through `uac`; outcomes go to `on_outcome`."""
    host, port = _split(registrar)
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    address = str(infos[0][4][0])
    gate.trust(address)  # the PBX sends the calls of this extension from here
    auth = SipDigestAuth(user, password) if password else None
    registration = Registration(uac, f"sip:{user}@{host}", (address, port), expires=expires, auth=auth)
    keeper = Registrar(registration, retry_min_s=retry_min_s, keepalive_s=keepalive_s)

    def registered(reg: Any) -> None:
        logger.info("SIP registered as %s at %s:%d for %d s", reg.aor, address, port, reg.granted_expires)
        keeper.registered()
        on_outcome("registered")

    def failed(reg: Any, status: int, reason: str) -> None:
        logger.error(
            "SIP registration as %s at %s:%d failed: %d %s (check [sip] user and $DUETASPAN_SIP_PASSWORD)",
            reg.aor, address, port, status, reason,
        )  # fmt: skip
        on_outcome("failed")
        keeper.retry_later(f"{status} {reason}")

    def expired(reg: Any) -> None:
        logger.error("SIP registration as %s at %s:%d expired without a refresh", reg.aor, address, port)
        on_outcome("expired")
        keeper.retry_later("expired")

    registration.on_registered = registered
    registration.on_failed = failed
    registration.on_expired = expired
    registration.register()
    return keeper


__all__ = ["KEEPALIVE_S", "RETRY_MAX_S", "RETRY_MIN_S", "Registrar", "start_registration"]
