"""Lifecycle webhooks of a SIP call end to end: a real `duetaspan serve --sip` process, a SIPp call (its
SipStone `uac` scenario: INVITE, RTP, BYE), a real HTTP receiver: `call.started`, `call.answered` and `call.ended`
arrive, in order, for the same call, signed as the contract says (checked here with hashlib/hmac, not our `verify`).
And a SIP call's redaction and analysis on PostgreSQL: SIPp streams a recorded question as RTP, the scripted
ASR hears a card number in it (with word times); `call.ended`'s turns carry `[card]`, `call.analyzed` the
analysis, the stored wav's caller channel is silent where the words were, and the record, the analysing LLM's
request and serve's log never hold the digits."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from duetaspan.webhooks.analysis import TOOL
from tests.adapters.sip.peer import caller_stream, needs_sipp, run_sipp, scenario, sip_e2e, wait_for
from tests.adapters.sip.test_serve_sip import serve_sip
from tests.support import has_card, load_ulaw, worker_sip_toml
from tests.webhooks.conftest import SECRET, Receiver
from tests.webhooks.test_serve_webhooks import ANALYSIS, _caller_silent_over_redactions, _scripted

pytestmark = [needs_sipp, sip_e2e, pytest.mark.slow]


def _signed(body: bytes, header: str) -> bool:
    parts = [p.split("=", 1) for p in header.split(",")]
    t = next(v for k, v in parts if k == "t")
    want = hmac.new(SECRET.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return any(k == "v1" and hmac.compare_digest(v, want) for k, v in parts)


async def test_a_sip_call_sends_signed_lifecycle_events(tmp_path):
    receiver = Receiver()
    headers: list[tuple[bytes, str]] = []
    handle = receiver._handle

    async def keep(request):  # the raw body and header as they came over the wire
        headers.append((await request.read(), request.headers.get("Duetaspan-Signature", "")))
        return await handle(request)

    receiver._handle = keep  # type: ignore[method-assign]
    hook = await receiver.start()
    (tmp_path / "agent.toml").write_text(
        f'[sip]\n{worker_sip_toml()}[webhooks]\nurls = ["{hook}"]\ntimeout_s = 3\nmax_backoff_s = 1\n'
        '[server]\ndata_dir = "data"\n'
    )
    env = {"DUETASPAN_WEBHOOK_SECRET": SECRET}
    try:
        async with serve_sip(tmp_path, "--max-calls", "1", "--config", str(tmp_path / "agent.toml"), env=env) as (
            _base, sip_port, proc,
        ):  # fmt: skip
            got = await run_sipp(f"127.0.0.1:{sip_port}", tmp_path, "-sn", "uac", "-m", "1", "-d", "1500")
            assert got.rc == 0, got.output + got.errors
            types = lambda: [g["event"]["type"] for g in receiver.got]  # noqa: E731
            await wait_for(lambda: "call.ended" in types(), timeout_s=60, what="call.ended at the receiver")
            assert proc.poll() is None
    finally:
        await receiver.stop()
    events = [g["event"] for g in receiver.got]
    assert [e["type"] for e in events] == ["call.started", "call.answered", "call.ended"], events
    assert receiver.bad_signatures == 0 and len({e["call_id"] for e in events}) == 1
    assert len({e["id"] for e in events}) == 3 and [e["created"] for e in events] == sorted(e["created"] for e in events)
    started, ended = events[0]["data"], events[2]["data"]
    assert started["transport"] == "sip" and ended["transport"] == "sip" and ended["recorded"] is True
    assert headers and all(_signed(body, header) for body, header in headers)


async def test_a_sip_call_is_redacted_and_analysed_on_postgresql(tmp_path, pg_url):
    llm, asr = _scripted()  # the ASR hears a card number in whatever the caller says
    ulaw = load_ulaw("time_tokyo")  # a recorded question: voice detection cuts it into utterances for the ASR
    pcap, talk_ms = caller_stream(tmp_path, ulaw, 0)  # the question, then 1 on the keypad (RFC 4733)
    path = scenario("caller_audio", tmp_path, PT=0, CODEC="PCMU", PCAP=pcap, TALK_MS=talk_ms + 500)
    receiver = Receiver()
    async with llm as llm_url, asr:
        hook = await receiver.start()
        (tmp_path / "agent.toml").write_text(
            f'[sip]\n{worker_sip_toml()}[router]\nbase_url = "{llm_url}"\nmodel = "scripted"\n'
            f'api_key_env = "DUETASPAN_TEST_KEY"\n[asr]\nkind = "transcribe"\nurl = "{asr.transcribe_url}"\n'
            f'[webhooks]\nurls = ["{hook}"]\ntimeout_s = 3\nmax_backoff_s = 1\n[analysis]\nenabled = true\n'
            'success_question = "Did the caller get the time?"\n[analysis.schema]\ntype = "object"\n'
            'required = ["city"]\nproperties = { city = { type = "string" } }\n[privacy]\nredact = ["card"]\n'
        )
        env = {"DUETASPAN_WEBHOOK_SECRET": SECRET, "DUETASPAN_TEST_KEY": "k", "DUETASPAN_STORE_URL": pg_url}
        flags = ("--max-calls", "1", "--config", str(tmp_path / "agent.toml"))
        try:
            async with serve_sip(tmp_path, *flags, env=env) as (_base, sip_port, proc):
                got = await run_sipp(f"127.0.0.1:{sip_port}", tmp_path, "-sf", str(path), "-m", "1")
                assert got.rc == 0, got.output + got.errors
                types = lambda: [g["event"]["type"] for g in receiver.got]  # noqa: E731
                await wait_for(lambda: "call.analyzed" in types(), timeout_s=90, what="call.analyzed")
                assert proc.poll() is None
        finally:
            await receiver.stop()
    events = [g["event"] for g in receiver.got]
    want = ["call.started", "call.answered", "call.ended", "call.analyzed"]
    assert [e["type"] for e in events] == want, [(e["type"], e["id"]) for e in events]  # ids: time-ordered
    assert receiver.bad_signatures == 0 and len({e["call_id"] for e in events}) == 1
    ended, analyzed = events[2]["data"], events[3]["data"]
    assert ended["transport"] == "sip" and asr.requests  # the caller's RTP reached the ASR
    caller_turns = [t for t in ended["turns"] if t["who"] == "caller"]
    assert caller_turns and all("[card]" in t["text"] and "4111" not in t["text"] for t in caller_turns)
    assert {k: analyzed[k] for k in ANALYSIS} == ANALYSIS
    [record_path] = (tmp_path / "calls").glob("*.json")
    record = json.loads(record_path.read_text())
    assert record["analysis"]["fields"] == {"city": "Tokyo"} and record["turns"] == ended["turns"]
    # the recording too: the caller's channel silent where the ASR's word times put the card number
    spans = _caller_silent_over_redactions(record, record_path.with_suffix(".wav"))
    assert spans and all(s["kind"] == "card" and s["samples"] > 0 for s in spans), spans
    [asked] = [r for r in llm.requests if r.get("tools") and r["tools"][0]["function"]["name"] == TOOL]
    assert "[card]" in json.dumps(asked) and not has_card(json.dumps(asked))  # it reads the redacted turns
    for path in [*(tmp_path / "calls").glob("*.json*"), tmp_path / "serve.log"]:
        assert not has_card(path.read_text(errors="replace")), path.name
