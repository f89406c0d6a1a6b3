"""`[sip]`: the native SIP endpoint (`duetaspan serve --sip`, `duetaspan.adapters.sip`).

Secrets never live here: the inbound digest password is read from `$DUETASPAN_SIP_AUTH_PASSWORD` only.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from duetaspan.config.base import _Section

AUTH_PASSWORD_ENV = "DUETASPAN_SIP_AUTH_PASSWORD"
REGISTER_PASSWORD_ENV = "DUETASPAN_SIP_PASSWORD"
SipCodec = Literal["opus", "g722", "pcmu", "pcma"]
SIP_CODECS: tuple[SipCodec, ...] = ("opus", "g722", "pcmu", "pcma")


class SipConfig(_Section):
    """The SIP endpoint: where it listens, who may call it, and its media ports.

    Secure by default: an INVITE is answered only when its source address is in `allow` or it carries valid
    digest credentials for `auth_user` (password in `$DUETASPAN_SIP_AUTH_PASSWORD`); anything else gets
    `403 Forbidden` (or no answer at all with `refuse = "silence"`) and is counted, with the same answer
    whatever user it names. With neither `allow` nor `auth_user` set, only loopback (127.0.0.0/8, ::1) may call.

    Attributes:
        host: interface the SIP and RTP sockets bind (default: `[server] host`).
        port: SIP port; `serve --sip-port` overrides it.
        transport: `udp`, `tcp` or `tls` (`serve --sip-transport`); `tls` needs `tls_cert` and `tls_key`.
        allow: source networks (CIDR) whose INVITEs are answered without credentials (`serve --sip-allow`).
        auth_user: digest user name other sources must authenticate as (password from the environment).
        realm: digest realm of the challenge.
        refuse: `403` answers refused requests with 403 Forbidden; `silence` sends nothing back.
        advertised_ip: the address written in SDP and Contact when the host is behind NAT (default: host).
        rtp_port_min: lowest RTP port (even; RTCP uses the next one).
        rtp_port_max: highest RTP port.
        max_message_bytes: a SIP message longer than this is dropped and counted.
        rate_per_s: out-of-dialog requests accepted per second from one source address (burst: 4x).
        answer_after_ms: time between `180 Ringing` and `200 OK` (a PBX-like ring; 0 answers at once).
        media_timeout_s: a call from which no RTP arrived for this long ends with BYE (`ended_by:
            "media_timeout"`: a dropped mobile or a crashed PBX sends no BYE); not while the caller holds
            the call (`a=sendonly` / `a=inactive`).
        registrar: register as a PBX extension or a registering trunk: the registrar's `host[:port]` (its
            address is then allowed to send INVITEs); the password comes from `$DUETASPAN_SIP_PASSWORD`.
        user: the user (extension) to register as (`sip:USER@registrar-host`), also the digest user of the
            calls we place (password: `$DUETASPAN_SIP_PASSWORD`).
        register_expires: binding interval asked of the registrar; refreshed at 90 % of what it grants.
        outbound_proxy: send the INVITEs of calls we place (`agent.dial`, `duetaspan call sip:...`) to this
            proxy or trunk, `host[:port][;transport=udp|tcp|tls]` (transport: the endpoint's own), as a
            pre-loaded route (RFC 3261 8.1.2): the Request-URI stays the callee's URI; a 401/407 challenge
            is answered with `user` and `$DUETASPAN_SIP_PASSWORD`. Unset: straight to the URI's host.
        ring_timeout_s: how long a call we place may ring before we give up (CANCEL, outcome `no-answer`),
            unless the dial names its own.
        tls_cert: PEM certificate for `transport = "tls"`.
        tls_key: PEM private key for `transport = "tls"`.
        srtp: SRTP with SDES keys (RFC 4568 `a=crypto`; AES_CM_128_HMAC_SHA1_80 and _32): `off` never offers
            it (an `RTP/SAVP` offer gets 488), `optional` answers SRTP offers with SRTP and plain ones with
            plain RTP, `required` answers an INVITE without usable `a=crypto` with 488 and offers `RTP/SAVP`
            when dialling. Needs `transport = "tls"` unless `srtp_plain_signalling` is set. Default:
            `optional` with `transport = "tls"`, else `off`.
        srtp_plain_signalling: allow `srtp` over `udp`/`tcp` signalling, where the SDES keys in the SDP are
            readable by anyone on the signalling path (only for a private interconnect you trust).
        codecs: audio codecs allowed, in our order of preference when dialling (answers follow the
            caller's order): `opus`, `g722`, `pcmu`, `pcma`; G.722 and Opus only where their packages
            import (`pip install duetaspan[sip-codecs]`).
    """

    host: str | None = None
    port: int = Field(5060, ge=0, le=65535)
    transport: Literal["udp", "tcp", "tls"] = "udp"
    allow: list[str] = Field(default_factory=list)
    auth_user: str | None = None
    realm: str = "duetaspan"
    refuse: Literal["403", "silence"] = "403"
    advertised_ip: str | None = None
    rtp_port_min: int = Field(20000, ge=1024, le=65534)
    rtp_port_max: int = Field(20999, ge=1025, le=65535)
    max_message_bytes: int = Field(16384, ge=1024, le=65535)
    rate_per_s: float = Field(20.0, gt=0)
    answer_after_ms: int = Field(0, ge=0, le=60000)
    media_timeout_s: float = Field(30.0, gt=0, le=86400)
    registrar: str | None = None
    user: str | None = None
    register_expires: int = Field(300, ge=10, le=86400)
    outbound_proxy: str | None = None
    ring_timeout_s: float = Field(30.0, gt=0, le=600)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    srtp: Literal["off", "optional", "required"] | None = None
    srtp_plain_signalling: bool = False
    codecs: list[SipCodec] = Field(default_factory=lambda: list(SIP_CODECS), min_length=1)

    @field_validator("allow")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        for item in value:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(
                    f"{item!r} is not a network (CIDR such as 10.0.0.0/8 or 192.0.2.7)"
                ) from None
        return value

    @field_validator("outbound_proxy")
    @classmethod
    def _proxy(cls, value: str | None) -> str | None:
        if value is not None:
            parse_proxy(value)  # raises ValueError naming what is wrong
        return value

    @property
    def srtp_mode(self) -> Literal["off", "optional", "required"]:
        """`srtp`, or its default: `optional` over TLS (the keys are as safe as the signalling), else `off`."""
        if self.srtp is not None:
            return self.srtp
        return "optional" if self.transport == "tls" else "off"

    @model_validator(mode="after")
    def _ranges(self) -> SipConfig:
        if self.rtp_port_max <= self.rtp_port_min:
            raise ValueError("rtp_port_max must be above rtp_port_min")
        if self.registrar and not self.user:
            raise ValueError("registrar needs user (the extension to register as)")
        if self.transport == "tls" and (self.tls_cert is None or self.tls_key is None):
            raise ValueError('transport = "tls" needs tls_cert and tls_key')
        if self.outbound_proxy and parse_proxy(self.outbound_proxy)[2] not in (None, self.transport):
            raise ValueError(
                f"outbound_proxy {self.outbound_proxy!r}: its transport must be the endpoint's own "
                f"({self.transport!r}; set [sip] transport / --sip-transport)"
            )
        if self.srtp_mode != "off" and self.transport != "tls" and not self.srtp_plain_signalling:
            raise ValueError(
                f'srtp = "{self.srtp}" over {self.transport}: SDES keys travel in the SDP, readable on the '
                'signalling path; use transport = "tls", or set srtp_plain_signalling = true to accept that'
            )
        return self


def parse_proxy(value: str) -> tuple[str, int, str | None]:
    """`host[:port][;transport=udp|tcp|tls]` -> (host, port, transport or None); ValueError when malformed."""
    hostport, _, params = value.strip().removeprefix("sip:").partition(";")
    transport = None
    for param in filter(None, params.split(";")):
        key, _, val = param.partition("=")
        if key.strip().lower() != "transport" or val.strip().lower() not in ("udp", "tcp", "tls"):
            raise ValueError(f"outbound_proxy {value!r}: only ;transport=udp|tcp|tls may follow host[:port]")
        transport = val.strip().lower()
    if hostport.startswith("["):  # [IPv6]:port
        host, _, rest = hostport[1:].partition("]")
        port_text = rest.removeprefix(":")
    else:
        host, _, port_text = hostport.partition(":")
    if not host or any(c in host for c in " @/<>"):
        raise ValueError(f"outbound_proxy {value!r}: expected host[:port][;transport=...]")
    try:
        port = int(port_text) if port_text else 5060
    except ValueError:
        raise ValueError(f"outbound_proxy {value!r}: the port must be a number") from None
    if not 0 < port <= 65535:
        raise ValueError(f"outbound_proxy {value!r}: port {port} is not a port (1-65535)")
    return host, port, transport


__all__ = ["AUTH_PASSWORD_ENV", "REGISTER_PASSWORD_ENV", "SipConfig", "parse_proxy"]
