"""`GET /metrics` of the real `duetaspan serve --twilio` command (a subprocess on `--model tiny-random`): a
signed Twilio webhook and a Media Stream of real mu-law audio, then the scrape, parsed with Prometheus' own
parser. The engine runs in the server process and, with `--engine-process`, in a child process that reports
its clock to the server. The bearer-token guard answers 401 without the token and 200 with it. The standard
`OTEL_EXPORTER_OTLP_ENDPOINT` variable turns traces on: the call's trace reaches a loopback OTLP receiver."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import aiohttp
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client.parser import text_string_to_metric_families

from duetaspan.observability.metrics import METRIC_NAMES
from tests.adapters.twilio.peer import ACCOUNT_SID, AUTH_TOKEN, PUBLIC_URL, TwilioPeer, renumber
from tests.support import REPO_ROOT, free_port, load_twilio_stream, stop_process, wait_until_healthy

TOKEN = "scrape-secret-7f3a"


def _env(otlp: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TWILIO_", "OPENAI_", "DUETASPAN_"))}
    env |= {
        "TWILIO_ACCOUNT_SID": ACCOUNT_SID,
        "TWILIO_AUTH_TOKEN": AUTH_TOKEN,
        "TWILIO_API_BASE_URL": "http://127.0.0.1:9",
        "DUETASPAN_METRICS_TOKEN": TOKEN,
        "PYTHONPATH": str(REPO_ROOT),
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp,
    }
    return env


def _spawn(cmd: list[str], log_path, otlp: str) -> subprocess.Popen:
    with log_path.open("wb") as log:
        return subprocess.Popen(
            cmd, env=_env(otlp), stdout=log, stderr=subprocess.STDOUT, cwd=log_path.parent
        )


async def scrape(base: str, token: str | None = TOKEN) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http:
        async with http.get(base + "/metrics", headers=headers) as resp:
            return resp.status, await resp.text()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.mark.parametrize("engine_process", [False, True], ids=["engine-thread", "engine-process"])
async def test_a_twilio_call_against_the_real_server_shows_up_in_metrics(tmp_path, engine_process):
    port = free_port()
    config = tmp_path / "agent.toml"
    config.write_text('[persona]\nprompt = "You answer the phone for a test."\n')
    cmd = [
        sys.executable, "-m", "duetaspan", "serve", "--twilio", "--host", "127.0.0.1", "--port", str(port),
        "--public-url", PUBLIC_URL, "--config", str(config), "--model", "tiny-random",
        *(["--engine-process"] if engine_process else []),
    ]  # fmt: skip
    log_path = tmp_path / "serve.log"
    collector = ThreadingHTTPServer(("127.0.0.1", 0), OTLPReceiver)
    collector.received = []  # type: ignore[attr-defined]
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    proc = _spawn(cmd, log_path, f"http://127.0.0.1:{collector.server_port}")
    base = f"http://127.0.0.1:{port}"
    try:
        await wait_until_healthy(base, proc, log_path, what="serve", timeout_s=120)
        # the token guard
        assert (await scrape(base, None))[0] == 401
        assert (await scrape(base, "wrong-token"))[0] == 401
        status, before = await scrape(base)
        assert status == 200
        assert samples(before)[("duetaspan_calls_active", ())] == 0
        # one refused webhook (unsigned), then one real call
        peer = TwilioPeer(base)
        assert (await peer.voice("CA-metrics", signature=None))[0] == 403
        url = await peer.stream_url("CA-metrics")
        messages = renumber(load_twilio_stream("time_tokyo"), "CA-metrics")
        async with peer.open_stream(url) as ws:
            got = await peer.play(ws, messages, linger_s=0.3)
        assert got.close_code == 1000
        # the call is counted once the server has closed it
        deadline = time.monotonic() + 30
        while True:
            status, text = await scrape(base)
            figures = samples(text)
            done = figures.get(("duetaspan_calls_total", (("outcome", "completed"), ("transport", "twilio"))))
            if done == 1 and figures[("duetaspan_calls_active", ())] == 0:
                break
            assert time.monotonic() < deadline, text
            await asyncio.sleep(0.2)
        if engine_process:  # the child reports its clock every 0.5 s: wait for its report after the call
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                figures = samples((await scrape(base))[1])
                ticks = figures.get(("duetaspan_engine_tick_seconds_count", ()), 0)
                if ticks >= 10 and figures.get(("duetaspan_clock_lateness_seconds_count", ())) == ticks and (
                    figures.get(("duetaspan_engine_free_slots", ())) == 4
                ):
                    break
                await asyncio.sleep(0.2)
        assert proc.poll() is None
    finally:
        stop_process(proc)  # SIGTERM: the server shuts down and flushes its traces
        collector.shutdown()

    names = {name for name, _ in figures}
    for name in METRIC_NAMES:  # every contracted name, histograms through their _count series
        assert name in names or f"{name}_count" in names, name
    assert figures[("duetaspan_calls_total", (("outcome", "refused"), ("transport", "twilio")))] == 0
    assert figures[("duetaspan_calls_total", (("outcome", "failed"), ("transport", "twilio")))] == 0
    assert figures[("duetaspan_webhook_refusals_total", (("reason", "signature_invalid"),))] == 1
    assert figures[("duetaspan_engine_free_slots", ())] == 4  # the default max_calls, all free again
    assert figures[("duetaspan_engine_crashes_total", ())] == 0
    # the engine ticked for the call: the stream was ~2.5 s of audio, 12.5 frames a second
    ticks = figures[("duetaspan_engine_tick_seconds_count", ())]
    assert ticks >= 10
    assert figures[("duetaspan_engine_tick_seconds_bucket", (("le", "+Inf"),))] == ticks
    assert figures[("duetaspan_engine_tick_seconds_sum", ())] > 0
    assert figures[("duetaspan_clock_lateness_seconds_count", ())] == ticks
    assert figures[("duetaspan_frames_concealed_total", ())] <= ticks
    for outcome in ("landed", "late", "none"):
        assert ("duetaspan_spans_total", (("outcome", outcome),)) in figures
    for stage in ("capture", "asr", "router", "tool", "prefill", "total"):
        assert ("duetaspan_retrieval_seconds_count", (("stage", stage),)) in figures
    # the call's trace, exported over OTLP/HTTP
    spans = [
        span
        for path, body in collector.received  # type: ignore[attr-defined]
        if path == "/v1/traces"
        for resource in ExportTraceServiceRequest.FromString(body).resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    [root] = [s for s in spans if s.name == "conversation"]
    attributes = {a.key: a.value.string_value for a in root.attributes}
    assert attributes["conversation.id"] == "CA-metrics"
    assert attributes["duetaspan.transport"] == "twilio"
    assert attributes["duetaspan.call.outcome"] == "completed"


class OTLPReceiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP collector stand-in: keeps every request's path and body on its server."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append((self.path, body))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass
