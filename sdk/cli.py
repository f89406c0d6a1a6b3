"""The `duetaspan` command line: one sub-command per job, each defined beside the code it drives.

Each entry of `COMMANDS` names a module exposing `register(subparsers)`, which adds its sub-commands and sets
`func` on the parsed namespace. Modules are imported only when the command line is parsed, and a command line
that names a sub-command imports that sub-command's module alone: `duetaspan call ...` never pays for the
modules of `serve` or `detect`, and a missing optional dependency only affects the command that needs it.

Example:
    $ duetaspan --version
    $ duetaspan infer --model tiny-random --input-wav in.wav --output-wav out.wav --output-json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import logging
import sys
from collections.abc import Sequence

from duetaspan import __version__
from duetaspan.errors import DuetaspanError
from duetaspan.logs import bridge_logging

# module path -> the sub-commands it registers (kept in the order `--help` lists them)
COMMANDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("duetaspan.model.infer", ("infer",)),
    ("duetaspan.check_cli", ("check",)),
    ("duetaspan.tools.cli", ("tools",)),
    ("duetaspan.serve_cli", ("serve",)),
    ("duetaspan.adapters.twilio.call_cli", ("call",)),
    ("duetaspan.outbound.cli", ("detect",)),
    ("duetaspan.eval.cli", ("eval",)),
    ("duetaspan.view.cli", ("view",)),
    ("duetaspan.outbound.campaign_cli", ("campaign",)),
    ("duetaspan.webhooks.cli", ("webhooks", "records")),
)

# commands whose `duetaspan.*` INFO lines show without -v (a server says when it is ready at INFO)
INFO_COMMANDS = frozenset({"serve"})


def command_of(argv: Sequence[str]) -> str | None:
    """The sub-command `argv` names (its first word that is not an option of `duetaspan` itself), if any."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or (`command` given and known) one with only that sub-command: a command then imports
    only its own module, never the others' dependencies (`duetaspan call` starts in a fraction of the time)."""
    modules = [module for module, names in COMMANDS if command in names] or [module for module, _ in COMMANDS]
    parser = argparse.ArgumentParser(
        prog="duetaspan",
        description="Phone agents on the DuetaSpan full-duplex speech model with Context Spans.",
    )
    parser.add_argument("--version", action="version", version=f"duetaspan {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in modules:
        importlib.import_module(module_name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(command_of(argv))
    args = parser.parse_args(argv)
    # one stream: Pipecat's loguru records join the SDK's `logging` ones, each with its call id; taken out
    # again on return, so `main()` called in-process (tests, embedding) never stacks handlers or sinks
    bridge = bridge_logging(
        logging.WARNING - 10 * min(args.verbose, 2),
        fmt="%(asctime)s %(levelname)s [%(call_id)s] %(name)s: %(message)s",
    )
    # a server's own INFO lines (the ready line, the page URL) show by default; Pipecat's stay at WARNING
    sdk_logger, sdk_level = logging.getLogger("duetaspan"), logging.getLogger("duetaspan").level
    if args.verbose == 0 and args.command in INFO_COMMANDS:
        sdk_logger.setLevel(logging.INFO)
    try:
        return _run(parser, args)
    finally:
        sdk_logger.setLevel(sdk_level)
        bridge.close()


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 0
    try:
        result = func(args)
        if inspect.isawaitable(result):
            result = asyncio.run(result)
    except DuetaspanError as exc:  # our errors carry an actionable message: say it, without a traceback
        logging.getLogger("duetaspan").debug("command failed", exc_info=True)
        print(f"duetaspan {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C is how a server is stopped: no traceback, the shell's usual status
        print(f"duetaspan {args.command}: stopped", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
