"""`duetaspan call`: place an outbound call that lands on a running `duetaspan serve --twilio` agent.

Relied-on contract (issue #6; keep these flags exactly):

    duetaspan call +15551234567 --from +15557654321 --public-url https://PUBLIC [--config agent.toml]
    duetaspan call +15551234567 --config agent.toml      (--from: [twilio] phone_number, --public-url:
                                                          [twilio] public_url; flags override the file)
    duetaspan call sip:+15551234567@trunk.example --server http://HOST:PORT
                                                         (a SIP URI selects SIP: a running `serve --sip`
                                                          dials it; `duetaspan.adapters.sip.call_cli`)
    duetaspan call +15551234567 --server http://HOST:PORT [--detect]
                                                         (a running `serve --twilio` places it through
                                                          POST /admin/dial; --detect prints who answered)

It asks Twilio's REST API (`calls.create`) to dial the number with `url=PUBLIC/twilio/voice`, so when the
callee answers Twilio fetches the same signed webhook an inbound call does and the call is connected to the
agent's stream. Credentials: `TWILIO_ACCOUNT_SID` / `TWILIO_AUTH_TOKEN`, or the variables `[twilio]` names
(`TWILIO_API_BASE_URL` overrides the REST root). Prints the new call's SID.

Example:
    duetaspan call +15551234567 --from +15557654321 --public-url https://agent.example.com
    (prints CA0123456789abcdef0123456789abcdef)
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from duetaspan.errors import ConfigError

E164 = re.compile(r"^\+[1-9]\d{6,14}$")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "call",
        help="place an outbound call to a number (Twilio) or a SIP URI (a running serve --sip dials it)",
        description="Place an outbound call through Twilio that lands on `duetaspan serve --twilio`, or, given "
        "a sip: URI and --server, ask a running `duetaspan serve --sip` to dial it "
        "(with Authorization: Bearer $DUETASPAN_ADMIN_TOKEN).",
    )
    p.add_argument("to", help="number to call, E.164 (e.g. +15551234567), or a SIP URI (sip:USER@HOST)")
    p.add_argument(
        "--from",
        dest="from_",
        help="your Twilio number, E.164 (default: [twilio] phone_number); for SIP the caller's user part "
        "(default: [sip] user)",
    )
    p.add_argument(
        "--server", help="SIP: the URL of the running `duetaspan serve --sip` that dials (http://HOST:PORT)"
    )
    p.add_argument(
        "--public-url", help="the public https URL of the serving agent (default: [twilio] public_url)"
    )
    p.add_argument(
        "--config",
        type=Path,
        help="agent.toml of the serving agent (validated before dialling; its [twilio] fills --from, "
        "--public-url and the credential variables)",
    )
    p.add_argument("--timeout", type=int, default=30, help="seconds to let it ring (default 30)")
    p.add_argument("--detect", action="store_true",
                   help="with --server: answer detection on the call; prints who answered (docs/outbound.md)")  # fmt: skip
    p.add_argument("--goal", help="with --server: a phone menu is navigated toward this (\"reach billing\"; "
                   "docs/outbound.md#phone-menus)")  # fmt: skip
    p.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    if args.to.startswith(("sip:", "sips:")):
        if not args.server:
            raise ConfigError(
                f"{args.to}: a SIP call is placed by a running `duetaspan serve --sip`: pass --server http://HOST:PORT"
            )
        if args.public_url or args.config is not None:
            raise ConfigError(
                "--public-url and --config are for Twilio calls; a SIP call needs only --server"
            )
        from duetaspan.adapters.sip.call_cli import run_sip_call

        return await run_sip_call(args)
    if args.server:  # the running server places it through Twilio (POST /admin/dial)
        if args.public_url or args.config is not None:
            raise ConfigError("--server places the call from the running server: --public-url and --config are not used")
        if not E164.match(args.to):
            raise ConfigError(f"number to call {args.to!r} is not an E.164 phone number like +15551234567")
        from duetaspan.adapters.sip.admin import ANY_DIAL_PATH
        from duetaspan.adapters.sip.call_cli import run_sip_call

        return await run_sip_call(args, ANY_DIAL_PATH)
    if getattr(args, "goal", None):
        raise ConfigError("--goal needs --server: the running server places the call and navigates its menus")
    if args.detect:
        raise ConfigError("--detect needs --server: the running server places the call and detects who answered")
    from duetaspan.adapters.twilio.rest import TwilioRest
    from duetaspan.config import AgentConfig
    from duetaspan.serving import twilio_settings

    config = AgentConfig()
    if args.config is not None:
        if not args.config.is_file():
            raise ConfigError(f"--config {args.config}: no such file")
        config = AgentConfig.load(args.config)  # a broken config would only fail once the callee answers
    from_number = args.from_ or config.twilio.phone_number
    if not from_number:
        raise ConfigError(
            "--from: your Twilio number is required (or set [twilio] phone_number in agent.toml)"
        )
    for flag, number in (("number to call", args.to), ("--from", from_number)):
        if not E164.match(number):
            raise ConfigError(f"{flag} {number!r} is not an E.164 phone number like +15551234567")
    settings = twilio_settings(config, args.public_url)
    async with TwilioRest(settings.credentials) as rest:
        sid = await rest.place_call(
            args.to,
            from_number,
            settings.voice_url,
            status_callback=settings.status_url,
            timeout_s=args.timeout,
        )
    print(sid)
    return 0
