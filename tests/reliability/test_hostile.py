"""Hostile and malformed input the Twilio tests (tests/adapters/twilio/test_service.py) do not cover yet, and
the WebRTC offer endpoint. Every case gets its close code or HTTP status and a log line saying why, and the
server goes on serving: a genuine call running beside the hostile one is untouched, `/health` still answers.

Already covered there (not repeated): malformed JSON, media before `start`, wrong and empty
payload sizes, invalid base64, oversized messages (our 16 KiB limit), out-of-order sequence numbers, a `start`
for another call, binary frames, no `start` in time, replayed/unknown/expired tokens, unsigned or wrongly
signed webhooks and upgrades, unsigned status callbacks.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from types import SimpleNamespace
from urllib.parse import urlencode

import aiohttp
import pytest
from websockets.exceptions import InvalidStatus

from duetaspan.adapters.twilio.stream import TwilioCall
from duetaspan.server import create_app, mount, serve
from tests.adapters.twilio.peer import (
    ACCOUNT_SID,
    PUBLIC_URL,
    TwilioPeer,
    renumber,
    run_uvicorn,
    serve_twilio,
    twilio_app,
    twilio_service,
)
from tests.support import free_port, load_twilio_stream

FIXTURE = "time_tokyo"
SID = "MZ000000000000000000000000000000"  # the fixture's streamSid


async def echo(call: TwilioCall) -> None:
    async for pcm in call.audio():
        call.send_audio(pcm)


@contextlib.asynccontextmanager
async def server(ws_max_size: int | None = None):
    service = twilio_service(echo)
    async with serve_twilio(service) as peer:
        yield peer, service


def start(call_sid: str, seq: int = 1, **media_format: object) -> dict:
    msg = json.loads(json.dumps(renumber(load_twilio_stream(FIXTURE), call_sid)[1]))
    msg["sequenceNumber"] = str(seq)
    msg["start"]["mediaFormat"].update(media_format)
    return msg


def media(seq: int | str, *, track: str = "inbound", stream_sid: str = SID) -> dict:
    payload = base64.b64encode(b"\xff" * 160).decode()
    return {
        "event": "media",
        "sequenceNumber": str(seq),
        "streamSid": stream_sid,
        "media": {
            "track": track,
            "chunk": str(seq),
            "timestamp": "20",
            "payload": payload,
        },
    }


def dtmf(seq: int, digit: str) -> dict:
    return {
        "event": "dtmf",
        "sequenceNumber": str(seq),
        "streamSid": SID,
        "dtmf": {"track": "inbound_track", "digit": digit},
    }


STREAM_CASES = {
    "repeated_sequence_number": (
        [start, lambda: media(2), lambda: media(2)],
        1002,
        "sequence number 2 after 2",
    ),
    "second_start": ([start, lambda: media(2), lambda: start("CA-bad", 3)], 1002, "second `start`"),
    "other_stream_sid": (
        [start, lambda: media(2, stream_sid="MZ" + "9" * 32)],
        1008,
        "message for stream MZ999",
    ),
    "outbound_track": ([start, lambda: media(2, track="outbound")], 1007, "media on track 'outbound'"),
    "invalid_dtmf_digit": ([start, lambda: dtmf(2, "x")], 1007, "dtmf digit 'x'"),
    "dtmf_string": ([start, lambda: dtmf(2, "1234")], 1007, "dtmf digit '1234'"),
    "wrong_media_format": (
        [lambda: start("CA-bad", encoding="audio/l16", sampleRate=16000)],
        1007,
        "media format audio/l16 16000 Hz",
    ),
    "non_numeric_sequence": ([start, lambda: media("two")], 1007, "invalid field"),
    "json_array": ([lambda: "[1, 2, 3]"], 1007, "Input should be an object"),
    "deeply_nested_json": (
        [lambda: '{"event": "media", "x": ' + "[" * 3000 + "]" * 3000 + "}"],
        1007,
        "media",
    ),
}


@pytest.mark.parametrize("case", sorted(STREAM_CASES))
async def test_hostile_stream_message_closes_that_call_only(case, caplog):
    caplog.set_level(logging.INFO, "duetaspan.twilio")
    builders, code, log_text = STREAM_CASES[case]
    async with server() as (peer, service):
        good_url, bad_url = await peer.stream_url("CA-good"), await peer.stream_url("CA-bad")
        good_msgs = renumber(load_twilio_stream(FIXTURE), "CA-good")[:40]
        bad_msgs = [b("CA-bad") if b is start else b() for b in builders]
        async with peer.open_stream(good_url) as good_ws, peer.open_stream(bad_url) as bad_ws:
            # the good call stays open until 30 of its 38 frames came back (or the server closed it)
            echoed = lambda got: len(got.of("media")) >= 30  # noqa: E731
            good_task = asyncio.create_task(peer.play(good_ws, good_msgs, wait_close_s=60, until=echoed))
            bad = await peer.play(bad_ws, bad_msgs, realtime=False, renumber=False, wait_close_s=3)
            good = await good_task
            assert bad.close_code == code, bad
            assert good.close_code is None and len(good.of("media")) >= 30  # the genuine call goes on
            assert "CA-good" in service.calls and "CA-bad" not in service.calls
    assert log_text in caplog.text
    assert "CA-bad" in caplog.text  # the log line says which call


async def test_frame_over_the_protocol_limit_is_refused_by_the_server(caplog):
    """`duetaspan.server.serve` caps WebSocket frames at 1 MiB: a bigger frame is refused by the protocol layer
    (1009) before the app buffers it, and the server goes on serving."""
    caplog.set_level(logging.INFO, "duetaspan.twilio")
    service = twilio_service(echo)
    app = twilio_app(service)
    port = free_port()
    task = asyncio.create_task(serve(app, host="127.0.0.1", port=port))
    peer = TwilioPeer(f"http://127.0.0.1:{port}")
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(200):
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(peer.base_url + "/health") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.05)
            url = await peer.stream_url("CA-huge")
            async with peer.open_stream(url) as ws:
                await ws.send(json.dumps(start("CA-huge")))
                with contextlib.suppress(Exception):
                    await ws.send("x" * (2 << 20))
                    await asyncio.wait_for(ws.wait_closed(), 5)
                assert ws.close_code == 1009
            async with http.get(peer.base_url + "/health") as resp:
                assert resp.status == 200
            assert (await peer.voice("CA-next"))[0] == 200
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await service.aclose()
    assert "characters (limit" not in caplog.text  # refused below the app: our 16 KiB check never saw it


async def test_signature_of_one_stream_url_does_not_open_another():
    async with server() as (peer, service):
        first, second = await peer.stream_url("CA-1"), await peer.stream_url("CA-2")
        stolen = peer.validator.compute_signature(first, {})
        with pytest.raises(InvalidStatus) as err:
            async with peer.open_stream(second, signature=stolen):
                pass
        assert err.value.response.status_code == 403
        assert service.tokens.pending == 2  # neither token was burnt


@pytest.mark.parametrize(
    ("name", "body", "status"),
    [
        ("oversized", "CallSid=CA1&pad=" + "x" * 70_000, 413),
        ("not_utf8", b"CallSid=CA1&From=\xff\xfe", 400),
    ],
)
async def test_malformed_webhook_bodies_get_4xx_and_no_token(name, body, status, caplog):
    caplog.set_level(logging.WARNING, "duetaspan.twilio")
    async with server() as (peer, service):
        async with aiohttp.ClientSession() as http:
            for path in ("/twilio/voice", "/twilio/status"):
                headers = {"Content-Type": "application/x-www-form-urlencoded", "X-Twilio-Signature": "x"}
                async with http.post(peer.base_url + path, data=body, headers=headers) as resp:
                    assert resp.status == status, (path, await resp.text())
            async with http.get(peer.base_url + "/health") as resp:
                assert resp.status == 200
        assert service.tokens.pending == 0
        # and the server still answers a genuine call
        assert (await peer.voice("CA-after"))[0] == 200


async def test_signed_webhook_without_call_sid_is_a_bad_request():
    async with server() as (peer, service):
        params = {"AccountSid": ACCOUNT_SID, "From": "+15550001111", "To": "+15552223333"}
        status, body = await peer.post_form("/twilio/voice", params)
    assert status == 400 and "CallSid" in body
    assert service.tokens.pending == 0


async def test_status_callback_params_are_bounded_in_memory():
    async with server() as (peer, service), aiohttp.ClientSession() as http:
        for i in range(300):
            params = {"CallSid": f"CA{i:04d}", "CallStatus": "completed"}
            signature = peer.validator.compute_signature(PUBLIC_URL + "/twilio/status", params)
            headers = {"Content-Type": "application/x-www-form-urlencoded", "X-Twilio-Signature": signature}
            async with http.post(
                peer.base_url + "/twilio/status", data=urlencode(params), headers=headers
            ) as r:
                assert r.status == 204
    assert len(service.call_status) == 256 and "CA0299" in service.call_status


# --- WebRTC offers ----------------------------------------------------------------------------------------
PAGE_TOKEN = "page-token-for-hostile-offers-0123"
GOOD_SHAPE_BAD_SDP = (
    "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nm=audio 9 UDP/TLS/RTP/SAVPF 0\r\nthis is not sdp\r\n"
)

OFFER_CASES = {
    "no_token": (None, json.dumps({"sdp": "v=0", "type": "offer"}), 401, "page token"),
    "wrong_token": (
        "Bearer not-the-token-at-all-xx",
        json.dumps({"sdp": "v=0", "type": "offer"}),
        403,
        "page token",
    ),
    "oversized": (
        PAGE_TOKEN,
        json.dumps({"sdp": "v=0\r\n" + "a=x\r\n" * 20_000, "type": "offer"}),
        413,
        "declared, larger than the 65536-byte limit",
    ),
    # no Content-Length: refused once the streamed body passes the limit, not after reading it all
    "oversized_chunked": (PAGE_TOKEN, lambda: _chunks(b"x" * 16_384, 64), 413, "while streaming"),
    "not_json": (PAGE_TOKEN, "{this is not json", 400, "not JSON"),
    "not_utf8": (PAGE_TOKEN, b"\xff\xfe\x00{", 400, "not JSON"),
    "wrong_shape": (PAGE_TOKEN, json.dumps({"sdp": 5, "type": "answer"}), 400, "offer must be"),
    "json_list": (PAGE_TOKEN, "[1, 2]", 400, "offer must be"),
    "no_audio": (
        PAGE_TOKEN,
        json.dumps({"sdp": "v=0\r\nm=video 9 RTP 0\r\n", "type": "offer"}),
        400,
        "m=audio",
    ),
    "garbage_sdp": (PAGE_TOKEN, json.dumps({"sdp": GOOD_SHAPE_BAD_SDP, "type": "offer"}), 400, "offer"),
}


async def _chunks(chunk: bytes, n: int):
    for _ in range(n):
        yield chunk


@pytest.mark.parametrize("case", sorted(OFFER_CASES))
async def test_hostile_webrtc_offer_is_refused_and_the_server_goes_on(case, caplog):
    from duetaspan.adapters.webrtc.service import WebRTCService, WebRTCSettings

    caplog.set_level(logging.WARNING, "duetaspan")
    auth, body, status, log_text = OFFER_CASES[case]
    service = WebRTCService(WebRTCSettings(ice_servers=[], token=PAGE_TOKEN, negotiate_timeout_s=5))
    # "ready, with a free slot": every case is refused before a call would be created on the agent
    service.agent = SimpleNamespace(free_slots=1, max_calls=1)
    app = create_app()
    mount(app, service, "webrtc")
    async with run_uvicorn(app) as base, aiohttp.ClientSession() as http:
        headers = {"Content-Type": "application/json"} | ({"Authorization": auth} if auth else {})
        auth_header = "Bearer " + PAGE_TOKEN if auth == PAGE_TOKEN else auth
        if auth_header:
            headers["Authorization"] = auth_header
        data = body() if callable(body) else body
        async with http.post(base + "/webrtc/offer", data=data, headers=headers) as resp:
            assert resp.status == status, await resp.text()
            assert "error" in await resp.json()
        async with http.get(base + "/health") as resp:
            assert resp.status == 200
    assert service.calls == {}
    assert log_text in caplog.text
    assert PAGE_TOKEN not in caplog.text


# --- on a real agent --------------------------------------------------------------------------------------
@pytest.mark.serial  # asserts the frames made in real time: CPU quiet
async def test_hostile_message_mid_call_on_the_agent_frees_the_slot_and_keeps_the_artifacts(
    tiny_engine, tmp_path
):
    """The existing cases run on an echo handler; here the hostile call is an agent call (engine slot, router,
    artifacts): closed with 1007, its slot freed, its artifacts complete, a genuine agent call beside it whole."""
    from tests.reliability.rig import call_stream, served

    async with served(tiny_engine, tmp_path) as rig:

        async def good_script(live) -> None:
            await live.spoken(3.5)

        good = asyncio.create_task(rig.call("CA-fine", good_script))
        messages = call_stream("CA-evil", "greeting", 2.0, 2.0)
        messages.insert(60, "{not json at all")
        url = await rig.peer.stream_url("CA-evil")
        async with rig.peer.open_stream(url) as ws:
            got = await rig.peer.play(ws, messages, wait_close_s=5)
        evil = await rig.record("CA-evil")
        good = await good
        free = rig.agent.free_slots == rig.agent.max_calls
    assert got.close_code == 1007
    assert evil["complete"] and evil["frames"]
    assert rig.service.finished["CA-evil"].end_reason == "MalformedMessage"
    assert good.record["complete"] and good.got.close_code == 1000 and len(good.record["frames"]) >= 20
    assert free
