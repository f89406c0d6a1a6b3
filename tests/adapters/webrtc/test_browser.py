"""`duetaspan serve --webrtc --model tiny-random` in a real subprocess, used by real headless Chromium with a fake
microphone playing a fixture phrase: the page connects, the server hears the caller, the page receives the
agent's voice and words, and a `<ret>` forced from the page is routed (scripted LLM + ASR servers on loopback)
to a tool whose span shows up as a card on the page. Bad tokens and bad offers are refused on the same server,
which keeps serving."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.adapters.webrtc.browser import CHROMIUM, Chromium, fake_mic_wav
from tests.fakes.asr_server import ScriptedASRServer
from tests.fakes.llm_server import ScriptedLLMServer
from tests.support import REPO_ROOT, fixture_phrase, free_port, stop_process, wait_until_healthy

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/test.sh installs it)"),
]

TOKEN = "test-page-token-0123456789"
AGENT_TOML = """
[persona]
prompt = "You are Ada. You answer questions on a web page."

[router]
base_url = "{llm}/v1"
model = "scripted"
api_key_env = "DUETASPAN_TEST_NO_KEY"

[asr]
kind = "transcribe"
url = "{asr}/transcribe"

[tools]
builtins = ["get_time"]

[webrtc]
ice_servers = []
"""
AGENT_TOML_EXTRA = """
[retrieval]
deadline_s = {deadline_s}
"""


@contextlib.asynccontextmanager
async def serve_webrtc(tmp_path: Path, llm_url: str, asr_url: str, *, deadline_s: float = 2.5):
    """The CLI server; yields (base URL, printed page URL, process).

    `deadline_s` is the retrieval deadline: a test that needs its span to land gives it room (on a loaded 2-core
    CI machine the scripted router's loopback answer once took longer than 2.5 s); the one that shows a late
    retrieval keeps it short, since its router hangs and the deadline is what it waits out."""
    (tmp_path / "agent.toml").write_text(
        AGENT_TOML.format(llm=llm_url, asr=asr_url) + AGENT_TOML_EXTRA.format(deadline_s=deadline_s)
    )
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "TWILIO_"))}
    env |= {"PYTHONPATH": str(REPO_ROOT), "DUETASPAN_WEBRTC_TOKEN": TOKEN}
    cmd = [
        sys.executable, "-m", "duetaspan", "-v", "serve", "--webrtc", "--host", "127.0.0.1", "--port", str(port),
        "--config", str(tmp_path / "agent.toml"), "--model", "tiny-random", "--max-calls", "1",
        "--record-dir", str(tmp_path / "calls"), "--allow-force-ret",
    ]  # fmt: skip
    proc, out, err = _spawn(cmd, env, tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        await wait_until_healthy(base, proc, tmp_path / "serve.log", what="serve --webrtc")
        printed = (tmp_path / "serve.out").read_text()
        yield base, printed, proc
    finally:
        stop_process(proc)
        out.close()
        err.close()


def _spawn(cmd: list[str], env: dict[str, str], folder: Path) -> tuple[subprocess.Popen, Any, Any]:
    out, err = (folder / "serve.out").open("wb"), (folder / "serve.log").open("wb")
    return subprocess.Popen(cmd, env=env, stdout=out, stderr=err, cwd=folder), out, err


async def _refusals(base: str) -> None:
    """Missing/wrong tokens and broken offers are refused; none of it stops the server."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as http:
        async with http.get(base + "/") as resp:
            assert resp.status == 401 and "token" in await resp.text()
        async with http.get(base + "/?token=wrong-token") as resp:
            assert resp.status == 403
        async with http.post(base + "/webrtc/offer", json={"sdp": "v=0", "type": "offer"}) as resp:
            assert resp.status == 401
        bad_auth = {"Authorization": "Bearer not-the-token-at-all"}
        async with http.post(
            base + "/webrtc/offer", json={"sdp": "v=0", "type": "offer"}, headers=bad_auth
        ) as resp:
            assert resp.status == 403
        for body in (b"{not json", b'{"type": "offer"}', b'{"sdp": "v=0\\r\\nm=audio 9 x 111\\r\\n", "type": "offer"}',
                     b"x" * 200_000):  # fmt: skip
            async with http.post(base + "/webrtc/offer", data=body, headers=auth) as resp:
                assert resp.status == (413 if len(body) > 65_536 else 400), (body[:40], resp.status)
                assert (await resp.json())["error"]


async def test_page_in_chromium_connects_streams_both_ways_and_shows_a_forced_span(tmp_path):
    phrase = fixture_phrase("time_tokyo")
    llm = ScriptedLLMServer(
        {
            "rules": [
                {
                    "match": "tokyo",
                    "reply": {"tool_call": {"name": "get_time", "arguments": {"place": "Tokyo"}}},
                }
            ]
        }
    )
    asr = ScriptedASRServer({"default": phrase})
    mic = fake_mic_wav("time_tokyo", tmp_path)
    async with (
        llm.serve() as llm_url,
        asr.serve() as asr_url,
        serve_webrtc(tmp_path, llm_url, asr_url, deadline_s=30.0) as (base, printed, proc),
    ):
        assert f"WebRTC page: http://127.0.0.1:{base.rsplit(':', 1)[1]}/?token={TOKEN}" in printed
        await _refusals(base)
        async with Chromium.launch(f"{base}/?token={TOKEN}", tmp_path / "chromium", mic_wav=mic) as page:
            await page.wait_for("document.readyState === 'complete' && window.__stats", 15)
            await page.evaluate("document.getElementById('connect').click()", user_gesture=True)
            await page.wait_for("window.__stats.state === 'live' && window.__stats.events.hello", 20)
            # the server hears the fixture phrase (levels say it is speech, not silence) ...
            server = await page.wait_for(
                "(s => s && s.caller_seconds > 6 && s)(window.__stats.server)", 30, every_s=0.5
            )
            # ... and the page gets the agent's audio (RTP counters of the page's own peer connection) and words
            inbound = await page.wait_for(
                "(s => s && s.packetsReceived > 100 && s.totalAudioEnergy > 0 && s)(window.__stats.inbound)",
                10,
            )
            await page.evaluate("document.getElementById('force-ret').click()", user_gesture=True)
            spans = await page.wait_for("window.__stats.spans.length && window.__stats.spans", 45)
            cards = await page.evaluate(
                "[...document.querySelectorAll('#spans .card')].map(c => c.innerText)"
            )
            state = await page.evaluate("window.__stats")
            await page.screenshot(tmp_path / "page.png")
            await page.evaluate("document.getElementById('connect').click()", user_gesture=True)
            assert await page.evaluate("window.__stats.state") == "ended"
        calls = tmp_path / "calls"
        for _ in range(600):  # the server notices the hang-up and closes the call's artifacts
            records = list(calls.glob("web-*.json"))
            if records:
                break
            await asyncio.sleep(0.1)
        assert proc.poll() is None
    log = (tmp_path / "serve.log").read_text()

    # the mic loops 0.5 s silence, the 3.7 s phrase, 1.5 s silence (and starts before the call does): the
    # server heard sound, not a silent or muted track
    assert server["caller_seconds"] > 6 and state["server"]["caller_sound_seconds"] > 1.0, state["server"]
    assert inbound["bytesReceived"] > 5_000
    assert state["events"]["agent_text"] > 0 and state["agentText"].strip()
    assert state["rets"] >= 1
    span = spans[0]
    assert span["tool"] == "get_time" and span["arguments"] == {"place": "Tokyo"}
    assert "Tokyo" in span["reference"] and span["latency_ms"] > 0
    assert any("get_time" in c and "Tokyo" in c for c in cards), cards
    assert state["errors"] == []
    assert asr.requests and llm.requests

    record = json.loads(records[0].read_text())
    assert record["meta"]["transport"] == "webrtc" and record["complete"]
    assert record["spans"] and record["spans"][0]["tool"] == "get_time"
    assert "refused WebRTC offer" in log and "offer is not JSON" in log
    assert TOKEN not in log  # the page token never reaches the logs


async def _force_until(page: Chromium, kind: str, before: int, timeout_s: float = 60) -> dict[str, Any]:
    """Press Force <ret> until a card of `kind` appears past the first `before` ones (a press while a <ret>
    the random model sampled itself is in flight is dropped, so one press may not be enough)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    found = f"window.__stats.misses.slice({before}).find(m => m.kind === {kind!r})"
    while True:
        await page.evaluate("document.getElementById('force-ret').click()", user_gesture=True)
        with contextlib.suppress(TimeoutError):
            return await page.wait_for(found, 12)
        if loop.time() > deadline:
            state = await page.evaluate("JSON.stringify(window.__stats.misses)")
            raise TimeoutError(f"no {kind} card on the page; misses = {state}")


async def test_page_shows_why_a_forced_ret_got_no_span(tmp_path):
    """The first run without a key: the ASR answers 401, and the page says so (failed, at capture, the
    reason); then a router that wants no span (no span, its reason) and one that never answers (late, at
    router). The server logs one line per failed retrieval."""
    phrase = fixture_phrase("time_tokyo")
    llm = ScriptedLLMServer({"default": {"content": '{"none": true}'}})
    asr = ScriptedASRServer({"default": {"status": 401}})
    mic = fake_mic_wav("time_tokyo", tmp_path)
    async with (
        llm.serve() as llm_url,
        asr.serve() as asr_url,
        serve_webrtc(tmp_path, llm_url, asr_url) as (base, _printed, proc),
    ):
        async with Chromium.launch(f"{base}/?token={TOKEN}", tmp_path / "chromium", mic_wav=mic) as page:
            await page.wait_for("document.readyState === 'complete' && window.__stats", 15)
            await page.evaluate("document.getElementById('connect').click()", user_gesture=True)
            await page.wait_for("window.__stats.state === 'live' && window.__stats.events.hello", 20)

            failed = await _force_until(page, "failed", 0)
            failed_cards = await page.evaluate(
                "[...document.querySelectorAll('#spans .card.failed')].map(c => c.innerText)"
            )
            asr.default = phrase  # the ASR works again; the router says no span is needed
            n = await page.evaluate("window.__stats.misses.length")
            no_span = await _force_until(page, "no_span", n)
            llm.default = {"hang": True}  # the router never answers: the deadline drops the retrieval
            n = await page.evaluate("window.__stats.misses.length")
            late = await _force_until(page, "late", n)
            cards = await page.evaluate(
                "[...document.querySelectorAll('#spans .card.miss')].map(c => c.innerText)"
            )
            state = await page.evaluate("window.__stats")
            await page.screenshot(tmp_path / "page.png")
            await page.evaluate("document.getElementById('connect').click()", user_gesture=True)
            ended = await _wait_for_log(tmp_path / "serve.log", ": ended after ", 30)
        assert proc.poll() is None
    log = (tmp_path / "serve.log").read_text()

    assert failed["stage"] == "capture" and "HTTP 401" in failed["reason"], failed
    assert any("retrieval failed" in c and "at capture" in c and "401" in c and "OPENAI_API_KEY" in c
               for c in failed_cards), failed_cards  # fmt: skip
    assert no_span["reason"] == "none", no_span
    assert late["stage"] == "router" and "2.5 s" in next(c for c in cards if c.startswith("late")), cards
    assert state["spans"] == [] and state["errors"] == []
    # one log line per failed retrieval, naming the call, the stage and the reason
    n_failed = sum(1 for m in state["misses"] if m["kind"] == "failed")
    failed_lines = [line for line in log.splitlines() if "failed at capture: ASR" in line]
    assert n_failed >= 1 and len(failed_lines) == n_failed, (n_failed, failed_lines)
    assert "HTTP 401" in failed_lines[0] and "WARNING" in failed_lines[0]
    assert "late: no span after 2.5 s (stage router)" in log
    # a normal hang-up ends the call at once, with no ERROR (no audio write left waiting on the dead peer)
    hung_up = next(line for line in log.splitlines() if "ending (the page hung up)" in line)
    assert _log_time(ended) - _log_time(hung_up) < 5.0, (hung_up, ended)
    assert " ERROR " not in log, [line for line in log.splitlines() if " ERROR " in line]


async def _wait_for_log(path: Path, needle: str, timeout_s: float) -> str:
    """The first line of the log at `path` containing `needle` (polled until it appears)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        for line in (await asyncio.to_thread(path.read_text)).splitlines():
            if needle in line:
                return line
        assert loop.time() < deadline, f"{needle!r} never logged"
        await asyncio.sleep(0.2)


def _log_time(line: str) -> float:
    """Seconds of the day of a log line's `YYYY-MM-DD HH:MM:SS,mmm` stamp."""
    hms, ms = line.split()[1].split(",")
    h, m, sec = (int(x) for x in hms.split(":"))
    return h * 3600 + m * 60 + sec + int(ms) / 1000
