"""`POST /admin/sip/dial`: a running `duetaspan serve --sip` places a call on request (what
`duetaspan call sip:... --server URL` sends), guarded by the admin role (`duetaspan.access`:
`Authorization: Bearer $DUETASPAN_ADMIN_TOKEN`, the header only). Unlike the other admin routes it is never
open without the token, not even on the local demo (loopback, no public URL: a tunnel would hand the internet
a phone line on your trunk).

Request: JSON `{"to": "sip:+15551234567@trunk.example", "from": "7001", "ring_timeout_s": 30}` (`from`: the
user part of our From URI, default `[sip] user`; `ring_timeout_s` default `[sip] ring_timeout_s`). The server
runs the same code as `await agent.dial(...)` in its own process and answers when the outcome is known:
200 with `{"outcome": "answered" | "busy" | "no-answer" | "failed", "call_id", "sip_status", "reason", ...}`
(`DialResult.summary`). Refusals: 401 (no or a wrong token), 403 (no admin token set), 400 (not a SIP URI, a
malformed field, or one carrying characters that could smuggle SIP headers), 409 (this server does not
serve SIP), 503 (its SIP endpoint is not up).

Example:
    $ curl -X POST -H "Authorization: Bearer $DUETASPAN_ADMIN_TOKEN" -d '{"to": "sip:7002@pbx.example"}' \\
        http://127.0.0.1:8080/admin/sip/dial
    {"outcome": "answered", "to": "sip:7002@pbx.example", "call_id": "...", "sip_status": 200, ...}
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from duetaspan.errors import DuetaspanError

logger = logging.getLogger("duetaspan.sip")

DIAL_PATH = "/admin/sip/dial"
MAX_BODY_BYTES = 4096
MAX_RING_S = 600.0
# a SIP URI on one line with nothing that ends a header or the URI's angle brackets (no CR, LF, <, >, spaces)
_SIP_URI = re.compile(r"^sips?:[^\s<>\"]{1,250}$")
_USER = re.compile(r"^[A-Za-z0-9+._-]{1,64}$")  # a plain user part: no URI parameters or headers

NEEDS_TOKEN = (
    "placing calls needs the admin token even on a local demo server: start the server with "
    "$DUETASPAN_ADMIN_TOKEN set and send Authorization: Bearer <token>"
)

Dial = Callable[..., Awaitable[Any]]


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def parse_dial_request(body: bytes) -> tuple[str, str | None, float | None]:
    """`(to, from, ring_timeout_s)` from the request body; ValueError with the reason when it is not valid."""
    try:
        data = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError):
        raise ValueError('the body must be JSON: {"to": "sip:USER@HOST"}') from None
    if not isinstance(data, dict):
        raise ValueError('the body must be a JSON object: {"to": "sip:USER@HOST"}')
    unknown = sorted(set(data) - {"to", "from", "ring_timeout_s"})
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}: only to, from and ring_timeout_s")
    to, caller, ring = data.get("to"), data.get("from"), data.get("ring_timeout_s")
    if not isinstance(to, str) or not _SIP_URI.match(to):
        raise ValueError(f"to {to!r}: a SIP URI such as sip:+15551234567@trunk.example is needed")
    if caller is not None and (not isinstance(caller, str) or not _USER.match(caller)):
        raise ValueError(
            f"from {caller!r}: the user part of a SIP URI (letters, digits, + . _ -), 64 at most"
        )
    if ring is not None:
        if isinstance(ring, bool) or not isinstance(ring, int | float) or not 0 < ring <= MAX_RING_S:
            raise ValueError(f"ring_timeout_s {ring!r}: seconds, above 0 and at most {MAX_RING_S:.0f}")
        ring = float(ring)
    return to, caller, ring


def add_dial_route(app: FastAPI, dial: Dial | None) -> None:
    """`POST /admin/sip/dial` on `app` (its admin role is `app.state.admin`); `dial` None: 409, no SIP here."""

    async def dial_route(request: Request) -> Response:
        admin = app.state.admin
        refused = admin.refusal(request) if admin is not None else _error(403, "no admin role")
        if refused is None and getattr(admin, "token", None) is None:  # the local demo opens admin routes:
            refused = _error(403, NEEDS_TOKEN)  # not this one, placing calls costs money (toll fraud)
        if refused is not None:
            logger.warning("refused POST %s: HTTP %d", DIAL_PATH, refused.status_code)
            return refused
        if dial is None:
            return _error(409, "this server does not serve SIP: start it with duetaspan serve --sip")
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            return _error(413, f"the body is over {MAX_BODY_BYTES} bytes")
        try:
            to, caller, ring = parse_dial_request(body)
        except ValueError as exc:
            return _error(400, str(exc))
        logger.info("POST %s: dialling %s", DIAL_PATH, to)
        try:
            result = await dial(to, caller=caller, ring_timeout_s=ring)
        except (DuetaspanError, RuntimeError) as exc:  # the endpoint is not running (yet, or any more)
            return _error(503, f"the SIP endpoint cannot dial: {exc}")
        except ValueError as exc:  # a URI aiosipua cannot take
            return _error(400, f"to {to!r}: {exc}")
        return JSONResponse(result.summary())

    app.add_api_route(DIAL_PATH, dial_route, methods=["POST"], include_in_schema=False)


__all__ = ["DIAL_PATH", "add_dial_route", "parse_dial_request"]
