"""What every public endpoint of the server shares against abuse: request bodies read with a limit (refused
with 413 as soon as the limit is passed, before anything is buffered) and log records scrubbed of the
credentials that travel in URLs (Twilio stream tokens in paths, WebRTC page tokens in query strings).

Example:
    >>> redact_secrets("GET /twilio/stream/abcDEF123_- 403, GET /?token=s3cret&x=1")
    'GET /twilio/stream/<token> 403, GET /?token=<token>&x=1'
    >>> # body = await read_body(request, limit=65_536)   # raises BodyTooLarge (status 413)
"""

from __future__ import annotations

import logging
import re

from starlette.requests import Request

from duetaspan.errors import DuetaspanError

# single-use credentials that appear in URLs, hence in access lines and error messages
_PATH_TOKEN = re.compile(r"(/twilio/stream/)[A-Za-z0-9_\-]+")
_QUERY_TOKEN = re.compile(r"([?&]token=)([^&\s\"'()<>\[\]]+)")
_PLACEHOLDER = frozenset(".…")  # `?token=...` in a message's own text is a placeholder, not a secret
TOKEN_MASK = "<token>"


class BodyTooLarge(DuetaspanError):
    """A request body over its endpoint's limit; answered 413 before the rest of it is read."""

    status = 413


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, read chunk by chunk; raises `BodyTooLarge` as soon as it passes `limit` bytes.

    A declared `Content-Length` over the limit is refused before a byte is read; a chunked body is refused
    at the first chunk that crosses it. Memory held is at most `limit` plus one chunk.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"body of {int(declared)} bytes declared, larger than the {limit}-byte limit")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise BodyTooLarge(f"body larger than the {limit}-byte limit (refused while streaming, unread)")
    return bytes(body)


def redact_secrets(text: str) -> str:
    """`text` with stream and page tokens replaced by `<token>`."""
    return _QUERY_TOKEN.sub(_mask_query, _PATH_TOKEN.sub(rf"\1{TOKEN_MASK}", text))


def _mask_query(match: re.Match[str]) -> str:
    value = match[2]
    return match[0] if set(value) <= _PLACEHOLDER else f"{match[1]}{TOKEN_MASK}"


class RedactSecrets(logging.Filter):
    """Scrubs tokens from a record's message (and from a traceback's text) before a handler writes it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: the handler reports it; nothing of ours to scrub
            return True
        redacted = redact_secrets(message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_secrets(record.exc_text)
        return True


def install_log_redaction(logger_names: tuple[str, ...] = ("uvicorn.access", "uvicorn.error")) -> None:
    """Put one `RedactSecrets` on every handler of the root logger and on the named loggers.

    A filter on a handler sees every record that handler writes, whichever library logged it (a filter on a
    logger sees only that logger's own records); the named loggers are covered too in case they were given
    handlers of their own with `propagate = False`. Handlers added later are not covered. Idempotent.
    """
    targets: list[logging.Filterer] = list(logging.getLogger().handlers)
    for name in logger_names:
        log = logging.getLogger(name)
        targets += [log, *log.handlers]
    for target in targets:
        if not any(isinstance(f, RedactSecrets) for f in target.filters):
            target.addFilter(RedactSecrets())
