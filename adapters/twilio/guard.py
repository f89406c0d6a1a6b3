"""`TwilioSignatureMiddleware`: Twilio's request signatures checked in front of any ASGI app (FastAPI,
Starlette, Pipecat's development runner), for bots that do not use `duetaspan serve`'s own Twilio routes.

The voice webhook (an HTTP `POST` with a form) must carry `X-Twilio-Signature` over the public `https://` URL
and the form's parameters; the Media Stream's WebSocket upgrade must carry it over the public `wss://` URL,
with no parameters (`duetaspan.adapters.twilio.security.check_signature`: the Auth Token or a webhook
SharedKey, with and without `:443`, constant-time). A request that fails is answered 403 (the upgrade is
refused before it is accepted) and logged; nothing behind the middleware sees it. Paths not listed pass
through untouched (health checks, your own routes).

The public URL is pinned (`public_url`, e.g. the tunnel's `https://abc123.ngrok.app`): the URL a request is
checked against never comes from its own `Host` header.

Example (Pipecat's runner: its module-level `app` takes middleware before `main()`):
    >>> from pipecat.runner.run import app, main                              # doctest: +SKIP
    >>> app.add_middleware(TwilioSignatureMiddleware, public_url="https://abc123.ngrok.app",
    ...                    auth_token=os.environ["TWILIO_AUTH_TOKEN"], webhook_paths=["/"],
    ...                    stream_paths=["/ws", "/ws/*"])                      # doctest: +SKIP
    >>> main()                                                                 # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from duetaspan.adapters.twilio.errors import SignatureInvalid
from duetaspan.adapters.twilio.security import SETTINGS_HEADER, SIGNATURE_HEADER, SigningKeys, check_signature

logger = logging.getLogger("duetaspan.twilio.guard")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_FORM_BYTES = 64 * 1024  # a Twilio webhook form is a few hundred bytes


def _matches(path: str, patterns: Iterable[str]) -> bool:
    """`/ws` matches itself; `/ws/*` matches anything below `/ws/`."""
    for pattern in patterns:
        if pattern.endswith("/*") and path.startswith(pattern[:-1]):
            return True
        if path == pattern:
            return True
    return False


class TwilioSignatureMiddleware:
    """Refuse unsigned or forged Twilio requests on the webhook and stream paths (see the module docstring).

    Args:
        app: the ASGI app behind it.
        public_url: the `https://` origin Twilio reaches the app at (a path prefix is allowed).
        auth_token: the account's Auth Token (Twilio signs with it by default).
        webhook_paths: HTTP paths of voice/status webhooks (`POST`, form-encoded); other methods are refused.
        stream_paths: WebSocket paths of Media Streams; `/prefix/*` covers token segments.
        shared_key_id, shared_key_secret: a webhook SharedKey, when the account signs with one.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        public_url: str,
        auth_token: str,
        webhook_paths: Iterable[str] = ("/",),
        stream_paths: Iterable[str] = ("/ws", "/ws/*"),
        shared_key_id: str | None = None,
        shared_key_secret: str | None = None,
    ) -> None:
        parts = urlsplit(public_url)
        if parts.scheme != "https" or not parts.hostname:
            raise ValueError(f"public_url must be an https:// URL, got {public_url!r}")
        if not auth_token:
            raise ValueError("auth_token is empty: Twilio's signatures cannot be checked without it")
        self.app = app
        self.origin = f"{parts.netloc}{parts.path.rstrip('/')}"
        self.keys = SigningKeys(auth_token, shared_key_id, shared_key_secret)
        self.webhook_paths = tuple(webhook_paths)
        self.stream_paths = tuple(stream_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind, path = scope.get("type"), scope.get("path", "")
        if kind == "http" and _matches(path, self.webhook_paths):
            await self._webhook(scope, receive, send)
        elif kind == "websocket" and _matches(path, self.stream_paths):
            await self._stream(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    def _url(self, scheme: str, scope: Scope) -> str:
        query = scope.get("query_string", b"").decode("latin-1")
        return f"{scheme}://{self.origin}{scope.get('path', '')}" + (f"?{query}" if query else "")

    async def _webhook(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("method") != "POST":
            await _refuse_http(send, 405, "Twilio webhooks are POSTs")
            return
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > MAX_FORM_BYTES:
                await _refuse_http(send, 413, "webhook body too large")
                return
        params = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        url = self._url("https", scope)
        try:
            check_signature(self.keys, url, params, *_signature_headers(scope))
        except SignatureInvalid as exc:
            logger.warning("refused Twilio webhook %s from %s: %s", scope.get("path"), _peer(scope), exc)
            await _refuse_http(send, 403, "invalid Twilio signature")
            return
        replayed = False

        async def replay() -> Message:  # the app reads the body we consumed
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        url = self._url("wss", scope)
        try:
            check_signature(self.keys, url, {}, *_signature_headers(scope), shown_url=url.split("?")[0])
        except SignatureInvalid as exc:
            logger.warning("refused Twilio stream %s from %s: %s", scope.get("path"), _peer(scope), exc)
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008})  # before accept: HTTP 403
            return
        await self.app(scope, receive, send)


def _signature_headers(scope: Scope) -> tuple[str | None, str | None]:
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    return headers.get(SIGNATURE_HEADER.lower()), headers.get(SETTINGS_HEADER.lower())


def _peer(scope: Scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "?"


async def _refuse_http(send: Send, status: int, text: str) -> None:
    await send(
        {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"text/plain")]}
    )
    await send({"type": "http.response.body", "body": text.encode()})


__all__ = ["TwilioSignatureMiddleware"]
