"""Who may do what on a server: each role has its own bearer token, sent in the `Authorization` header only
(never a query string, which lands in proxy logs, browser history and `Referer`s).

| role | token | may |
|---|---|---|
| page | `DUETASPAN_WEBRTC_TOKEN` (else random, printed in the page URL) | open the page and place a browser call |
| admin | `DUETASPAN_ADMIN_TOKEN` | view call records (`/webrtc/calls`), run tools (`/webrtc/tools`), `/admin/*` |
| metrics | `DUETASPAN_METRICS_TOKEN` (else `[server] metrics_token`) | scrape `GET /metrics` |

A missing or wrong token is 401. A role whose token is not set is refused (403, saying which variable to
set), except on the first-run demo:
a server bound to loopback AND with no public URL (`local_demo`). Where a request comes from proves nothing
(a tunnel such as ngrok delivers the whole internet from 127.0.0.1), so the client address is never looked at.

Example:
    >>> admin = BearerRole("admin", token="a-long-admin-token-123", env=ADMIN_TOKEN_ENV, open_without_token=False)
    >>> admin.check("Bearer a-long-admin-token-123") is None
    True
    >>> admin.check(None).status
    401
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from fastapi import Request, Response
from fastapi.responses import JSONResponse

ADMIN_TOKEN_ENV = "DUETASPAN_ADMIN_TOKEN"
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def local_demo(host: str, public_url: str | None) -> bool:
    """The first-run demo: bound to loopback and reachable at no public URL. Only there may a role go without
    its token."""
    return host in LOOPBACK and not public_url


def admin_token(env: Mapping[str, str] | None = None) -> str | None:
    """The admin role's token, from `$DUETASPAN_ADMIN_TOKEN` (never from agent.toml)."""
    return (os.environ if env is None else env).get(ADMIN_TOKEN_ENV) or None


@dataclass(frozen=True)
class AccessDenied:
    """A refused request: `status` (401 no or a wrong token, 403 the role is off) and why."""

    status: int
    message: str
    realm: str

    def response(self) -> Response:
        headers = {"WWW-Authenticate": f'Bearer realm="{self.realm}"'} if self.status == 401 else None
        return JSONResponse({"error": self.message}, status_code=self.status, headers=headers)


@dataclass(frozen=True)
class BearerRole:
    """One role's token check. `token` None: the role is open when `open_without_token`, else refused."""

    name: str
    token: str | None = field(repr=False)
    env: str
    open_without_token: bool = False

    @property
    def open(self) -> bool:
        return self.token is None and self.open_without_token

    def check(self, authorization: str | None) -> AccessDenied | None:
        """None when the `Authorization` header grants this role, else why not."""
        if self.token is None:
            if self.open_without_token:
                return None
            return AccessDenied(
                403,
                f"the {self.name} role is off: set ${self.env} and send Authorization: Bearer <token> "
                "(only a server bound to loopback with no public URL goes without it)",
                self.name,
            )
        scheme, _, presented = (authorization or "").partition(" ")
        presented = presented.strip()
        if scheme.lower() != "bearer" or not presented:
            return AccessDenied(401, f"{self.name} routes need Authorization: Bearer <{self.env}>", self.name)
        if not hmac.compare_digest(presented.encode(), self.token.encode()):
            return AccessDenied(401, f"the {self.name} token does not match", self.name)
        return None

    def refusal(self, request: Request) -> Response | None:
        """None when `request` may go on, else the answer to send."""
        denied = self.check(request.headers.get("authorization"))
        return denied.response() if denied is not None else None


__all__ = ["ADMIN_TOKEN_ENV", "LOOPBACK", "AccessDenied", "BearerRole", "admin_token", "local_demo"]
