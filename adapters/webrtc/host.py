"""What the page's route groups (`ToolConsole`, `RecentCalls`) use of the `WebRTCService` that mounts them.

A protocol, so that those modules do not import the service, which imports them to mount their routes.

Example:
    >>> # ToolConsole(service), RecentCalls(service): any `PageHost`, in practice the `WebRTCService`
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fastapi import Request, Response

    from duetaspan.adapters.webrtc.security import PageAccessError


class PageHost(Protocol):
    """The service side the routes need: its agent, its settings, its live calls and its token check."""

    agent: Any  # the agent whose `registry` and `record_dir` the routes use (None: no agent)
    settings: Any  # the service's `WebRTCSettings` (`max_tool_body_bytes`)
    calls: dict[str, Any]  # live page calls by call id

    def _check(self, request: Request) -> PageAccessError | None: ...  # the page token

    def admin_refusal(self, request: Request) -> Response | None: ...  # the admin role


__all__ = ["PageHost"]
