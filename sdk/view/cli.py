"""`duetaspan view CALL.json [-o call.html]`: the call viewer page of one recorded call (a relied-on form).

duetaspan view calls/CA123.json                 # writes calls/CA123.html next to it
duetaspan view calls/CA123.json -o call.html --audio link
"""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "view",
        help="render a recorded call as one self-contained HTML page (waveforms, words, <ret>s, spans)",
    )
    parser.add_argument("record", metavar="CALL.json", help="the call's record (<call id>.json, or .jsonl)")
    parser.add_argument("-o", "--output", metavar="HTML", help="the page to write (default: CALL.html)")
    parser.add_argument(
        "--audio",
        choices=("embed", "link", "none"),
        default="embed",
        help="embed the call's wav (Ogg/Opus) in the page (default), link to it, or leave it out",
    )
    parser.set_defaults(func=_view)


def _view(args: argparse.Namespace) -> int:
    from duetaspan.view.page import render_call

    out = render_call(args.record, args.output, audio=args.audio)
    print(f"call viewer: {out} ({out.stat().st_size / 1024:.0f} KB)")
    return 0
