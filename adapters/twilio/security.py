"""Who may open a call: Twilio request signatures and the single-use, expiring stream tokens.

The voice webhook is signed by Twilio over the public `https://` URL and the form parameters; the stream
upgrade is signed over the exact public `wss://` URL written in the TwiML, with no parameters. On top of that
each webhook mints one random token, put in the stream path (Twilio's `<Stream url>` takes no query string);
the upgrade must redeem it within its time to live, once. The token remembers the CallSid and AccountSid of
the webhook so the stream's `start` message can be checked against them.

Example:
    >>> tokens = StreamTokens(ttl_s=30.0)
    >>> grant = tokens.issue(call_sid="CA1", account_sid="AC1", from_number="+15550001", to_number="+15550002")
    >>> tokens.redeem(grant.token).call_sid
    'CA1'
    >>> tokens.redeem(grant.token)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    duetaspan.adapters.twilio.errors.TokenReused: stream token ... already used (replayed upgrade?)
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from twilio.request_validator import RequestValidator

from duetaspan.adapters.twilio.errors import SignatureInvalid, TokenExpired, TokenReused, TokenUnknown

SIGNATURE_HEADER = "X-Twilio-Signature"


def redact(token: str) -> str:
    """How a token appears in logs: enough to correlate lines, never enough to replay."""
    return f"...{token[-2:]}" if len(token) > 8 else "..."


def check_signature(
    validator: RequestValidator, url: str, params: Mapping[str, str], signature: str | None
) -> None:
    """Raise `SignatureInvalid` unless `signature` is Twilio's signature of `url` + `params`."""
    if not signature:
        raise SignatureInvalid(f"missing {SIGNATURE_HEADER} header for {url}")
    if not validator.validate(url, dict(params), signature):
        raise SignatureInvalid(f"{SIGNATURE_HEADER} does not match {url} (wrong auth token or public URL?)")


@dataclass(frozen=True)
class StreamGrant:
    """What a stream token stands for: the call the webhook answered."""

    token: str
    call_sid: str
    account_sid: str
    from_number: str
    to_number: str
    expires_at: float


@dataclass
class StreamTokens:
    """Single-use stream tokens with a time to live; one store per server (not thread-safe: event loop only).

    Redeemed and expired tokens are remembered for `ttl_s` more seconds so that a replay is reported as
    such rather than as an unknown token.
    """

    ttl_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    _live: dict[str, StreamGrant] = field(default_factory=dict)
    _spent: dict[str, float] = field(default_factory=dict)  # token -> forget at

    def issue(
        self, *, call_sid: str, account_sid: str, from_number: str = "", to_number: str = ""
    ) -> StreamGrant:
        self._sweep()
        grant = StreamGrant(
            token=secrets.token_urlsafe(24),
            call_sid=call_sid,
            account_sid=account_sid,
            from_number=from_number,
            to_number=to_number,
            expires_at=self.clock() + self.ttl_s,
        )
        self._live[grant.token] = grant
        return grant

    def redeem(self, token: str) -> StreamGrant:
        """Use a token once; raises `TokenUnknown`, `TokenExpired` or `TokenReused`."""
        now = self.clock()
        grant = self._live.pop(token, None)
        if grant is None:
            if token in self._spent:
                raise TokenReused(f"stream token {redact(token)} already used (replayed upgrade?)")
            raise TokenUnknown(f"stream token {redact(token)} was not issued by this server")
        self._spent[token] = now + self.ttl_s
        if now > grant.expires_at:
            raise TokenExpired(
                f"stream token {redact(token)} for call {grant.call_sid} expired "
                f"{now - grant.expires_at:.1f} s ago (ttl {self.ttl_s:g} s)"
            )
        return grant

    @property
    def pending(self) -> int:
        """Tokens issued, not yet redeemed and not expired: calls on their way to the stream socket."""
        self._sweep()
        return len(self._live)

    def _sweep(self) -> None:
        now = self.clock()
        for token, grant in list(self._live.items()):
            if now > grant.expires_at:
                del self._live[token]
                self._spent[token] = now + self.ttl_s
        for token, forget_at in list(self._spent.items()):
            if now > forget_at:
                del self._spent[token]
