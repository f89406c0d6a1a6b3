"""The resolved settings of one SIP endpoint (`SipSettings`, from `[sip]` and the `serve --sip-*` flags;
`duetaspan.adapters.sip.endpoint` re-exports it).

Example:
    >>> SipSettings(host="127.0.0.1", port=5060).timer_t1_s
    0.5
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from aiosipua.session_timer import DEFAULT_MIN_SE

from duetaspan.adapters.sip.codecs import DEFAULT_CODECS
from duetaspan.adapters.sip.register import KEEPALIVE_S
from duetaspan.adapters.sip.transactions import T1


@dataclass
class SipSettings:
    """The endpoint's resolved settings (from `[sip]` and the `serve --sip-*` flags)."""

    host: str = "127.0.0.1"
    port: int = 5060
    transport: str = "udp"
    allow: list[str] = field(default_factory=list)
    auth_user: str | None = None
    auth_password: str | None = field(default=None, repr=False)  # from the environment only
    realm: str = "duetaspan"
    refuse: str = "403"
    advertised_ip: str | None = None
    rtp_port_min: int = 20000
    rtp_port_max: int = 20999
    max_message_bytes: int = 16384
    rate_per_s: float = 20.0
    answer_after_ms: int = 0
    media_timeout_s: float = 30.0  # no caller RTP this long (not on hold): BYE, `media_timeout`
    registrar: str | None = None  # host[:port]
    user: str | None = None
    register_password: str | None = field(default=None, repr=False)  # from the environment only
    register_expires: int = 300
    outbound_proxy: str | None = None  # host[:port][;transport=...]: where the INVITEs of placed calls go
    ring_timeout_s: float = 30.0
    tls_cert: Path | None = None
    tls_key: Path | None = None
    srtp: str = "off"  # off, optional, required (`duetaspan.adapters.sip.srtp`)
    srtp_plain_signalling: bool = False  # SDES keys over UDP/TCP signalling (readable on the path)
    codecs: tuple[str, ...] = DEFAULT_CODECS  # allowed, where their packages import
    keepalive_s: float = KEEPALIVE_S  # NAT keep-alive to the registrar while registered
    timer_t1_s: float = T1  # RFC 3261's T1 (500 ms); tests shorten it to reach 64*T1 sooner
    # RFC 4028's Min-SE (90 s): a caller asking for a shorter session interval gets 422. Not in `[sip]`: tests
    # lower it to reach a session's refresh and expiry in seconds
    session_min_se_s: int = DEFAULT_MIN_SE


__all__ = ["SipSettings"]
