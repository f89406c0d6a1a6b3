"""Who may call: the source allow-list, inbound digest authentication, per-source rate limits, size bounds.

`SipGate.check(request, addr)` decides for every out-of-dialog request before the SIP stack sees it (so a
refused source never even gets `100 Trying`). The answer never depends on the user a request names, so
scanners (`sipvicious`' svwar) find nothing to enumerate. Digest nonces are `time.hex`, 8 random bytes (two
challenges in one millisecond differ) and an HMAC of both under a per-process secret, valid for
`NONCE_TTL_S`; the expected response is computed with aiosipua's own RFC 7616 digest (`build_credentials`) and
compared in constant time. A nonce is good for one request: once a request
was let in with it, the same nonce again (a captured answer replayed, from any source, Call-ID or
Request-URI) gets a fresh challenge with `stale=true` (verdict `stale`, counted as `replayed`); a retransmission
of the request itself never reaches the gate (`duetaspan.adapters.sip.transactions` answers it). The digest's
`uri` must name the request's Request-URI (`_same_target`); it must carry the `qop=auth` we offer (an RFC 2069
answer without it is a downgrade, refused) with an `nc` that is a hex count of at least 1 and a `cnonce` beside
it (one request per nonce: a later count is a later request, refused as a replay). The nonce is not bound to
the source address: trunks send from several.

`OncePer(seconds)` is the log limiter of refusals: True for a key at most once per period.

Example:
    >>> gate = SipGate(allow=["10.0.0.0/8"], auth_user=None, auth_password=None)
    >>> gate.source_allowed("10.1.2.3"), gate.source_allowed("192.0.2.1")
    (True, False)
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Literal

from aiosipua.auth import SipDigestAuth, build_credentials
from aiosipua.headers import AuthChallenge, parse_auth, parse_uri
from aiosipua.message import SipRequest

LOOPBACK = ("127.0.0.0/8", "::1/128")
NONCE_TTL_S = 60.0
_MAX_SOURCES = 4096  # rate-limit buckets kept (least recently seen dropped first)

Verdict = Literal["allow", "challenge", "stale", "refuse", "rate_limited"]


class OncePer:
    """`limiter(key)` is True the first time for `key` in each `period_s` (bounded: `_MAX_SOURCES` keys)."""

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self._last: OrderedDict[str, float] = OrderedDict()

    def __call__(self, key: str, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        last = self._last.get(key)
        if last is not None and now - last < self.period_s:
            return False
        self._last.pop(key, None)
        self._last[key] = now
        while len(self._last) > _MAX_SOURCES:
            self._last.popitem(last=False)
        return True


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class SipGate:
    """The admission policy for SIP requests. `refusals` counts refused requests by reason."""

    allow: list[str]
    auth_user: str | None
    auth_password: str | None = field(repr=False)
    realm: str = "duetaspan"
    rate_per_s: float = 20.0
    refusals: Counter[str] = field(default_factory=Counter)
    _networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = field(init=False, repr=False)
    _secret: bytes = field(default_factory=lambda: os.urandom(32), repr=False)
    _buckets: OrderedDict[str, _Bucket] = field(default_factory=OrderedDict, repr=False)
    _used: OrderedDict[str, float] = field(default_factory=OrderedDict, repr=False)  # nonce -> when used

    def __post_init__(self) -> None:
        sources = self.allow or ([] if self.auth_user else list(LOOPBACK))
        self._networks = [ipaddress.ip_network(n, strict=False) for n in sources]

    @property
    def networks(self) -> list[str]:
        return [str(n) for n in self._networks]

    def trust(self, address: str) -> None:
        """Allow one more source address (the registrar we registered with)."""
        net = ipaddress.ip_network(address)
        if net not in self._networks:
            self._networks.append(net)

    def source_allowed(self, host: str) -> bool:
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(ip in net for net in self._networks)

    def within_rate(self, host: str, now: float | None = None) -> bool:
        """Token bucket per source address: `rate_per_s`, bursts of 4x."""
        now = time.monotonic() if now is None else now
        burst = self.rate_per_s * 4
        bucket = self._buckets.pop(host, None) or _Bucket(tokens=burst, at=now)
        bucket.tokens = min(burst, bucket.tokens + (now - bucket.at) * self.rate_per_s)
        bucket.at = now
        self._buckets[host] = bucket
        while len(self._buckets) > _MAX_SOURCES:
            self._buckets.popitem(last=False)
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True

    def check(self, request: SipRequest, host: str) -> Verdict:
        """What to do with an out-of-dialog request from `host`."""
        if not self.within_rate(host):
            return "rate_limited"
        if self.source_allowed(host):
            return "allow"
        if self.auth_user is None or not self.auth_password or request.method.upper() != "INVITE":
            return "refuse"
        header = request.get_header("authorization")
        if not header:
            return "challenge"
        return self._digest(request, header)

    def _digest(self, request: SipRequest, header: str) -> Verdict:
        if not self._digest_valid(request, header):
            return "refuse"
        nonce = parse_auth(header).params.get("nonce", "")
        if nonce in self._used:  # the right answer, a second time: a replay (or a client reusing it)
            return "stale"
        self._used[nonce] = time.monotonic()
        horizon = time.monotonic() - NONCE_TTL_S
        while self._used and (next(iter(self._used.values())) < horizon or len(self._used) > 65536):
            self._used.popitem(last=False)
        return "allow"

    # --- digest (RFC 7616, qop=auth, MD5) ---------------------------------------------------------------
    def challenge_header(self, now: float | None = None, *, stale: bool = False) -> str:
        """The `WWW-Authenticate` value of a 401 (a fresh nonce; `stale=true` after a used one)."""
        extra = ", stale=true" if stale else ""
        return f'Digest realm="{self.realm}", nonce="{self._nonce(now)}", algorithm=MD5, qop="auth"{extra}'

    def _nonce(self, now: float | None = None) -> str:
        # a random part: two challenges in the same millisecond (a trunk's burst of calls) get distinct nonces,
        # else the second caller's right answer would be refused as a replay of the first's
        stamp = format(int((time.time() if now is None else now) * 1000), "x")
        body = f"{stamp}.{os.urandom(8).hex()}"
        mac = hmac.new(self._secret, body.encode(), hashlib.sha256).hexdigest()[:32]
        return f"{body}.{mac}"

    def _nonce_fresh(self, nonce: str) -> bool:
        body, _, mac = nonce.rpartition(".")
        expected = hmac.new(self._secret, body.encode(), hashlib.sha256).hexdigest()[:32]
        if not hmac.compare_digest(mac.encode(), expected.encode()):
            return False
        stamp = body.partition(".")[0]
        try:
            issued = int(stamp, 16) / 1000
        except ValueError:
            return False
        return 0 <= time.time() - issued <= NONCE_TTL_S

    def _digest_valid(self, request: SipRequest, header: str) -> bool:
        assert self.auth_user is not None and self.auth_password is not None
        try:
            creds = parse_auth(header)
        except Exception:
            return False
        p = creds.params
        if creds.scheme.lower() != "digest" or p.get("realm") != self.realm:
            return False
        nonce = p.get("nonce", "")
        if not self._nonce_fresh(nonce):
            return False
        if not _same_target(p.get("uri", ""), request.uri):  # an answer computed for another Request-URI
            return False
        qop = p.get("qop", "")
        if qop != "auth":  # our challenge offers qop="auth" only: an answer without it (RFC 2069's, no nc or
            return False  # cnonce) is a downgrade RFC 7616 3.4 forbids a client that was offered qop
        try:
            nc = int(p.get("nc", ""), 16)
        except ValueError:
            return False
        if nc < 1 or not p.get("cnonce"):
            return False
        challenge = AuthChallenge(
            scheme="Digest",
            params={"realm": self.realm, "nonce": nonce, "algorithm": p.get("algorithm", "MD5"), "qop": qop},
        )
        # the user name is part of the hash: a wrong user fails exactly like a wrong password
        expected = build_credentials(
            SipDigestAuth(self.auth_user, self.auth_password),
            challenge,
            request.method.upper(),
            p.get("uri", ""),
            nonce_count=nc,
            cnonce=p.get("cnonce") or None,
        )
        given = p.get("response", "")
        user_ok = hmac.compare_digest(p.get("username", "").encode(), self.auth_user.encode())
        return (
            expected is not None
            and user_ok
            and hmac.compare_digest(given.lower().encode(), expected.params["response"].lower().encode())
        )


def _same_target(digest_uri: str, request_uri: str) -> bool:
    """The digest's `uri` names the Request-URI: the same URI, or its host and port with no user part (what
    SIPp's `[authentication]` writes); a user part, when given, must be the same."""
    if digest_uri == request_uri:
        return True
    try:
        given, wanted = parse_uri(digest_uri), parse_uri(request_uri)
    except Exception:
        return False
    same_host = (given.host.lower(), given.port or 5060) == (wanted.host.lower(), wanted.port or 5060)
    return same_host and given.scheme == wanted.scheme and given.user in (None, "", wanted.user)


__all__ = ["LOOPBACK", "NONCE_TTL_S", "OncePer", "SipGate", "Verdict"]
