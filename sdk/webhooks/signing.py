"""Webhook signatures (contract): `Duetaspan-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">`.

The secret comes from `DUETASPAN_WEBHOOK_SECRET`; with `DUETASPAN_WEBHOOK_SECRET_PREVIOUS` also set (a key
rotation in progress) every delivery carries one `v1=` per secret, the current one first, and a receiver that
knows either accepts it. `verify` is what a receiver calls: it refuses a missing or malformed header, a
signature made with another secret, and a timestamp more than `tolerance_s` away from its clock (a replayed
old delivery), and returns the parsed body.

Example:
    >>> body = b'{"id":"evt_1","type":"call.ended","created":1700000000,"call_id":"CA1","data":{}}'
    >>> header = signature_header(body, ["s3cret"], timestamp=1700000000)
    >>> header.startswith("t=1700000000,v1=")
    True
    >>> verify(body, header, "s3cret", now=1700000010)["type"]
    'call.ended'
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from duetaspan.errors import DuetaspanError

HEADER = "Duetaspan-Signature"
SECRET_ENV = "DUETASPAN_WEBHOOK_SECRET"
PREVIOUS_SECRET_ENV = "DUETASPAN_WEBHOOK_SECRET_PREVIOUS"


class SignatureError(DuetaspanError):
    """A webhook delivery whose signature does not verify (missing, malformed, wrong secret, too old)."""


def _as_bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


def compute_signature(body: str | bytes, secret: str | bytes, timestamp: int) -> str:
    """The hex HMAC-SHA256 of `"<timestamp>.<raw body>"` under `secret`."""
    signed = str(int(timestamp)).encode() + b"." + _as_bytes(body)
    return hmac.new(_as_bytes(secret), signed, hashlib.sha256).hexdigest()


def signature_header(
    body: str | bytes, secrets: Iterable[str | bytes], *, timestamp: int | None = None
) -> str:
    """The `Duetaspan-Signature` value for `body`: `t=<ts>` then one `v1=` per secret, in the order given."""
    ts = int(time.time()) if timestamp is None else int(timestamp)
    parts = [f"t={ts}"] + [f"v1={compute_signature(body, s, ts)}" for s in secrets]
    if len(parts) == 1:
        raise SignatureError("no webhook secret: set DUETASPAN_WEBHOOK_SECRET")
    return ",".join(parts)


def secrets_from_env(env: Mapping[str, str]) -> list[str]:
    """The signing secrets, current first: `DUETASPAN_WEBHOOK_SECRET`, then `..._PREVIOUS` when set."""
    return [v for v in (env.get(SECRET_ENV, ""), env.get(PREVIOUS_SECRET_ENV, "")) if v]


def parse_header(header: str) -> tuple[int, list[str]]:
    """`(timestamp, [v1 signatures])` of a header value; `SignatureError` when it is malformed."""
    timestamp: int | None = None
    signatures: list[str] = []
    for item in (header or "").split(","):
        key, sep, value = item.strip().partition("=")
        if not sep:
            continue
        if key == "t":
            try:
                timestamp = int(value)
            except ValueError:
                raise SignatureError(f"{HEADER}: t={value!r} is not unix seconds") from None
        elif key == "v1":
            signatures.append(value.strip().lower())
    if timestamp is None or not signatures:
        raise SignatureError(f"{HEADER}: expected 't=<unix seconds>,v1=<hex>', got {header!r}")
    return timestamp, signatures


def verify(
    body: str | bytes,
    header: str | None,
    secret: str | bytes | Iterable[str | bytes],
    tolerance_s: float = 300,
    *,
    now: float | None = None,
) -> dict[str, Any]:
    """Check a delivery and return its JSON body; raises `SignatureError` when it does not verify.

    `body` is the raw request body (bytes as received: re-serialized JSON does not verify), `header` the
    `Duetaspan-Signature` value, `secret` one secret or several (a receiver mid-rotation); the timestamp
    must be within `tolerance_s` of `now` (default: the clock).
    """
    if header is None:
        raise SignatureError(f"no {HEADER} header")
    timestamp, signatures = parse_header(header)
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_s:
        raise SignatureError(
            f"{HEADER}: timestamp {timestamp} is {abs(current - timestamp):.0f} s from now "
            f"(tolerance {tolerance_s:g} s): a replayed or delayed delivery"
        )
    secrets = [secret] if isinstance(secret, (str, bytes)) else list(secret)
    if not any(secrets):
        raise SignatureError("no secret to verify with")
    expected = [compute_signature(body, s, timestamp) for s in secrets if s]
    if not any(hmac.compare_digest(e, got) for e in expected for got in signatures):
        raise SignatureError(f"{HEADER}: no v1 signature matches (wrong secret or a modified body)")
    try:
        parsed = json.loads(_as_bytes(body))
    except ValueError as exc:
        raise SignatureError(f"signed body is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise SignatureError("signed body is not a JSON object")
    return parsed


__all__ = [
    "HEADER",
    "PREVIOUS_SECRET_ENV",
    "SECRET_ENV",
    "SignatureError",
    "compute_signature",
    "parse_header",
    "secrets_from_env",
    "signature_header",
    "verify",
]
