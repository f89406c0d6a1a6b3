"""The page token: Bearer header or query parameter, 401 missing / 403 wrong, minimum length, log redaction."""

from __future__ import annotations

import logging

import pytest

from duetaspan.adapters.webrtc.security import (
    PageToken,
    RedactQueryTokens,
    TokenInvalid,
    TokenMissing,
)
from duetaspan.errors import ConfigError

SECRET = "correct-horse-battery-staple"


def test_token_from_header_or_query():
    token = PageToken(SECRET)
    token.check(f"Bearer {SECRET}", None)
    token.check(f"bearer   {SECRET} ", None)
    token.check(None, SECRET)
    token.check("Basic abc", SECRET)  # not a bearer header: the query parameter counts
    with pytest.raises(TokenMissing) as missing:
        token.check(None, None)
    assert missing.value.status == 401 and "?token=" in str(missing.value)
    with pytest.raises(TokenInvalid) as wrong:
        token.check(f"Bearer {SECRET}x", None)
    assert wrong.value.status == 403 and SECRET not in str(wrong.value)
    with pytest.raises(TokenInvalid):
        token.check(None, SECRET[:-1])


def test_random_tokens_and_minimum_length():
    a, b = PageToken(), PageToken()
    assert a.value != b.value and len(a.value) >= 24
    assert a.page_url("http://localhost:8080/") == f"http://localhost:8080/?token={a.value}"
    with pytest.raises(ConfigError, match="at least 16"):
        PageToken("short")


def test_access_log_lines_lose_the_token():
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", f"/?token={SECRET}&raw=1", "1.1", 200), None,
    )  # fmt: skip
    assert RedactQueryTokens().filter(record)
    assert record.getMessage() == '127.0.0.1:5000 - "GET /?token=<token>&raw=1 HTTP/1.1" 200'


def test_page_token_is_compared_in_constant_time(monkeypatch):
    """Timing cannot be measured reliably in a unit test: prove the comparison is `hmac.compare_digest`
    (with `==` an attacker could find the token a character at a time)."""
    from duetaspan.adapters.webrtc import security

    calls = []

    def spy(a, b):
        calls.append((a, b))
        return False  # whatever the spy says decides: nothing else compares the token

    monkeypatch.setattr(security.hmac, "compare_digest", spy)
    with pytest.raises(TokenInvalid):
        PageToken(SECRET).check(f"Bearer {SECRET}", None)
    assert calls == [(SECRET.encode(), SECRET.encode())]
