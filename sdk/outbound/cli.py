"""`duetaspan campaign`: outbound campaigns on a running server (`--server URL`, the admin token from
`$DUETASPAN_ADMIN_TOKEN`, sent in the `Authorization` header only).

    duetaspan campaign start contacts.csv --server URL [--name N] [--max-concurrent 4] [--calls-per-minute 30]
        [--window 09:00-20:00] [--days mon,tue,...] [--max-attempts 3] [--detach]
    duetaspan campaign status|pause|resume|cancel NAME --server URL
    duetaspan campaign export NAME --server URL -o FILE.csv
    duetaspan campaign dnc add|remove NUMBER... --server URL
    duetaspan campaign dnc import FILE --server URL        (one number a line, or a CSV with a `to` column)

`start` uploads the list and shows a live progress bar with counts per outcome until the campaign is done
(Ctrl-C leaves it running on the server; `--detach` returns at once); `status` prints the same once.
Exit status: 0, 1 for an error (no server, a refused token, a bad list: one line saying so).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import os
import sys
from pathlib import Path
from typing import Any

from duetaspan.errors import DuetaspanError
from duetaspan.outbound.status import status_line

TOKEN_ENV = "DUETASPAN_ADMIN_TOKEN"


class CampaignCliError(DuetaspanError):
    """What the server or the command line refused, in one line."""


async def _request(args: argparse.Namespace, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    import aiohttp

    token = os.environ.get(TOKEN_ENV)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = args.server.rstrip("/") + path
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client:
            async with client.request(method, url, json=body, headers=headers) as r:
                text = await r.text()
                data: Any = text
                if r.content_type == "application/json":
                    data = await r.json()
                if r.status >= 400:
                    reason = data.get("error", text) if isinstance(data, dict) else text
                    hint = f" (set ${TOKEN_ENV})" if r.status in (401, 403) and not token else ""
                    raise CampaignCliError(f"{method} {path}: HTTP {r.status}: {reason}{hint}")
                return r.status, data
    except aiohttp.ClientConnectorError as exc:
        raise CampaignCliError(f"no server at {args.server}: {exc.os_error or exc}") from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise CampaignCliError(f"{args.server}: {exc or type(exc).__name__}") from None


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("max_concurrent", "calls_per_minute", "window", "max_attempts", "ring_timeout_s"):
        value = getattr(args, key, None)
        if value is not None:
            out[key] = value
    if getattr(args, "days", None):
        out["days"] = [d.strip() for d in args.days.split(",") if d.strip()]
    return out


async def _progress(args: argparse.Namespace, status: dict[str, Any]) -> dict[str, Any]:
    from tqdm import tqdm

    name = status["name"]
    bar = tqdm(total=status["total"], desc=name, unit="number", file=sys.stderr, dynamic_ncols=True)
    try:
        while True:
            counts = status["counts"]
            bar.n = status["done"]
            bar.set_postfix({k: v for k, v in sorted(counts.items())}, refresh=True)
            if status["state"] in ("done", "cancelled") or (status["state"] == "paused" and args.exit_paused):
                return status
            await asyncio.sleep(args.poll)
            _, status = await _request(args, "GET", f"/admin/campaigns/{name}")
    finally:
        bar.close()


async def start(args: argparse.Namespace) -> int:
    path = Path(args.contacts)
    try:
        text = await asyncio.to_thread(path.read_text, encoding="utf-8")
    except OSError as exc:
        raise CampaignCliError(f"{path}: cannot read: {exc.strerror or exc}") from None
    body = {"csv": text, "settings": _settings(args), **({"name": args.name} if args.name else {})}
    _, status = await _request(args, "POST", "/admin/campaigns", body)
    print(f"campaign {status['name']} started: {status['total']} numbers", flush=True)
    if not args.detach:
        try:
            status = await _progress(args, status)
        except KeyboardInterrupt:
            pass
    print(status_line(status))
    return 0


async def status(args: argparse.Namespace) -> int:
    _, data = await _request(args, "GET", f"/admin/campaigns/{args.name}")
    print(status_line(data))
    return 0


async def act(args: argparse.Namespace) -> int:
    _, data = await _request(args, "POST", f"/admin/campaigns/{args.name}/{args.action}")
    print(status_line(data))
    return 0


async def export(args: argparse.Namespace) -> int:
    _, text = await _request(args, "GET", f"/admin/campaigns/{args.name}/export")
    if args.output in (None, "-"):
        sys.stdout.write(text)
    else:
        await asyncio.to_thread(Path(args.output).write_text, text, encoding="utf-8")
        print(f"wrote {args.output}: {max(0, text.count(chr(10)) - 1)} numbers")
    return 0


def _numbers_in(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8").lstrip("\ufeff")
    first = text.splitlines()[0] if text.strip() else ""
    if "to" in [c.strip() for c in first.split(",")]:
        return [r["to"].strip() for r in csv.DictReader(io.StringIO(text)) if (r.get("to") or "").strip()]
    return [line.split(",")[0].strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


async def dnc(args: argparse.Namespace) -> int:
    if args.dnc_action == "import":
        try:
            numbers = await asyncio.to_thread(_numbers_in, Path(args.numbers[0]))
        except OSError as exc:
            raise CampaignCliError(f"{args.numbers[0]}: cannot read: {exc.strerror or exc}") from None
        body = {"add": numbers, "source": "import"}
    else:
        body = {"add" if args.dnc_action == "add" else "remove": list(args.numbers), "source": "cli"}
    _, data = await _request(args, "POST", "/admin/dnc", body)
    print(f"do-not-call: {data['added']} added, {data['removed']} removed")
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("campaign", help="outbound campaigns on a running server",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="campaign_command", metavar="ACTION", required=True)

    def server(p: argparse.ArgumentParser) -> None:
        p.add_argument("--server", required=True, help="the server's URL, e.g. http://127.0.0.1:8080")

    p = sub.add_parser("start", help="upload a contact list and dial it")
    p.add_argument("contacts", help="CSV: to (E.164 or sip: URI), optional name, timezone, any variables")
    server(p)
    p.add_argument("--name", help="the campaign's name (default: campaign-DATE-TIME)")
    p.add_argument("--max-concurrent", type=int)
    p.add_argument("--calls-per-minute", type=float)
    p.add_argument("--window", help="callee-local hours, HH:MM-HH:MM")
    p.add_argument("--days", help="callee-local weekdays, e.g. mon,tue,wed,thu,fri")
    p.add_argument("--max-attempts", type=int)
    p.add_argument("--ring-timeout-s", type=float)
    p.add_argument("--detach", action="store_true", help="return once uploaded (no progress bar)")
    p.add_argument("--exit-paused", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--poll", type=float, default=1.0, help=argparse.SUPPRESS)
    p.set_defaults(func=start)
    for action in ("status", "pause", "resume", "cancel"):
        p = sub.add_parser(action, help=f"{action} a campaign")
        p.add_argument("name")
        server(p)
        p.set_defaults(func=status if action == "status" else act, action=action)
    p = sub.add_parser("export", help="one CSV row per number: to, attempts, outcome, last_attempt_at")
    p.add_argument("name")
    server(p)
    p.add_argument("-o", "--output", help="the CSV file (default: standard output)")
    p.set_defaults(func=export)
    p = sub.add_parser("dnc", help="the do-not-call list: add, remove, import")
    p.add_argument("dnc_action", choices=["add", "remove", "import"])
    p.add_argument("numbers", nargs="+", help="numbers (E.164 or sip: URIs), or one file for import")
    server(p)
    p.set_defaults(func=dnc)


__all__ = ["register"]
