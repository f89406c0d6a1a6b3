"""A page call turned away because every slot is busy counts as a refused WebRTC call in /metrics."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from duetaspan.adapters.webrtc.service import WebRTCService, WebRTCSettings
from duetaspan.observability.metrics import ServeMetrics
from duetaspan.server import create_app, mount, serve
from tests.support import free_port

TOKEN = "refusal-test-token-0123456789"
OFFER = {"type": "offer", "sdp": "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n"}


async def test_a_busy_page_call_is_counted_as_refused():
    metrics = ServeMetrics(engine=None, transports=["webrtc"])
    busy = SimpleNamespace(free_slots=0, max_calls=1)  # an agent whose every slot is taken
    service = WebRTCService(WebRTCSettings(token=SecretStr(TOKEN)), agent=busy)
    service.on_refused = lambda: metrics.call_ended("webrtc", "refused")
    app = create_app()
    mount(app, service, "webrtc")
    port = free_port()
    server = asyncio.create_task(serve(app, host="127.0.0.1", port=port))
    try:
        async with aiohttp.ClientSession() as http:
            url, auth = f"http://127.0.0.1:{port}/webrtc/offer", {"Authorization": f"Bearer {TOKEN}"}
            for _ in range(600):  # the server is up once it answers (deadline: 60 s on a loaded box)
                with contextlib.suppress(aiohttp.ClientConnectionError):
                    async with http.post(url, json=OFFER, headers=auth) as resp:
                        status, body = resp.status, await resp.json()
                        break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the server never answered")
    finally:
        server.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await server
    assert status == 503 and "busy" in body["error"]
    refused = {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
        if s.name == "duetaspan_calls_total"
    }
    assert refused[(("outcome", "refused"), ("transport", "webrtc"))] == 1
