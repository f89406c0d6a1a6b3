"""`duetaspan call sip:... --server URL`: ask a running `duetaspan serve --sip` to place a SIP call.

Relied-on contract (issue #24; keep it exactly):

    duetaspan call sip:+15551234567@trunk.example --server http://HOST:PORT [--from USER] [--timeout S]

A `sip:` (or `sips:`) URI in place of the E.164 number selects SIP. The command posts
`{"to": URI, "from": USER, "ring_timeout_s": S}` to `POST /admin/sip/dial` (`duetaspan.adapters.sip.admin`)
with `Authorization: Bearer $DUETASPAN_ADMIN_TOKEN` (the header only; without the variable nothing is sent,
which only a local-demo server accepts), waits for the outcome and prints it in one line:

    answered sip:7002@pbx.example: call 3f2a...@127.0.0.1 is on the agent
    busy sip:7002@pbx.example: 486 Busy Here

With `--detect` the call gets answer detection and a second line says who answered (docs/outbound.md):

    answer: human (0.70) at 2.22 s: a 1.4 s utterance, then 0.6 s of quiet

Exit status: 0 answered, 2 busy, 3 no-answer, 4 failed; 1 (with one `duetaspan call: error: ...` line on
stderr) when no server answers at `--server`, the admin token is refused (401/403), or the server does not
serve SIP (409).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from duetaspan.access import ADMIN_TOKEN_ENV
from duetaspan.adapters.sip.admin import DIAL_PATH
from duetaspan.errors import DuetaspanError

EXIT_CODES = {"answered": 0, "busy": 2, "no-answer": 3, "failed": 4}
HTTP_MARGIN_S = 30.0  # on top of the ring timeout: the server answers once the outcome is known


class DialRequestFailed(DuetaspanError):
    """The server did not take the dial request (unreachable, token refused, no SIP there)."""


def outcome_line(result: dict[str, Any]) -> str:
    """The one line printed for a dial's outcome."""
    outcome, to = result.get("outcome", "failed"), result.get("to", "?")
    status, reason = result.get("sip_status"), result.get("reason") or ""
    if outcome == "answered":
        return f"answered {to}: call {result.get('call_id', '?')} is on the agent"
    if status:
        return f"{outcome} {to}: {status} {reason}".rstrip()
    return f"{outcome} {to}: {reason}".rstrip(": ")


def verdict_line(answer: dict[str, Any] | None) -> str:
    """The line `--detect` prints after the outcome: who answered and when."""
    if not answer:
        return "answer: no verdict in time"
    beep = f", beep at {answer['beep_at_s']:.2f} s" if answer.get("beep_at_s") is not None else ""
    return (f"answer: {answer['verdict']} ({answer['confidence']:.2f}) at {answer['decided_at_s']:.2f} s{beep}: "
            f"{answer.get('reason', '')}").rstrip(": ")  # fmt: skip


async def run_sip_call(args: argparse.Namespace, path: str = DIAL_PATH) -> int:
    """POST the dial to `--server` (`path`: `/admin/sip/dial`, or `/admin/dial` for an E.164 number)."""
    import aiohttp

    server = (args.server or "").rstrip("/")
    if not server.startswith(("http://", "https://")):
        raise DialRequestFailed(
            f"--server {args.server!r}: the URL of a running `duetaspan serve --sip`, e.g. http://127.0.0.1:8080"
        )
    token = os.environ.get(ADMIN_TOKEN_ENV)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body: dict[str, Any] = {"to": args.to, "ring_timeout_s": args.timeout}
    if args.from_:
        body["from"] = args.from_
    if getattr(args, "detect", False):
        body["detect"] = True
    if getattr(args, "goal", None):
        body["goal"] = args.goal
    timeout = aiohttp.ClientTimeout(total=args.timeout + HTTP_MARGIN_S)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as client:
            async with client.post(server + path, json=body, headers=headers) as response:
                status, text = response.status, await response.text()
    except aiohttp.ClientConnectorError as exc:
        raise DialRequestFailed(f"no server at {server}: {exc.os_error.strerror or exc}") from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise DialRequestFailed(f"{server}{path}: {type(exc).__name__} {exc}".rstrip()) from None
    data = _json(text)
    message = str(data.get("error") or text.strip()[:200])
    if status == 401:
        raise DialRequestFailed(
            f"{server} refused the admin token (401): set ${ADMIN_TOKEN_ENV} to the server's admin token"
        )
    if status == 403:
        raise DialRequestFailed(f"{server} refused the dial (403): {message}")
    if status == 409:
        carrier = "SIP: start it with duetaspan serve --sip" if path == DIAL_PATH else message
        raise DialRequestFailed(f"{server} does not serve {carrier}")
    if status == 404:
        raise DialRequestFailed(f"{server} has no {path} (not a duetaspan server, or an older one)")
    if status != 200 or "outcome" not in data:
        raise DialRequestFailed(f"{server}{path} answered HTTP {status}: {message}")
    print(outcome_line(data), flush=True)
    if "answer" in data:
        print(verdict_line(data["answer"]), flush=True)
    return EXIT_CODES.get(str(data["outcome"]), 4)


def _json(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


__all__ = ["EXIT_CODES", "DialRequestFailed", "outcome_line", "run_sip_call", "verdict_line"]
