"""What `--webrtc` adds to `duetaspan serve` / `agent.serve(webrtc=True)`: the flags, the service built from
the agent's `[webrtc]` config, and the page URL announced at start.

The page token is random per start unless `DUETASPAN_WEBRTC_TOKEN` is set (never on the command line, where
other users could read it in the process list).

Example (prints `WebRTC page: http://127.0.0.1:8080/?token=...` once the model is loaded):
    duetaspan serve --webrtc --model tiny-random --port 8080
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

if TYPE_CHECKING:  # the service pulls in Pipecat and aiortc: only when --webrtc is used, not for `--help`
    from duetaspan.adapters.webrtc.service import WebRTCService

logger = logging.getLogger("duetaspan.webrtc")

TOKEN_ENV = "DUETASPAN_WEBRTC_TOKEN"
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `--webrtc` flags of `duetaspan serve`."""
    parser.add_argument(
        "--webrtc",
        action="store_true",
        help=f"serve the browser page and WebRTC calls (GET /?token=..., token from ${TOKEN_ENV} or random)",
    )
    parser.add_argument(
        "--allow-force-ret",
        action="store_true",
        help="let the browser page force a <ret> (tries the tools without a model that asks by itself)",
    )


def build_service(agent: Any, *, allow_force_ret: bool = False, admin: Any = None) -> WebRTCService:
    """The WebRTC service for `agent` (ICE servers from its `[webrtc]` config section, the page token from
    `$DUETASPAN_WEBRTC_TOKEN` or random)."""
    from duetaspan.adapters.webrtc.service import WebRTCService, WebRTCSettings

    token = os.environ.get(TOKEN_ENV) or None
    settings = WebRTCSettings(
        token=SecretStr(token) if token else None,
        ice_servers=list(agent.config.webrtc.ice_servers),
        allow_force_ret=allow_force_ret,
    )
    return WebRTCService(settings, admin=admin)


def announce(service: WebRTCService, host: str, port: int) -> str:
    """Print the page URL (stdout, so scripts can read it) and return it."""
    shown = "localhost" if host in ("0.0.0.0", "::", "") else host
    url = service.page_url(f"http://{shown}:{port}")
    print(f"WebRTC page: {url}", flush=True)
    if shown not in _LOOPBACK:
        logger.warning(
            "browsers only open the microphone on https:// or localhost pages: put %s behind TLS "
            "(a reverse proxy) or tunnel it to localhost",
            shown,
        )
    return url
