"""Who may use the browser page: one random page token per server, carried by the page URL (`/?token=...`)
and sent by the page with every request as `Authorization: Bearer <token>`.

A missing token is 401 (`TokenMissing`), a wrong one 403 (`TokenInvalid`); comparison is constant-time.
Tokens never reach the logs in full (`redact`, `RedactQueryTokens` for uvicorn's access lines).

Example:
    >>> token = PageToken("s3cret-s3cret-s3cret")
    >>> token.check("Bearer s3cret-s3cret-s3cret", None)
    >>> token.check(None, "wrong")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    duetaspan.adapters.webrtc.security.TokenInvalid: page token does not match ...
"""

from __future__ import annotations

import hmac
import logging
import re
import secrets

from duetaspan.errors import ConfigError, DuetaspanError

MIN_TOKEN_CHARS = 16
_QUERY_TOKEN = re.compile(r"([?&]token=)[^&\s\"']+")


class PageAccessError(DuetaspanError):
    """A request to the page or its endpoints without a valid token; `status` is the HTTP answer."""

    status: int = 403


class TokenMissing(PageAccessError):
    status = 401


class TokenInvalid(PageAccessError):
    status = 403


def redact(token: str) -> str:
    """How a token appears in logs: enough to correlate lines, never enough to use."""
    return f"...{token[-2:]}" if len(token) > 8 else "..."


class PageToken:
    """The page token (random when not given; at least 16 characters when given)."""

    def __init__(self, value: str | None = None) -> None:
        if value is not None and len(value) < MIN_TOKEN_CHARS:
            raise ConfigError(f"the WebRTC page token must have at least {MIN_TOKEN_CHARS} characters")
        self.value = value or secrets.token_urlsafe(24)

    def check(self, authorization: str | None, query_token: str | None) -> None:
        """Accept `Authorization: Bearer <token>` or a `token` query parameter; raise `PageAccessError`."""
        presented = None
        if authorization:
            scheme, _, credentials = authorization.partition(" ")
            if scheme.lower() == "bearer" and credentials.strip():
                presented = credentials.strip()
        presented = presented or query_token
        if not presented:
            raise TokenMissing(
                "no page token: open the URL printed by `duetaspan serve --webrtc` (/?token=...)"
            )
        if not hmac.compare_digest(presented.encode(), self.value.encode()):
            raise TokenInvalid(f"page token does not match (got {redact(presented)})")

    def page_url(self, base_url: str) -> str:
        return f"{base_url.rstrip('/')}/?token={self.value}"


class RedactQueryTokens(logging.Filter):
    """Masks `token=` query parameters in log lines (uvicorn writes request URLs in full)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = _QUERY_TOKEN.sub(r"\1<token>", message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        return True
