"""`TwilioSignatureMiddleware` in front of a real FastAPI app under uvicorn: a signed webhook (form body
passed on intact) and a signed stream upgrade get through; unsigned, forged, wrong-URL and non-POST requests
are refused (403 / 405, the upgrade before it is accepted) and logged; other paths pass untouched."""

from __future__ import annotations

import logging

import aiohttp
import pytest
from fastapi import FastAPI, Request, WebSocket
from twilio.request_validator import RequestValidator
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from duetaspan.adapters.twilio.guard import TwilioSignatureMiddleware
from tests.adapters.twilio.peer import AUTH_TOKEN, PUBLIC_URL, run_uvicorn

FORM = {"CallSid": "CA" + "1" * 32, "From": "+15550001111", "To": "+15552223333"}


def guarded_app() -> FastAPI:
    app = FastAPI()

    @app.post("/")
    async def webhook(request: Request) -> dict:
        return dict(await request.form())

    @app.get("/status")
    async def status() -> dict:
        return {"ok": True}

    @app.websocket("/ws")
    async def stream(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text("answered")
        await websocket.close()

    app.add_middleware(
        TwilioSignatureMiddleware, public_url=PUBLIC_URL, auth_token=AUTH_TOKEN, webhook_paths=["/"]
    )
    return app


def sign(url: str, params: dict[str, str]) -> str:
    return RequestValidator(AUTH_TOKEN).compute_signature(url, params)


async def test_signed_requests_pass_and_unsigned_ones_are_refused(caplog):
    async with run_uvicorn(guarded_app()) as base, aiohttp.ClientSession() as http:
        headers = {"X-Twilio-Signature": sign(PUBLIC_URL + "/", FORM)}
        async with http.post(base + "/", data=FORM, headers=headers) as resp:
            assert resp.status == 200 and await resp.json() == FORM  # the app read the form we checked
        with caplog.at_level(logging.WARNING, logger="duetaspan.twilio.guard"):
            for bad in (
                {},
                {"X-Twilio-Signature": "forged"},
                {"X-Twilio-Signature": sign(PUBLIC_URL + "/x", FORM)},
            ):
                async with http.post(base + "/", data=FORM, headers=bad) as resp:
                    assert resp.status == 403, bad
            tampered = FORM | {"From": "+15559999999"}  # signed for other parameters
            async with http.post(base + "/", data=tampered, headers=headers) as resp:
                assert resp.status == 403
            async with http.get(base + "/") as resp:
                assert resp.status == 405
        assert (
            caplog.text.count("refused Twilio webhook") == 4 and "missing X-Twilio-Signature" in caplog.text
        )
        async with http.get(base + "/status") as resp:  # not a Twilio path: untouched
            assert resp.status == 200

        ws = base.replace("http://", "ws://") + "/ws"
        signed = {"X-Twilio-Signature": sign("wss://agent.example.test/ws", {})}
        async with connect(ws, additional_headers=signed) as sock:
            assert await sock.recv() == "answered"
        for bad in ({}, {"X-Twilio-Signature": sign("wss://elsewhere.test/ws", {})}):
            with pytest.raises(InvalidStatus) as refused:
                async with connect(ws, additional_headers=bad):
                    pass
            assert refused.value.response.status_code == 403


def test_it_will_not_start_without_a_key_or_an_https_url():
    with pytest.raises(ValueError, match="auth_token"):
        TwilioSignatureMiddleware(guarded_app(), public_url=PUBLIC_URL, auth_token="")
    with pytest.raises(ValueError, match="https"):
        TwilioSignatureMiddleware(
            guarded_app(), public_url="http://agent.example.test", auth_token=AUTH_TOKEN
        )
