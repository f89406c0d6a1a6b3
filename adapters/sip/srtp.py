"""SRTP with SDES keys (RFC 3711, RFC 4568): the `a=crypto` lines of SDP, and an `aiortp` RTP session whose
packets are protected with libsrtp (`pylibsrtp`) on their way out and authenticated and decrypted on their
way in. aiortp itself has no SRTP: `SrtpRTPSession` wraps its two UDP transports, so the jitter buffer,
playout, RTCP and DTMF above it see plain RTP/RTCP and the wire carries only SRTP/SRTCP.

Modes (`[sip] srtp`): `off` never offers SRTP and refuses an `RTP/SAVP` offer (488); `optional` answers an
offer's `a=crypto` (in `RTP/SAVP`, or best-effort in `RTP/AVP`) with SRTP and a plain offer with plain RTP,
and offers best-effort SRTP (`RTP/AVP` with `a=crypto`) when dialling; `required` refuses an INVITE without a
usable `a=crypto` with 488 and offers `RTP/SAVP` when dialling. SDES keys travel in the SDP, readable by
anyone who reads the signalling: SRTP is only offered or accepted over `transport = "tls"`, unless
`[sip] srtp_plain_signalling = true` says otherwise. Keys are never logged: `CryptoLine` and `SrtpContext`
hide them from `repr`, and only the suite and tag are named in log lines.

Example:
    >>> line = CryptoLine.generate(1, "AES_CM_128_HMAC_SHA1_80")
    >>> str(line).startswith("1 AES_CM_128_HMAC_SHA1_80 inline:")
    True
    >>> CryptoLine.parse(str(line)) == line
    True
"""

from __future__ import annotations

import base64
import binascii
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pylibsrtp
from aiortp.packet import is_rtcp
from aiosipua.sdp import MediaDescription, SdpNegotiationError

from duetaspan.adapters.sip.latch import LatchedRTPSession

logger = logging.getLogger("duetaspan.sip")

MODES = ("off", "optional", "required")
# RFC 4568 section 6.2: both suites take a 128-bit key and a 112-bit salt (30 bytes, 40 base64 characters)
SUITES: dict[str, int] = {
    "AES_CM_128_HMAC_SHA1_80": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80,
    "AES_CM_128_HMAC_SHA1_32": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_32,
}
KEY_SALT_BYTES = 30
SECURE_PROFILES = frozenset({"RTP/SAVP", "RTP/SAVPF"})


class SrtpRequired(SdpNegotiationError):
    """The offer (or the callee's answer) has no `a=crypto` line we can use, and SRTP is required."""

    reason = "no_srtp"


class SrtpRefused(SdpNegotiationError):
    """An `RTP/SAVP` offer while SRTP is off (or not allowed over this signalling transport)."""

    reason = "no_srtp"


def effective_mode(mode: str, transport: str, plain_signalling: bool) -> str:
    """The SRTP mode in force: `mode`, unless the SDES keys would travel in readable signalling (not TLS)
    and `plain_signalling` does not allow it; then `ValueError` (a configuration error, said at startup)."""
    if mode not in MODES:
        raise ValueError(f"[sip] srtp must be one of {MODES}, not {mode!r}")
    if mode != "off" and transport != "tls" and not plain_signalling:
        raise ValueError(
            f'[sip] srtp = "{mode}" over {transport}: SDES keys travel in the SDP, readable by anyone on the '
            'signalling path; use transport = "tls", or set srtp_plain_signalling = true to accept that'
        )
    return mode


@dataclass(frozen=True)
class CryptoLine:
    """One `a=crypto:<tag> <suite> inline:<key||salt>` attribute value (no MKI, no lifetime, no session
    parameters: the forms we accept and send)."""

    tag: int
    suite: str
    key: bytes = field(repr=False)

    def __str__(self) -> str:
        return f"{self.tag} {self.suite} inline:{base64.b64encode(self.key).decode('ascii')}"

    @classmethod
    def generate(cls, tag: int, suite: str) -> CryptoLine:
        """A fresh master key and salt from the OS's CSPRNG."""
        return cls(tag, suite, secrets.token_bytes(KEY_SALT_BYTES))

    @classmethod
    def parse(cls, value: str) -> CryptoLine | None:
        """The attribute value, or None when we cannot use it (unknown suite, several keys, an MKI, session
        parameters such as UNENCRYPTED_SRTP, a key of the wrong length)."""
        parts = value.split()
        if len(parts) != 3 or parts[1] not in SUITES or not parts[2].startswith("inline:"):
            return None
        try:
            tag = int(parts[0])
        except ValueError:
            return None
        key_params = parts[2][len("inline:") :].split("|")
        if any(p.count(":") for p in key_params[1:]):  # `|MKI:LEN`: one key per direction is all we keep
            return None
        try:
            key = base64.b64decode(key_params[0], validate=True)
        except (binascii.Error, ValueError):
            return None
        if len(key) != KEY_SALT_BYTES or not 0 <= tag <= 999999999:
            return None
        return cls(tag, parts[1], key)


def offered_lines(media: MediaDescription | None) -> list[CryptoLine]:
    """The usable `a=crypto` lines of an m-line, in the offerer's order of preference."""
    if media is None:
        return []
    lines = (CryptoLine.parse(v) for v in media.attributes.get("crypto", []))
    return [line for line in lines if line is not None]


class SrtpContext:
    """The two libsrtp sessions of one call: ours (outbound, our key) and the peer's (inbound, its key)."""

    def __init__(self, local: CryptoLine, remote: CryptoLine) -> None:
        self.suite = local.suite
        self.tag = local.tag
        self.local = local
        self._tx = pylibsrtp.Session(policy=self._policy(local, pylibsrtp.Policy.SSRC_ANY_OUTBOUND))
        self._rx = pylibsrtp.Session(policy=self._policy(remote, pylibsrtp.Policy.SSRC_ANY_INBOUND))
        self._remote_key = remote.key
        self.protected = 0
        self.unprotected = 0
        self.auth_failures = 0  # SRTP packets that failed authentication (forged, replayed, plain RTP)
        self.rtcp_auth_failures = 0  # SRTCP: baresip, for one, sends some RTCP (APP, a late BYE) unprotected

    def __repr__(self) -> str:
        return f"SrtpContext(suite={self.suite!r}, tag={self.tag})"

    @staticmethod
    def _policy(line: CryptoLine, ssrc_type: int) -> pylibsrtp.Policy:
        policy = pylibsrtp.Policy(key=line.key, ssrc_type=ssrc_type, srtp_profile=SUITES[line.suite])
        policy.allow_repeat_tx = True  # RFC 4733 end packets may repeat
        return policy

    def update_remote(self, remote: CryptoLine) -> None:
        """A re-INVITE's offer carried a new key: the peer's packets are checked against it from now on."""
        if remote.key != self._remote_key:
            self._rx = pylibsrtp.Session(policy=self._policy(remote, pylibsrtp.Policy.SSRC_ANY_INBOUND))
            self._remote_key = remote.key
            logger.info("SRTP: the peer changed its key (re-INVITE)")

    def protect(self, data: bytes) -> bytes | None:
        try:
            out = self._tx.protect_rtcp(data) if is_rtcp(data) else self._tx.protect(data)
        except pylibsrtp.Error as exc:
            logger.warning("SRTP: could not protect a packet (%s); not sent", exc)
            return None
        self.protected += 1
        return bytes(out)

    def unprotect(self, data: bytes) -> bytes | None:
        """The plain packet, or None (counted in `auth_failures` / `rtcp_auth_failures`) for a forged,
        replayed or plain one."""
        rtcp = is_rtcp(data)
        try:
            out = self._rx.unprotect_rtcp(data) if rtcp else self._rx.unprotect(data)
        except pylibsrtp.Error:
            if rtcp:
                self.rtcp_auth_failures += 1
                return None
            self.auth_failures += 1
            if self.auth_failures in (1, 10, 100, 1000):
                logger.warning("SRTP: %d packet(s) failed authentication; dropped", self.auth_failures)
            return None
        self.unprotected += 1
        return bytes(out)

    def stats(self) -> dict[str, Any]:
        return {
            "srtp": self.suite,
            "srtp_protected": self.protected,
            "srtp_unprotected": self.unprotected,
            "srtp_auth_failures": self.auth_failures,
            "srtcp_auth_failures": self.rtcp_auth_failures,
        }


class SrtpRTPSession(LatchedRTPSession):
    """An `aiortp.RTPSession` that speaks SRTP on the wire (behind the latch: only a packet that authenticates
    can latch it). Set `srtp` right after `create`: until then every
    packet, in or out, is dropped (never sent or accepted in the clear)."""

    srtp: SrtpContext | None = None

    async def _bind_transports(self, local_addr: tuple[str, int], remote_addr: tuple[str, int]) -> None:
        await super()._bind_transports(local_addr, remote_addr)
        for transport in (self._rtp_transport, self._rtcp_transport):
            if transport is not None:
                transport.send = self._protected_send(transport.send)  # type: ignore[method-assign,assignment]

    def _protected_send(
        self, send: Callable[[bytes, tuple[str, int] | None], None]
    ) -> Callable[[bytes, tuple[str, int] | None], None]:
        def protected(data: bytes, addr: tuple[str, int] | None = None) -> None:
            out = self.srtp.protect(data) if self.srtp is not None else None
            if out is not None:
                send(out, addr)

        return protected

    def _handle_rtp(self, data: bytes, addr: tuple[str, int]) -> None:
        plain = self.srtp.unprotect(data) if self.srtp is not None else None
        if plain is not None:
            super()._handle_rtp(plain, addr)

    def _handle_rtcp(self, data: bytes, addr: tuple[str, int]) -> None:
        plain = self.srtp.unprotect(data) if self.srtp is not None else None
        if plain is not None:
            super()._handle_rtcp(plain, addr)


def answer_srtp(offer_audio: MediaDescription, mode: str) -> tuple[CryptoLine, CryptoLine] | None:
    """Our (local, remote) keys for the answer to `offer_audio`, or None for plain RTP; raises `SrtpRequired`
    / `SrtpRefused` (488) when the offer and the mode cannot meet."""
    secure_profile = offer_audio.proto.upper() in SECURE_PROFILES
    if mode == "off":
        if secure_profile:
            raise SrtpRefused(f"{offer_audio.proto} offered but SRTP is off")
        return None
    lines = offered_lines(offer_audio)
    if not lines:
        if mode == "required" or secure_profile:
            raise SrtpRequired(
                f"no usable a=crypto in the offer ({offer_audio.proto}); we accept {', '.join(SUITES)}"
            )
        return None
    remote = lines[0]
    return CryptoLine.generate(remote.tag, remote.suite), remote


def offer_lines(mode: str) -> list[CryptoLine]:
    """Our `a=crypto` lines when dialling (none when SRTP is off)."""
    if mode == "off":
        return []
    return [CryptoLine.generate(tag, suite) for tag, suite in enumerate(SUITES, start=1)]


def offer_profile(mode: str) -> str:
    """`RTP/SAVP` when SRTP is required, else `RTP/AVP` (best-effort SRTP: `a=crypto` in a plain profile)."""
    return "RTP/SAVP" if mode == "required" else "RTP/AVP"


def answered_srtp(
    ours: list[CryptoLine], answer_audio: MediaDescription | None, mode: str
) -> SrtpContext | None:
    """The SRTP context of a call we placed, from the callee's answer; raises `SrtpRequired` when SRTP is
    required and the answer does not accept one of our lines."""
    by_tag = {line.tag: line for line in ours}
    for remote in offered_lines(answer_audio):
        local = by_tag.get(remote.tag)
        if local is not None and local.suite == remote.suite:
            return SrtpContext(local, remote)
    if mode == "required":
        raise SrtpRequired("the callee's answer accepts none of our a=crypto lines")
    return None


__all__ = [
    "MODES",
    "SUITES",
    "CryptoLine",
    "SrtpContext",
    "SrtpRTPSession",
    "SrtpRefused",
    "SrtpRequired",
    "answer_srtp",
    "answered_srtp",
    "effective_mode",
    "offer_lines",
    "offer_profile",
    "offered_lines",
]
