"""Who may open a call: Twilio request signatures and the single-use, expiring stream tokens.

The voice webhook is signed by Twilio over the public `https://` URL and the form parameters; the stream
upgrade is signed over the exact public `wss://` URL written in the TwiML, with no parameters. Both are
accepted with and without an explicit `:443`, signed with the Auth Token (HMAC-SHA1) or, when the request
names it in `X-Twilio-Webhooks-Signature-Settings`, the webhook SharedKey (HMAC-SHA256), and compared in
constant time. On top of that each answered call gets one random token, put in the stream path (Twilio's
`<Stream url>` takes no query string); the upgrade must redeem it within its time to live, once. The token
remembers the CallSid and AccountSid of the webhook so the stream's `start` message can be checked against
them.

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

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit, urlunsplit

from twilio import request_validator
from twilio.request_validator import RequestValidator

from duetaspan.adapters.twilio.errors import (
    CallAlreadyAnswered,
    SignatureInvalid,
    TokenExpired,
    TokenReused,
    TokenUnknown,
    TooManyPending,
)

SIGNATURE_HEADER = "X-Twilio-Signature"
# Twilio's webhook shared-key signing: `key=<SharedKey id>,algorithm=HMAC_SHA256`; absent: Auth Token, SHA1
SETTINGS_HEADER = getattr(
    request_validator, "SIGNATURE_SETTINGS_HEADER", "X-Twilio-Webhooks-Signature-Settings"
)
SHARED_KEYS_SUPPORTED = hasattr(request_validator, "get_signature_algorithm")
_DEFAULT_PORTS = {"https": 443, "wss": 443, "http": 80, "ws": 80}


def redact(token: str) -> str:
    """How a token appears in logs: enough to correlate lines, never enough to replay."""
    return f"...{token[-2:]}" if len(token) > 8 else "..."


@dataclass(frozen=True)
class SigningKeys:
    """The secrets Twilio may sign with: the Auth Token, and optionally one webhook SharedKey (id, secret)."""

    auth_token: str
    shared_key_id: str | None = None
    shared_key_secret: str | None = None


def url_forms(url: str) -> list[str]:
    """`url` as Twilio may have signed it: as written, and with and without the scheme's default port.

    Twilio signs the URL it requested; whether that string carries an explicit `:443` depends on how the URL
    was configured, so both forms are accepted (the twilio library does the same for https, but takes 80 as
    the default port of `wss`).
    """
    parts = urlsplit(url)
    default = _DEFAULT_PORTS.get(parts.scheme)
    host = parts.hostname or ""
    forms = [url]
    if default is not None and parts.port in (None, default) and host:
        userless = host if ":" not in host else f"[{host}]"
        for netloc in (userless, f"{userless}:{default}"):
            forms.append(urlunsplit(parts._replace(netloc=netloc)))
    return list(dict.fromkeys(forms))


def check_signature(
    keys: SigningKeys,
    url: str,
    params: Mapping[str, str],
    signature: str | None,
    settings: str | None = None,
    *,
    shown_url: str | None = None,
) -> None:
    """Raise `SignatureInvalid` unless `signature` is Twilio's signature of `url` + `params`.

    `settings` is the `X-Twilio-Webhooks-Signature-Settings` header: when present the request was signed with
    the webhook SharedKey it names (HMAC-SHA256 by default), else with the Auth Token (HMAC-SHA1). Every
    candidate is compared in constant time. `shown_url` is what error messages show instead of `url` (the
    stream URL carries a token).
    """
    shown = shown_url or url
    if not signature:
        raise SignatureInvalid(f"missing {SIGNATURE_HEADER} header for {shown}")
    secret, algorithm = keys.auth_token, None
    if settings:
        if not SHARED_KEYS_SUPPORTED:
            raise SignatureInvalid(
                f"{SETTINGS_HEADER} present but the installed twilio library cannot check shared-key "
                "signatures (upgrade twilio)"
            )
        key_id = _settings_key(settings)
        if keys.shared_key_secret is None or key_id != keys.shared_key_id:
            raise SignatureInvalid(
                f"{shown} signed with webhook shared key {key_id[:60]!r}, which this server does not hold "
                "(set TWILIO_WEBHOOK_KEY_ID and TWILIO_WEBHOOK_KEY_SECRET)"
            )
        secret, algorithm = keys.shared_key_secret, request_validator.get_signature_algorithm(settings)
    validator = RequestValidator(secret)
    matched = False
    for form in url_forms(url):
        try:
            expected = (
                validator.compute_signature(form, dict(params), algorithm)
                if algorithm
                else (validator.compute_signature(form, dict(params)))
            )
        except ValueError as exc:  # an algorithm the library does not know
            raise SignatureInvalid(f"{SETTINGS_HEADER}: {exc}") from None
        matched |= hmac.compare_digest(expected.encode(), signature.encode())
    if not matched:
        raise SignatureInvalid(f"{SIGNATURE_HEADER} does not match {shown} (wrong auth token or public URL?)")


def _settings_key(settings: str) -> str:
    for part in settings.split(","):
        name, _, value = part.partition("=")
        if name.strip() == "key":
            return value.strip()
    return ""


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
    """Single-use stream tokens with a time to live, at most one per call; one store per server (not
    thread-safe: event loop only).

    A signed webhook replayed while its token waits gets that same token back (`issue` is idempotent per
    CallSid), and once the token is used or expired the CallSid stays `answered` (the last `memory` of them),
    so a captured webhook can never hold a second slot. At most `max_pending` tokens wait at once. Redeemed
    and expired tokens are remembered for `ttl_s` more seconds so that a replay is reported as such rather
    than as an unknown token.
    """

    ttl_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    max_pending: int = 1024
    memory: int = 4096
    _live: dict[str, StreamGrant] = field(default_factory=dict)
    _by_call: dict[str, StreamGrant] = field(default_factory=dict)  # call_sid -> its waiting grant
    _spent: dict[str, float] = field(default_factory=dict)  # token -> forget at
    _answered: OrderedDict[str, None] = field(default_factory=OrderedDict)  # call sids, oldest first

    def waiting(self, call_sid: str) -> StreamGrant | None:
        """The grant minted for `call_sid` that is still waiting for its stream, if any."""
        self._sweep()
        return self._by_call.get(call_sid)

    def answered(self, call_sid: str) -> bool:
        """Whether a token was ever minted for `call_sid` (within the last `memory` calls)."""
        return call_sid in self._answered

    def issue(
        self,
        *,
        call_sid: str,
        account_sid: str,
        from_number: str = "",
        to_number: str = "",
        ttl_s: float | None = None,
    ) -> StreamGrant:
        """The call's waiting grant, or a new one; raises `CallAlreadyAnswered` once its token is used or
        expired, `TooManyPending` when `max_pending` tokens wait already."""
        waiting = self.waiting(call_sid)
        if waiting is not None:
            return waiting
        if call_sid in self._answered:
            raise CallAlreadyAnswered(f"call {call_sid[:40]} was answered already (replayed webhook?)")
        if len(self._live) >= self.max_pending:
            raise TooManyPending(f"{len(self._live)} stream tokens are waiting already")
        grant = StreamGrant(
            token=secrets.token_urlsafe(24),
            call_sid=call_sid,
            account_sid=account_sid,
            from_number=from_number,
            to_number=to_number,
            expires_at=self.clock() + (self.ttl_s if ttl_s is None else ttl_s),
        )
        self._live[grant.token] = self._by_call[call_sid] = grant
        self._answered[call_sid] = None
        while len(self._answered) > self.memory:
            self._answered.popitem(last=False)
        return grant

    def rebind(self, token: str, call_sid: str) -> StreamGrant:
        """A waiting grant issued before its call had a SID (a call we place: its TwiML names the token
        before Twilio answers `calls.create` with the CallSid) now stands for `call_sid`."""
        old = self._live[token]
        grant = replace(old, call_sid=call_sid)
        self._live[token] = self._by_call[call_sid] = grant
        self._by_call.pop(old.call_sid, None)
        self._answered.pop(old.call_sid, None)
        self._answered[call_sid] = None
        return grant

    def revoke(self, token: str) -> None:
        """Forget a waiting token (a call we placed that was never answered)."""
        grant = self._live.pop(token, None)
        if grant is not None:
            self._by_call.pop(grant.call_sid, None)
            self._spent[token] = self.clock() + self.ttl_s

    def redeem(self, token: str) -> StreamGrant:
        """Use a token once; raises `TokenUnknown`, `TokenExpired` or `TokenReused`."""
        now = self.clock()
        grant = self._live.pop(token, None)
        if grant is None:
            if token in self._spent:
                raise TokenReused(f"stream token {redact(token)} already used (replayed upgrade?)")
            raise TokenUnknown(f"stream token {redact(token)} was not issued by this server")
        self._by_call.pop(grant.call_sid, None)
        self._spent[token] = now + self.ttl_s
        if now > grant.expires_at:
            expired = TokenExpired(
                f"stream token {redact(token)} for call {grant.call_sid} expired "
                f"{now - grant.expires_at:.1f} s ago (ttl {self.ttl_s:g} s)"
            )
            expired.call_sid = grant.call_sid  # the server frees the call's reserved slot
            raise expired
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
                self._by_call.pop(grant.call_sid, None)
                self._spent[token] = now + self.ttl_s
        for token, forget_at in list(self._spent.items()):
            if now > forget_at:
                del self._spent[token]
