"""End to end against a real `duetaspan serve --twilio` process (tiny-random model, a real Twilio-protocol
WebSocket call with real mu-law audio, the scripted ASR and LLM over HTTP) and a real HTTP receiver that
verifies every signature: the lifecycle events arrive signed and in order, `call.ended` carries the redacted
two-sided transcript, `call.analyzed` the analysis the record also holds, nothing stored or logged has the
card number, and the stored wav's caller channel is silent where the ASR's word times put it (on SQLite and
on PostgreSQL). A server with `[webhooks] urls` and no signing secret refuses to
start, saying why. And `kill -9` of the server (on both stores) while its events cannot be delivered (the
receiver is down) loses none of them: the next start sends every one once the receiver is up, finishes the
call that was live and makes the analysis the kill interrupted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from duetaspan.store import SQLITE_NAME
from duetaspan.testing import ScriptedASR, ScriptedLLM
from duetaspan.testing.llm import hang, tool_call
from duetaspan.webhooks.analysis import TOOL
from tests.adapters.twilio.peer import ACCOUNT_SID, AUTH_TOKEN, PUBLIC_URL, TwilioPeer, renumber
from tests.support import REPO_ROOT, free_port, has_card, load_twilio_stream, stop_process, wait_until_healthy
from tests.webhooks.conftest import SECRET, Receiver

CARD = "4111 1111 1111 1111"
ANALYSIS = {"summary": "The caller asked the time in Tokyo.", "success": True, "fields": {"city": "Tokyo"}}


def _toml(llm: str, asr: str, hook: str) -> str:
    return f"""
[persona]
prompt = "You answer the phone for a test."
[router]
base_url = "{llm}"
model = "scripted"
api_key_env = "DUETASPAN_TEST_KEY"
[asr]
kind = "transcribe"
url = "{asr}"
[webhooks]
urls = ["{hook}"]
timeout_s = 3
max_backoff_s = 2
[analysis]
enabled = true
success_question = "Did the caller get the time?"
[analysis.schema]
type = "object"
required = ["city"]
properties = {{ city = {{ type = "string" }} }}
[privacy]
redact = ["card", "ssn", "phone", "email", "digits"]
[server]
data_dir = "data"
"""


def _command(
    tmp_path, port: int, store_url: str = "", *, retrieval: bool = True
) -> tuple[list[str], dict[str, str]]:
    """`serve --twilio` on `port` with tmp_path's agent.toml, and its environment (the signing secret set);
    `retrieval=False`: with `--no-retrieval` (no router: the ASR and the analysing LLM still work)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TWILIO_", "OPENAI_", "DUETASPAN_"))}
    env |= {"TWILIO_ACCOUNT_SID": ACCOUNT_SID, "TWILIO_AUTH_TOKEN": AUTH_TOKEN, "PYTHONPATH": str(REPO_ROOT),
            "TWILIO_API_BASE_URL": "http://127.0.0.1:9", "DUETASPAN_WEBHOOK_SECRET": SECRET,
            "DUETASPAN_TEST_KEY": "k", "DUETASPAN_METRICS_TOKEN": "metrics-token", **({"DUETASPAN_STORE_URL": store_url} if store_url else {})}  # fmt: skip
    cmd = [sys.executable, "-m", "duetaspan", "-v", "serve", "--twilio", "--host", "127.0.0.1", "--port",
           str(port), "--public-url", PUBLIC_URL, "--config", str(tmp_path / "agent.toml"), "--model",
           "tiny-random", "--max-calls", "2", "--record-dir", str(tmp_path / "calls"),
           *([] if retrieval else ["--no-retrieval"])]  # fmt: skip
    return cmd, env


@contextlib.contextmanager
def _serve(tmp_path, store_url: str = "", *, retrieval: bool = True):
    port = free_port()
    cmd, env = _command(tmp_path, port, store_url, retrieval=retrieval)
    with (tmp_path / "serve.log").open("ab") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        if proc.poll() is None:
            stop_process(proc)


async def _call(base: str, call_sid: str, caller: str = "+15550001111", heard_in=None) -> None:
    """The recorded question as a Twilio call. With `heard_in` (the call's journal), the caller hangs up (`stop`)
    only once the ASR's transcript of what it said is in the journal (`caller_utterance`): on a loaded machine
    voice detection closes the utterance late, and one still at the ASR when the call ends is not recorded."""
    peer = TwilioPeer(base)
    url = await peer.stream_url(call_sid, caller=caller)
    messages = renumber(load_twilio_stream("time_tokyo"), call_sid)
    async with peer.open_stream(url) as ws:
        if heard_in is None:
            await peer.play(ws, messages, linger_s=0.3)
            return
        heard = lambda _got: heard_in.exists() and '"caller_utterance"' in heard_in.read_text()  # noqa: E731
        await peer.play(ws, [m for m in messages if m["event"] != "stop"], until=heard, wait_close_s=90)
        assert heard(None), "the caller's words never reached the call's journal"
        await peer.play(ws, [m for m in messages if m["event"] == "stop"], renumber=False)


async def _live_call(base: str, call_sid: str) -> None:
    """A call that streams (the recorded question again and again, minutes of it) until the server goes away."""
    peer = TwilioPeer(base)
    url = await peer.stream_url(call_sid)
    messages = renumber(load_twilio_stream("time_tokyo"), call_sid)
    head = [m for m in messages if m["event"] in ("connected", "start")]
    audio = [m for m in messages if m["event"] == "media"]
    async with peer.open_stream(url) as ws:
        await peer.play(ws, [*head, *(audio * 50)])


async def _until(check, what: str, timeout_s: float = 90.0, proc=None, log=None):
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"serve exited ({proc.returncode}) waiting for {what}:\n{log.read_text()[-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)
    return result


async def _until_metrics(base: str, *lines: str, timeout_s: float = 30.0) -> str:
    import aiohttp

    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(headers={"Authorization": "Bearer metrics-token"}) as http:
        while True:
            async with http.get(base + "/metrics") as resp:
                text = await resp.text()
            if all(line in text for line in lines) or time.monotonic() > deadline:
                return text
            await asyncio.sleep(0.2)


def _heard() -> dict:
    """What the ASR hears in each utterance, with word times counted from its speech's onset (as an
    OpenAI-style `verbose_json` reply gives them): the card number's words 0.6-1.4 s in."""
    said = "what time is it in Tokyo, my card is".split()
    words = [{"word": w, "start": 0.06 * i, "end": 0.06 * i + 0.05} for i, w in enumerate(said)]
    words += [{"word": g, "start": 0.6 + 0.2 * i, "end": 0.75 + 0.2 * i} for i, g in enumerate(CARD.split())]
    return {"text": f"what time is it in Tokyo, my card is {CARD}", "words": words, "words_from": "speech"}


def _scripted() -> tuple[ScriptedLLM, ScriptedASR]:
    llm = ScriptedLLM({"rules": [{"match": "Transcript:", "reply": tool_call(TOOL, **ANALYSIS)}],
                       "default": tool_call("get_time", place="Tokyo")})  # fmt: skip
    asr = ScriptedASR()
    asr.default = _heard()
    return llm, asr


def _caller_silent_over_redactions(record: dict, wav_path) -> list[dict]:
    """The record's caller-channel `audio_redactions`, each checked silent in the stored wav: its span of the
    caller's stream (seconds) found through the record's frames (`caller_frame`: which 80 ms of the caller's
    stream each wav frame holds; -1 for a concealed tick)."""
    import wave

    import numpy as np

    spans = [s for s in record.get("audio_redactions") or [] if s.get("channel") == "caller"]
    with wave.open(str(wav_path), "rb") as w:
        rate = w.getframerate()
        caller = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2)[:, 0]
    n = rate * 80 // 1000
    frames = np.array([f.get("caller_frame", -1) for f in record["frames"]])
    stream = (frames[:, None] * n + np.arange(n)[None, :]).reshape(-1)[: caller.size]
    stream[np.repeat(frames < 0, n)[: caller.size]] = -1
    for span in spans:
        inside = caller[(stream >= span["start"] * rate) & (stream < span["end"] * rate)]
        assert inside.size >= 0.5 * rate and not inside.any(), (span, inside.size, int(np.abs(inside).max()))
    assert np.count_nonzero(caller) > 0.3 * rate  # the rest of what the caller said is kept
    return spans


# serial: the stored recording must hold the caller's card number to show it silent; at the workers' nice 19
# the engine fell behind and dropped the caller's frames (r35, PostgreSQL: 0.33 s of the 1.05 s span reached
# the wav), as `test_recording_redaction.py`'s call did
@pytest.mark.serial
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_a_served_call_sends_signed_lifecycle_events(tmp_path, request, backend):
    # SQLite: the config's data/ folder; PostgreSQL: a fresh database, as DUETASPAN_STORE_URL
    store_url = request.getfixturevalue("pg_url") if backend == "postgresql" else ""
    receiver = Receiver()
    llm, asr = _scripted()
    async with llm as llm_url, asr:
        hook = await receiver.start()
        (tmp_path / "agent.toml").write_text(_toml(llm_url, asr.transcribe_url, hook))
        try:
            with _serve(tmp_path, store_url) as (base, proc):
                await wait_until_healthy(base, proc, tmp_path / "serve.log", what="serve")
                await _call(base, "CA-hooks", caller="+14155552671", heard_in=tmp_path / "calls" / "CA-hooks.jsonl")
                types = lambda: [g["event"]["type"] for g in receiver.got]  # noqa: E731
                await _until(lambda: "call.analyzed" in types(), "call.analyzed", proc=proc, log=tmp_path / "serve.log")
                metrics = await _until_metrics(base, "duetaspan_webhook_delivered_total 3.0", "duetaspan_webhook_backlog 0.0")
        finally:
            await receiver.stop()
    events = [g["event"] for g in receiver.got]
    assert receiver.bad_signatures == 0 and all(g["status"] == 200 for g in receiver.got)
    assert [e["type"] for e in events] == ["call.started", "call.ended", "call.analyzed"]
    assert len({e["id"] for e in events}) == 3 and {e["call_id"] for e in events} == {"CA-hooks"}
    assert [e["created"] for e in events] == sorted(e["created"] for e in events)
    ended = events[1]["data"]
    assert ended["caller"] == "+14155552671" and ended["transport"] == "twilio" and ended["recorded"] is True
    caller_turns = [t for t in ended["turns"] if t["who"] == "caller"]
    assert caller_turns and all("[card]" in t["text"] and "4111" not in t["text"] for t in caller_turns)
    analyzed = events[2]["data"]
    assert {k: analyzed[k] for k in ANALYSIS} == ANALYSIS
    record = json.loads((tmp_path / "calls" / "CA-hooks.json").read_text())
    assert record["analysis"]["fields"] == {"city": "Tokyo"} and record["turns"] == ended["turns"]
    # the recording too: where the ASR's word times put the card number, the caller's channel is silent
    spans = _caller_silent_over_redactions(record, tmp_path / "calls" / "CA-hooks.wav")
    assert spans and all(s["kind"] == "card" and s["samples"] > 0 for s in spans), spans
    [analysis_request] = [r for r in llm.requests if r.get("tools") and r["tools"][0]["function"]["name"] == TOOL]
    assert not has_card(json.dumps(analysis_request))  # the analysing LLM reads the redacted transcript
    for path in [*(tmp_path / "calls").iterdir(), tmp_path / "serve.log"]:
        assert not has_card(path.read_text(errors="replace")), path.name
    assert "duetaspan_webhook_delivered_total 3.0" in metrics, metrics
    assert "duetaspan_webhook_backlog 0.0" in metrics and "duetaspan_webhook_dead 0.0" in metrics
    # the events went through this backend's outbox (read back as another process would)
    rows = await _outbox(store_url or str(tmp_path / "data" / SQLITE_NAME))
    assert sorted((i, s) for i, _, s in rows) == sorted((e["id"], "delivered") for e in events)


def test_webhook_urls_without_a_signing_secret_refuse_to_start(tmp_path):
    # every delivery is signed: a server that could not sign says so in one line and does not start
    closed = "http://127.0.0.1:9"
    (tmp_path / "agent.toml").write_text(_toml(closed + "/v1", closed + "/transcribe", closed + "/hook"))
    port = free_port()
    cmd, env = _command(tmp_path, port)
    del env["DUETASPAN_WEBHOOK_SECRET"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode != 0, done.stderr
    want = ("duetaspan serve: error: [webhooks] urls is set but $DUETASPAN_WEBHOOK_SECRET is not: "
            "every delivery is signed")
    assert want in done.stderr.splitlines() and "Traceback" not in done.stderr, done.stderr[-3000:]


async def _outbox(target: str) -> list[tuple[str, str, str]]:
    """(id, type, state) of the outbox rows, read through the store as another process would."""
    from duetaspan.store import open_store

    store = await open_store(target)
    try:
        async with store.transaction() as tx:
            return [(e.id, e.type, e.state) for e in await tx.events(limit=1000)]
    finally:
        await store.close()


async def _until_async(check, what: str, timeout_s: float = 90.0, proc=None, log=None):
    deadline = time.monotonic() + timeout_s
    while not (result := await check()):
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"serve exited ({proc.returncode}) waiting for {what}:\n{log.read_text()[-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)
    return result


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_kill_9_with_events_in_flight_loses_none(tmp_path, request, backend):
    # SQLite: the config's data/ folder (read beside the running server: WAL); PostgreSQL: DUETASPAN_STORE_URL
    store_url = request.getfixturevalue("pg_url") if backend == "postgresql" else ""
    target = store_url or str(tmp_path / "data" / "duetaspan.sqlite3")
    port = free_port()  # the receiver's: nothing listens there until the server is dead
    hook = f"http://127.0.0.1:{port}/hook"
    llm, asr = _scripted()
    async with llm as llm_url, asr:
        (tmp_path / "agent.toml").write_text(_toml(llm_url, asr.transcribe_url, hook))
        with _serve(tmp_path, store_url, retrieval=False) as (base, proc):
            await wait_until_healthy(base, proc, tmp_path / "serve.log", what="serve")
            await asyncio.gather(_call(base, "CA-kill-1"), _call(base, "CA-kill-2"))
            want = {"call.started", "call.ended", "call.analyzed"}

            async def both_analyzed():
                rows = await _outbox(target)
                return rows if sum(t == "call.analyzed" for _, t, _ in rows) == 2 else None

            rows = await _until_async(both_analyzed, "both calls' events in the outbox", proc=proc,
                                      log=tmp_path / "serve.log")  # fmt: skip
            assert {t for _, t, _ in rows} == want and {s for _, _, s in rows} == {"pending"}
            # a fourth call has ended when the server dies, its analysis asked for and not answered
            llm.rules[0]["reply"] = hang()
            asked = len(llm.requests)
            await _call(base, "CA-kill-4")

            async def analysing():
                rows = await _outbox(target)
                analysis = [r for r in llm.requests[asked:] if (r.get("tools") or [{}])[0].get("function", {}).get("name") == TOOL]
                return analysis and len(rows) == 8  # its call.started and call.ended committed

            await _until_async(analysing, "the fourth call's analysis asked for", proc=proc, log=tmp_path / "serve.log")
            # a third call is live when the server dies: its journal and wav are on disk, its record is not
            live = asyncio.create_task(_live_call(base, "CA-kill-3"))
            journal = tmp_path / "calls" / "CA-kill-3.jsonl"

            async def live_and_started():
                frames = journal.exists() and journal.read_text().count('"type": "frame"') >= 10
                return frames and len(await _outbox(target)) == 9  # its call.started committed

            await _until_async(live_and_started, "the third call live", proc=proc, log=tmp_path / "serve.log")
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
            with contextlib.suppress(Exception):
                await live
        before = {i for i, _, _ in await _outbox(target)}
        assert len(before) == 9 and not (tmp_path / "calls" / "CA-kill-3.json").exists()
        assert "analysis" not in json.loads((tmp_path / "calls" / "CA-kill-4.json").read_text())
        old = time.time() - 3600  # the next start comes later than the kill (a restart at once: its second pass)
        os.utime(journal, (old, old))
        os.utime(tmp_path / "calls" / "CA-kill-4.json", (old, old))
        llm.rules[0]["reply"] = tool_call(TOOL, **ANALYSIS)
        receiver = Receiver()
        receiver_port_taken = await _start_on(receiver, port)
        try:
            with _serve(tmp_path, store_url, retrieval=False) as (base, proc):
                await _until(lambda: {g["event"]["id"] for g in receiver.got} >= before, "every event delivered",
                             proc=proc, log=tmp_path / "serve.log")  # fmt: skip

                async def all_delivered():
                    rows = await _outbox(target)
                    return len(rows) == 12 and {s for _, _, s in rows} == {"delivered"}

                await _until_async(all_delivered, "rows marked delivered")
        finally:
            await receiver.stop()
    assert receiver_port_taken and receiver.bad_signatures == 0
    got = [g["event"] for g in receiver.got]
    assert {e["call_id"] for e in got} == {"CA-kill-1", "CA-kill-2", "CA-kill-3", "CA-kill-4"}
    # every event in flight at the kill, the live call's end, which the next start wrote, and the analysis
    # the kill interrupted, which the next start made
    late = [e for e in got if e["id"] not in before]
    assert {e["id"] for e in got} >= before and {(e["type"], e["call_id"]) for e in late} == {
        ("call.ended", "CA-kill-3"), ("call.analyzed", "CA-kill-3"), ("call.analyzed", "CA-kill-4")}
    [analyzed] = [e for e in late if e["call_id"] == "CA-kill-4"]
    assert {k: analyzed["data"][k] for k in ANALYSIS} == ANALYSIS
    assert json.loads((tmp_path / "calls" / "CA-kill-4.json").read_text())["analysis"]["fields"] == {"city": "Tokyo"}
    [ended] = [e for e in late if e["type"] == "call.ended"]
    assert ended["data"]["outcome"] == "incomplete" and ended["data"]["ended_by"] == "crashed"
    record = json.loads((tmp_path / "calls" / "CA-kill-3.json").read_text())
    assert record["complete"] is False and record["recovered"]["redacted"] and record["frames"]


async def _start_on(receiver: Receiver, port: int) -> bool:
    from aiohttp import web

    app = web.Application()
    app.router.add_post("/hook", receiver._handle)
    receiver._runner = web.AppRunner(app)
    await receiver._runner.setup()
    await web.TCPSite(receiver._runner, "127.0.0.1", port).start()
    receiver.url = f"http://127.0.0.1:{port}/hook"
    return True
