"""`duetaspan.http_guard`: the log filter that keeps stream and page tokens out of every log record of the
process (whichever library writes it), and the body reader every POST endpoint uses."""

from __future__ import annotations

import io
import logging

import aiohttp
from fastapi import FastAPI, Request, Response

from duetaspan.http_guard import BodyTooLarge, RedactSecrets, install_log_redaction, read_body, redact_secrets
from tests.adapters.twilio.peer import run_uvicorn

TOKEN = "Zq9_very-secret-stream-token-0123456789"


def test_redact_secrets_masks_path_and_query_tokens():
    text = f'"WebSocket /twilio/stream/{TOKEN}" 403; GET /?token={TOKEN}&x=1; GET /webrtc/config?a=1&token={TOKEN}'
    assert TOKEN not in redact_secrets(text)
    assert redact_secrets(text).count("<token>") == 3
    assert redact_secrets("nothing to hide /twilio/voice") == "nothing to hide /twilio/voice"


def test_placeholders_and_the_text_around_a_token_are_kept():
    for text in (
        "open the URL printed at start (it ends in /?token=...)",
        "the page URL (/?token=…) is printed",
    ):
        assert redact_secrets(text) == text
    assert redact_secrets(f"(open /?token={TOKEN}) now") == "(open /?token=<token>) now"
    assert redact_secrets(f"[/?token={TOKEN}]") == "[/?token=<token>]"


def test_every_logger_is_redacted_through_the_root_handlers():
    """One filter on the root logger's handlers covers records of any library that propagate there, with
    %-args, and tracebacks; installing twice adds nothing."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    some_lib = logging.getLogger("some.library.nobody.configured")
    old_level = some_lib.level
    some_lib.setLevel(logging.DEBUG)
    try:
        install_log_redaction()
        install_log_redaction()
        assert sum(isinstance(f, RedactSecrets) for f in handler.filters) == 1
        some_lib.debug("GET %s", f"/twilio/stream/{TOKEN}")
        some_lib.warning(f"page /?token={TOKEN}")
        try:
            raise ValueError(f"bad URL wss://a.example/twilio/stream/{TOKEN}")
        except ValueError:
            some_lib.exception("failed")
    finally:
        root.removeHandler(handler)
        some_lib.setLevel(old_level)
    out = stream.getvalue()
    assert "some.library.nobody.configured GET /twilio/stream/<token>" in out
    assert "ValueError: bad URL wss://a.example/twilio/stream/<token>" in out
    assert TOKEN not in out


async def test_read_body_refuses_a_declared_or_streamed_body_over_the_limit():
    app = FastAPI()
    seen: list[int] = []

    @app.post("/x")
    async def endpoint(request: Request) -> Response:
        try:
            body = await read_body(request, 1000)
        except BodyTooLarge as exc:
            return Response(str(exc), status_code=exc.status)
        seen.append(len(body))
        return Response("ok")

    async def chunks(n: int):
        for _ in range(n):
            yield b"x" * 400

    async with run_uvicorn(app) as base, aiohttp.ClientSession() as http:
        for data, status, text in [
            (b"x" * 1000, 200, "ok"),
            (b"x" * 1001, 413, "1001 bytes declared"),
            (chunks(2), 200, "ok"),
            (chunks(3), 413, "while streaming"),
        ]:
            async with http.post(base + "/x", data=data) as resp:
                assert (resp.status, text in await resp.text()) == (status, True)
    assert seen == [1000, 800]
