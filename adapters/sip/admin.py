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

`POST /admin/dial` takes the same body with `to` a SIP URI or an E.164 number (`+15551234567`, placed through
Twilio by a `serve --twilio` server, `duetaspan.adapters.twilio.outbound`; `from`: its E.164 caller ID,
default `[twilio] phone_number`); 409 names the carrier this server does not serve. `"detect": true` (either
route) turns answer detection on for the call and, once it is answered, waits for the verdict: the answer
then has `answer` (`verdict`, `confidence`, `decided_at_s`, ...; null when none came in time). `"goal": "reach
billing"` is `agent.dial(..., goal=...)`: a phone menu is navigated toward it (docs/outbound.md#phone-menus).

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
ANY_DIAL_PATH = "/admin/dial"  # either carrier: a SIP URI or an E.164 number
MAX_BODY_BYTES = 4096
MAX_RING_S = 600.0
# a SIP URI on one line with nothing that ends a header or the URI's angle brackets (no CR, LF, <, >, spaces)
_SIP_URI = re.compile(r"^sips?:[^\s<>\"]{1,250}$")
_E164 = re.compile(r"^\+[1-9]\d{6,14}$")
_USER = re.compile(r"^[A-Za-z0-9+._-]{1,64}$")  # a plain user part: no URI parameters or headers

NEEDS_TOKEN = (
    "placing calls needs the admin token even on a local demo server: start the server with "
    "$DUETASPAN_ADMIN_TOKEN set and send Authorization: Bearer <token>"
)

Dial = Callable[..., Awaitable[Any]]
Verdict = Callable[[str], Awaitable[Any]]  # call id -> its first answer verdict (or None), waited for


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def parse_dial_request(body: bytes, *, numbers: bool = False) -> tuple[str, str | None, float | None]:
    """`(to, from, ring_timeout_s)` from the request body; ValueError with the reason when it is not valid.
    `numbers`: `to` and `from` may be E.164 numbers too (`POST /admin/dial`, Twilio)."""
    try:
        data = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError):
        raise ValueError('the body must be JSON: {"to": "sip:USER@HOST"}') from None
    if not isinstance(data, dict):
        raise ValueError('the body must be a JSON object: {"to": "sip:USER@HOST"}')
    unknown = sorted(set(data) - {"to", "from", "ring_timeout_s", "detect", "goal"})
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}: only to, from, ring_timeout_s, detect and goal")
    if "detect" in data and not isinstance(data["detect"], bool):
        raise ValueError(f"detect {data['detect']!r}: true or false")
    goal = data.get("goal")
    if goal is not None and (not isinstance(goal, str) or not goal.strip() or len(goal) > 300
                             or any(ord(c) < 32 for c in goal)):  # fmt: skip
        raise ValueError(f"goal {str(goal)[:40]!r}: a phone menu's target in words, at most 300 characters")
    to, caller, ring = data.get("to"), data.get("from"), data.get("ring_timeout_s")
    if numbers and isinstance(to, str) and _E164.match(to):
        pass
    elif not isinstance(to, str) or not _SIP_URI.match(to):
        either = " or an E.164 number (+15551234567)" if numbers else ""
        raise ValueError(f"to {to!r}: a SIP URI such as sip:+15551234567@trunk.example{either} is needed")
    if caller is not None and (not isinstance(caller, str) or not _USER.match(caller)):
        raise ValueError(
            f"from {caller!r}: the user part of a SIP URI (letters, digits, + . _ -), 64 at most"
        )
    if ring is not None:
        if isinstance(ring, bool) or not isinstance(ring, int | float) or not 0 < ring <= MAX_RING_S:
            raise ValueError(f"ring_timeout_s {ring!r}: seconds, above 0 and at most {MAX_RING_S:.0f}")
        ring = float(ring)
    return to, caller, ring


def add_dial_route(
    app: FastAPI, dial: Dial | None, *, twilio: Dial | None = None, verdict: Verdict | None = None
) -> None:
    """`POST /admin/sip/dial` (SIP URIs; `dial` None: 409, no SIP here) and `POST /admin/dial` (a SIP URI
    through `dial`, an E.164 number through `twilio`; the one missing: 409) on `app` (admin role:
    `app.state.admin`)."""
    app.add_api_route(DIAL_PATH, _route(app, dial, None, DIAL_PATH, verdict), methods=["POST"],
                      include_in_schema=False)  # fmt: skip
    app.add_api_route(ANY_DIAL_PATH, _route(app, dial, twilio, ANY_DIAL_PATH, verdict), methods=["POST"],
                      include_in_schema=False)  # fmt: skip


def _route(
    app: FastAPI, sip: Dial | None, twilio: Dial | None, path: str, verdict: Verdict | None
) -> Callable[[Request], Awaitable[Response]]:
    numbers = path == ANY_DIAL_PATH

    async def dial_route(request: Request) -> Response:
        admin = app.state.admin
        refused = admin.refusal(request) if admin is not None else _error(403, "no admin role")
        if refused is None and getattr(admin, "token", None) is None:  # the local demo opens admin routes:
            refused = _error(403, NEEDS_TOKEN)  # not this one, placing calls costs money (toll fraud)
        if refused is not None:
            logger.warning("refused POST %s: HTTP %d", path, refused.status_code)
            return refused
        if sip is None and twilio is None:
            return _error(409, "this server does not place calls: start it with duetaspan serve --sip or --twilio")
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            return _error(413, f"the body is over {MAX_BODY_BYTES} bytes")
        try:
            to, caller, ring = parse_dial_request(body, numbers=numbers)
        except ValueError as exc:
            return _error(400, str(exc))
        is_sip = to.startswith(("sip:", "sips:"))
        dial = sip if is_sip else twilio
        if dial is None:
            flag = "--sip" if is_sip else "--twilio"
            return _error(409, f"this server does not serve {flag[2:]}: start it with duetaspan serve {flag}")
        if not is_sip and caller is not None and not _E164.match(caller):
            return _error(400, f"from {caller!r}: a Twilio call's caller ID is an E.164 number")
        data = json.loads(body or b"{}")
        detect, goal = data.get("detect"), data.get("goal")
        options = ({} if detect is None else {"detect": detect}) | ({} if goal is None else {"goal": goal})
        logger.info("POST %s: dialling %s", path, to)
        try:
            result = await dial(to, caller=caller, ring_timeout_s=ring, **options)
        except (DuetaspanError, RuntimeError) as exc:  # the endpoint is not running (yet, or any more)
            return _error(503, f"cannot dial: {exc}")
        except ValueError as exc:  # a URI aiosipua cannot take, a number Twilio's dialer refuses
            return _error(400, f"to {to!r}: {exc}")
        answer = result.summary()
        if detect and verdict is not None and result.outcome == "answered":  # `duetaspan call --detect`
            found = await verdict(result.call_id)
            answer["answer"] = found.as_json() if found is not None else None
        return JSONResponse(answer)

    return dial_route


__all__ = ["ANY_DIAL_PATH", "DIAL_PATH", "add_dial_route", "parse_dial_request"]
