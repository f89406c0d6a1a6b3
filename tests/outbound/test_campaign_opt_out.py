"""A callee who asks never to be called again, end to end through the server `duetaspan serve --sip` runs: a
campaign started over the admin API dials a SIPp callee that talks (a recorded voice, looped, as RTP) until it
is hung up on; on `<ret>` question capture sends the callee's words to the ASR (the scripted one hears "please
never call me again"), the router's LLM (the scripted one) calls the built-in `opt_out`, the side-effect
policy lets it run (its keyword check takes "never call me again" as asking: the tool's own phrases; no LLM
judge is scripted, so the check alone decides), and the tool puts the number on the store's do-not-call list with source `opt_out` and hangs up (our
BYE reaches SIPp, whose scenario fails a call nobody hangs up). A retry rule for `answered` would dial the
number again: its turn finds it on the list (`dnc`), and so does the same number in a second campaign; one
attempt, one call in all.

Real: `agent.serve(sip=...)` (the code `duetaspan serve --sip` runs: admin API on a port, store, scheduler,
SIP endpoint, after-call indexing), SIP and RTP with SIPp, voice detection on the callee's RTP, the router and
its policy, the tool, the SQLite store. Scripted: what the ASR hears, what the LLM answers, and the `<ret>`:
forced on the live call (as `tests/reliability/rig.py` does), because a random-weight model samples one on
its own about once in 30 s of call, or not at all, so a separate `serve` process could not be made to ask.
The server runs in the test's process for that one reason, on the tests' tiny-random engine that never asks
by itself (the forced `<ret>`s are the only ones)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import time

import aiohttp
import pytest

from duetaspan.agent import Agent
from duetaspan.store import open_store
from duetaspan.testing import ScriptedASR, ScriptedLLM
from duetaspan.testing.llm import tool_call
from duetaspan.testing.sessions import capture_sessions
from tests.adapters.sip.peer import free_udp_port, needs_sipp, run_sipp, scenario, sip_e2e, udp_bound
from tests.support import free_port, load_ulaw, worker_sip_toml

pytestmark = [needs_sipp, sip_e2e, pytest.mark.slow, pytest.mark.timeout(300)]

ADMIN = "opt-out-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
MONDAY_NOON_UTC = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.UTC).timestamp()  # London's calling window is open
HEARD = "please never call me again"
AGENT_TOML = """
[persona]
prompt = "You call people about their appointment."
[router]
base_url = "{llm}"
model = "scripted"
api_key_env = "DUETASPAN_TEST_KEY"
[asr]
kind = "transcribe"
url = "{asr}"
[tools]
builtins = ["opt_out", "end_call"]
[campaign]
max_concurrent = 1
calls_per_minute = 600
reserve_inbound = 0
max_attempts = 3
poll_s = 0.2
ring_timeout_s = 5
[campaign.retry]
answered = {{ delay_s = 0.5 }}
[sip]
{sip}"""


async def _json(client: aiohttp.ClientSession, method: str, url: str, body: dict | None = None):
    async with client.request(method, url, json=body, headers=AUTH) as r:
        assert r.status in (200, 201), await r.text()
        return await r.json() if r.content_type == "application/json" else await r.text()


async def _until(check, what: str, server: asyncio.Task, timeout_s: float = 120.0):
    """Poll the coroutine `check()` until it returns something true (the server still up)."""
    deadline = time.monotonic() + timeout_s
    while not (result := await check()):
        if server.done():
            server.result()  # its exception, if it failed
            raise AssertionError(f"the server stopped while waiting for {what}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)
    return result


async def test_a_callee_who_opts_out_is_never_dialled_again(tmp_path, monkeypatch, tiny_engine):
    monkeypatch.setenv("DUETASPAN_ADMIN_TOKEN", ADMIN)
    monkeypatch.setenv("DUETASPAN_TEST_KEY", "k")
    monkeypatch.setenv("DUETASPAN_TEST_CLOCK_FILE", str(tmp_path / "clock"))
    (tmp_path / "clock").write_text(str(MONDAY_NOON_UTC - time.time()))
    llm = ScriptedLLM({"rules": [
        {"match": HEARD, "reply": tool_call("opt_out", reason=HEARD)},
    ]})  # fmt: skip
    asr = ScriptedASR().hears(HEARD)
    (tmp_path / "voice.ulaw").write_bytes(load_ulaw("greeting"))  # a voice for voice detection to find
    uas_port = free_udp_port()
    number = f"sip:+442079460700@127.0.0.1:{uas_port}"
    speaks = scenario("callee_speaks", tmp_path, AUDIO=tmp_path / "voice.ulaw", BYE_TIMEOUT_MS=30000)
    # -m 1: SIPp answers one call, then exits (a second dial of the number would find nobody there)
    sipp = asyncio.create_task(run_sipp("", tmp_path, "-sf", str(speaks), "-m", "1", port=uas_port,
                                        timeout_s=150, name="callee"))  # fmt: skip
    await udp_bound(uas_port)
    port, sip_port = free_port(), free_udp_port()
    base = f"http://127.0.0.1:{port}"
    async with llm as llm_url, asr:
        (tmp_path / "agent.toml").write_text(AGENT_TOML.format(llm=llm_url, asr=asr.transcribe_url,
                                                               sip=worker_sip_toml()))  # fmt: skip
        agent = Agent.from_config(tmp_path / "agent.toml", engine=tiny_engine, record_dir=tmp_path / "calls",
                                  max_calls=1)  # fmt: skip
        sessions = capture_sessions(agent)
        server = asyncio.create_task(agent.serve(sip={"port": sip_port}, host="127.0.0.1", port=port))
        try:
            async with aiohttp.ClientSession() as client:

                async def healthy() -> bool:
                    try:
                        async with client.get(base + "/health") as r:
                            return r.status == 200
                    except aiohttp.ClientError:
                        return False

                forced: list[float] = []

                async def opted_out() -> list:
                    numbers = (await _json(client, "GET", base + "/admin/dnc"))["numbers"]
                    # the model asks; again only after a retrieval's deadline (2.5 s) passed with no opt-out
                    if not numbers and (not forced or time.monotonic() - forced[-1] > 3.0):
                        sessions[0].service.slot.force_ret()
                        forced.append(time.monotonic())
                    return numbers

                async def heard() -> bool:  # the call up, the callee's voice detected and transcribed
                    return bool(sessions and sessions[0].service.slot is not None and asr.requests)

                async def done(name: str):
                    status = await _json(client, "GET", f"{base}/admin/campaigns/{name}")
                    return status if status["state"] == "done" else None

                await _until(healthy, "the server", server)
                contacts = f"to\n{number}\n"
                await _json(client, "POST", base + "/admin/campaigns", {"name": "first", "csv": contacts})
                await _until(heard, "the callee's voice transcribed", server)
                dnc = await _until(opted_out, "the opt-out", server, timeout_s=60)
                first = await _until(lambda: done("first"), "the first campaign done", server)
                got = await asyncio.wait_for(sipp, 60)
                export = await _json(client, "GET", base + "/admin/campaigns/first/export")
                await _json(client, "POST", base + "/admin/campaigns", {"name": "second", "csv": contacts})
                second = await _until(lambda: done("second"), "the second campaign done", server)
        finally:
            server.cancel()
            await asyncio.gather(server, return_exceptions=True)
            if not sipp.done():
                sipp.cancel()
    # the one call: answered, and ended by our BYE
    assert got.count("Successful call") == 1 and got.count("Failed call") == 0, got.screen[-2000:]
    assert [(n["number"], n["source"]) for n in dnc] == [("+442079460700", "opt_out")]
    # the first campaign: one attempt (answered); the retry's turn found the number on the list
    assert first["attempts"] == 1 and first["counts"] == {"dnc": 1}, first
    assert export.splitlines()[1].split(",")[:3] == [number, "1", "dnc"]
    assert second["attempts"] == 0 and second["counts"] == {"dnc": 1}, second  # never dialled
    [record_path] = (tmp_path / "calls").glob("*.json")
    record = json.loads(record_path.read_text())
    store = await open_store(os.environ["DUETASPAN_STORE_URL"])  # the test's own (tests/conftest.py)
    try:
        async with store.transaction() as tx:
            attempts = [(a["n"], a["outcome"], a["call_id"]) for a in await tx.attempts(first["id"])]
    finally:
        await store.close()
    assert attempts == [(1, "answered", record["call_id"])]
    tools = [e for e in record["retrieval_events"] if e.get("kind") == "tool"]
    assert tools and {(t["tool"], t["ok"]) for t in tools} == {("opt_out", True)}, record["retrieval_events"]
    assert record["meta"]["bye"]["by"] == "us" and record["meta"]["campaign_id"] == first["id"]
