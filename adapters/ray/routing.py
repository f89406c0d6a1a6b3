"""The public stream token of a call placed on a replica: which replica's relay endpoint the ingress must
connect to, sealed with an HMAC so that any ingress replica can check it without shared state and nobody else
can make the ingress connect anywhere.

The token goes in the TwiML as `wss://PUBLIC/twilio/stream/<token>` (path characters only: base64url). It is
not the credential that admits the call: the replica's own single-use internal token, inside it, is redeemed
once at the replica; the ingress checks Twilio's signature, the seal and the expiry first.

Example:
    >>> key = b"k" * 32
    >>> route = CallRoute(relay_url="ws://10.0.0.7:41234/relay/abc", call_sid="CA1", replica="r1", expires_at=9e9)
    >>> token = seal(route, key)
    >>> open_token(token, key, now=0.0).relay_url
    'ws://10.0.0.7:41234/relay/abc'
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

from pydantic import BaseModel, ValidationError

from duetaspan.adapters.twilio.errors import TokenExpired, TokenUnknown

_MAC_CHARS = 43  # base64url of a SHA-256 digest, unpadded


class CallRoute(BaseModel):
    """Where a placed call's stream goes."""

    relay_url: str  # ws://node-ip:port/relay/<internal single-use token>
    call_sid: str
    replica: str
    expires_at: float  # wall clock (time.time()): ingress replicas may run on other nodes


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def seal(route: CallRoute, key: bytes) -> str:
    body = _b64(json.dumps(route.model_dump(), separators=(",", ":")).encode())
    mac = _b64(hmac.new(key, body.encode(), hashlib.sha256).digest())
    return body + mac


def open_token(token: str, key: bytes, *, now: float | None = None) -> CallRoute:
    """The route in `token`; raises `TokenUnknown` (not ours, or altered) or `TokenExpired`."""
    body, mac = token[:-_MAC_CHARS], token[-_MAC_CHARS:]
    expected = _b64(hmac.new(key, body.encode(), hashlib.sha256).digest())
    if not body or not hmac.compare_digest(mac, expected):
        raise TokenUnknown("stream token was not issued by this deployment (or was altered)")
    try:
        route = CallRoute.model_validate_json(_unb64(body))
    except (ValidationError, ValueError) as exc:
        raise TokenUnknown(f"stream token is sealed but unreadable: {exc}") from None
    now = time.time() if now is None else now
    if now > route.expires_at:
        raise TokenExpired(
            f"stream token for call {route.call_sid} expired {now - route.expires_at:.1f} s ago"
        )
    return route
