"""Every refusal of the Twilio routes lands in `duetaspan_webhook_refusals_total{reason}`: a real loopback
server with the SDK's Twilio routes, requests signed (or not) as Twilio signs them, a WebSocket upgrade with
an unknown stream token; a busy answer also counts a refused call."""

from __future__ import annotations

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import InvalidStatus

from duetaspan.observability.metrics import ServeMetrics
from tests.adapters.twilio.peer import PUBLIC_URL, serve_twilio, twilio_service


async def _never(call) -> None:  # no call reaches a handler here
    raise AssertionError("no call should be answered")


def samples(text: bytes) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


async def test_each_twilio_refusal_is_counted_by_reason():
    metrics = ServeMetrics(engine=None, transports=["twilio"])
    service = twilio_service(_never, max_calls=0)  # every slot busy
    service.on_refusal = metrics.webhook_refused
    async with serve_twilio(service) as peer:
        status, body = await peer.voice("CA-busy")
        assert status == 200 and "<Hangup" in body and "<Stream" not in body  # the busy TwiML
        assert (await peer.voice("CA-unsigned", signature=None))[0] == 403
        assert (await peer.voice("CA-forged", signature="forged"))[0] == 403
        assert (await peer.post_form("/twilio/voice", {"From": "+1555"}))[0] == 400  # no CallSid
        async with aiohttp.ClientSession() as http:
            async with http.post(peer.base_url + "/twilio/voice", data=b"x" * 70_000) as resp:
                assert resp.status == 413
        with pytest.raises(InvalidStatus) as refused:
            async with peer.open_stream(f"wss://{PUBLIC_URL.split('://')[1]}/twilio/stream/not-a-token"):
                pass
        assert refused.value.response.status_code == 404
    figures = samples(metrics.render())
    reasons = {
        labels[0][1]: value for (name, labels), value in figures.items() if name.endswith("refusals_total")
    }
    assert reasons == {
        "busy": 1,
        "draining": 0,
        "too_many_pending": 0,
        "signature_invalid": 2,
        "no_call_sid": 1,
        "body_too_large": 1,
        "not_utf8": 0,
        "replayed_webhook": 0,
        "token_unknown": 1,
        "token_expired": 0,
        "token_reused": 0,
        "call_already_answered": 0,
    }
    assert figures[("duetaspan_calls_total", (("outcome", "refused"), ("transport", "twilio")))] == 1
