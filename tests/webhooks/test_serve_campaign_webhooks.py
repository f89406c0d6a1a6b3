"""Campaign lifecycle webhooks end to end: a real `duetaspan serve --sip` process on a real store (a SQLite file,
a database on a real PostgreSQL server), SIPp as the callees, a real HTTP receiver that verifies every
signature with `duetaspan.webhooks.verify`. A campaign of two numbers (and one on the do-not-call list)
started through the admin API sends `campaign.started`, one `campaign.attempt` per number (its `call_id` the
call whose `call.*` events came too; the suppressed number's says `dnc`, no call) and, once, `campaign.done`
with the final counts; a second campaign waiting for its calling window is paused,
resumed and cancelled (`campaign.paused`, `.running`, `.cancelled`, and no `campaign.done`). Every body fits
the JSON Schema printed in docs/webhooks.md; the receiver refuses the first delivery with a 503 and the retry
carries the same id and the same bytes."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from typing import IO

import aiohttp
import jsonschema
import pytest

from tests.adapters.sip.peer import (
    free_udp_port,
    needs_sipp,
    run_sipp,
    scenario,
    sip_e2e,
    udp_bound,
    wait_for,
)
from tests.store.conftest import store_target  # noqa: F401
from tests.support import REPO_ROOT, free_port, stop_process, wait_until_healthy
from tests.webhooks.conftest import SECRET, Receiver

pytestmark = [needs_sipp, sip_e2e, pytest.mark.slow, pytest.mark.timeout(400)]

ADMIN = "campaign-admin-token-0123456789"
SUPPRESSED = "+442079460999"  # on the do-not-call list: its attempt event says `dnc`, no call is placed
MONDAY_NOON_UTC = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.UTC).timestamp()  # London open, Auckland at 01:00
AGENT_TOML = """
[campaign]
max_concurrent = 2
calls_per_minute = 600
reserve_inbound = 0
max_attempts = 1
poll_s = 0.2
ring_timeout_s = 10
[webhooks]
urls = ["{hook}"]
timeout_s = 3
max_backoff_s = 1
"""


def _schema() -> dict:
    doc = (REPO_ROOT / "docs" / "webhooks.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```json\n(.*?)^```", doc, re.S | re.M)
    return json.loads(blocks[-1])  # the page's JSON Schema (the last json block)


def _serve(tmp_path, env: dict[str, str], port: int, sip_port: int) -> tuple[subprocess.Popen, IO[bytes]]:
    cmd = [sys.executable, "-m", "duetaspan", "-v", "serve", "--sip", "--sip-port", str(sip_port), "--host",
           "127.0.0.1", "--port", str(port), "--model", "tiny-random", "--no-retrieval", "--record-dir",
           str(tmp_path / "calls"), "--max-calls", "3", "--config", str(tmp_path / "agent.toml")]  # fmt: skip
    log = (tmp_path / "serve.log").open("wb")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path), log


async def _admin(client: aiohttp.ClientSession, base: str, path: str, body: dict | None = None) -> dict:
    async with client.post(base + path, json=body or {}, headers={"Authorization": f"Bearer {ADMIN}"}) as r:
        assert r.status in (200, 201), await r.text()
        return await r.json()


async def test_campaign_events_are_delivered_signed_and_in_the_documented_shape(tmp_path, store_target):  # noqa: F811
    receiver = Receiver(statuses=[503])  # the first delivery fails: it is retried with the same id and bytes
    hook = await receiver.start()
    (tmp_path / "agent.toml").write_text(AGENT_TOML.replace("{hook}", hook))
    (tmp_path / "clock").write_text(str(MONDAY_NOON_UTC - time.time()))
    uas_port = free_udp_port()
    numbers = [f"sip:+4420794607{i:02d}@127.0.0.1:{uas_port}" for i in range(2)]
    talks = scenario("callee_holds_first", tmp_path, HOLD_CALLS=0, HOLD_MS=0, TALK_MS=300)
    sipp = asyncio.create_task(run_sipp("", tmp_path, "-sf", str(talks), "-m", "2", "-rtp_echo",
                                        port=uas_port, timeout_s=180, name="uas"))  # fmt: skip
    await udp_bound(uas_port)
    port, sip_port = free_port(), free_udp_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "DUETASPAN_ADMIN_TOKEN": ADMIN,
           "DUETASPAN_WEBHOOK_SECRET": SECRET, "DUETASPAN_STORE_URL": store_target,
           "DUETASPAN_TEST_CLOCK_FILE": str(tmp_path / "clock")}  # fmt: skip
    proc, log = _serve(tmp_path, env, port, sip_port)
    events = lambda: [g["event"] for g in receiver.got if g["status"] == 200]  # noqa: E731
    types = lambda: [e["type"] for e in events()]  # noqa: E731
    try:
        await wait_until_healthy(base, proc, tmp_path / "serve.log")
        async with aiohttp.ClientSession() as client:
            await _admin(client, base, "/admin/dnc", {"add": [SUPPRESSED]})  # suppressed when its turn comes
            csv = "to\n" + "".join(f"{n}\n" for n in [*numbers, SUPPRESSED])
            two = await _admin(client, base, "/admin/campaigns", {"name": "two", "csv": csv})
            nz = await _admin(client, base, "/admin/campaigns",
                              {"name": "nz", "csv": f"to,timezone\n{numbers[0]},Pacific/Auckland\n"})  # fmt: skip
            for action in ("pause", "resume", "cancel"):
                await _admin(client, base, f"/admin/campaigns/nz/{action}")
        # ... and the refused first delivery's retry (up to max_backoff_s after it, plus a poll: on a busy
        # machine that can come after all the other events)
        retried = lambda: bool(receiver.got) and receiver.got[0]["event"]["id"] in {e["id"] for e in events()}  # noqa: E731
        await wait_for(lambda: "campaign.done" in types() and "campaign.cancelled" in types()
                       and types().count("call.ended") == 2 and retried(), timeout_s=180,
                       what="the campaign events and the refused one's retry")  # fmt: skip
        assert (await asyncio.wait_for(sipp, 60)).count("Successful call") == 2
        await asyncio.sleep(1.0)  # a duplicate campaign.done would have been delivered by now (poll_s 0.2)
        assert proc.poll() is None
    finally:
        if not sipp.done():
            sipp.cancel()
        stop_process(proc)
        log.close()
        await receiver.stop()
    assert receiver.bad_signatures == 0
    schema = _schema()
    for got in receiver.got:  # every delivery, the refused one too: verified by the receiver, in the schema
        jsonschema.validate(json.loads(got["body"]), schema)
    # the refused first delivery came again: same id, same bytes
    refused = receiver.got[0]
    assert refused["status"] == 503
    again = [g for g in receiver.got[1:] if g["event"]["id"] == refused["event"]["id"]]
    assert again and all(g["body"] == refused["body"] for g in again)
    # once each (by id), ids unique per event
    delivered = events()
    assert len({e["id"] for e in delivered}) == len(delivered), [e["type"] for e in delivered]
    of = lambda cid: [e for e in delivered if e["type"].startswith("campaign.") and e["data"]["campaign_id"] == cid]  # noqa: E731
    two_events, nz_events = of(two["id"]), of(nz["id"])
    assert all(e["call_id"] is None for e in two_events + nz_events if e["type"] != "campaign.attempt")
    # the two-number campaign: started, one attempt per number, done last with the counts
    by_type = {t: [e for e in two_events if e["type"] == t] for t in {e["type"] for e in two_events}}
    assert sorted(by_type) == ["campaign.attempt", "campaign.done", "campaign.started"], two_events
    [started], [done], attempts = by_type["campaign.started"], by_type["campaign.done"], by_type["campaign.attempt"]
    assert started["data"] == {"campaign_id": two["id"], "name": "two", "contacts": 3}
    [dnc] = [a for a in attempts if a["data"]["to"] == SUPPRESSED]
    assert dnc["call_id"] is None and dnc["data"]["outcome"] == "dnc" and dnc["data"]["attempts"] == 0
    attempts.remove(dnc)
    assert sorted(a["data"]["to"] for a in attempts) == sorted(numbers)
    assert all(a["data"]["outcome"] == "answered" and a["data"]["final"] and a["data"]["attempt"] == 1
               for a in attempts)  # fmt: skip
    ended = {e["call_id"] for e in delivered if e["type"] == "call.ended"}
    assert {a["call_id"] for a in attempts} == ended and len(ended) == 2  # the attempts name their calls
    assert done["data"] == {"campaign_id": two["id"], "name": "two", "contacts": 3, "attempts": 2,
                            "counts": {"answered": 2, "dnc": 1}}  # fmt: skip
    assert not [e for e in delivered if e["type"].startswith("dnc.")]  # not a webhook event: not sent
    assert started["created"] <= min(a["created"] for a in attempts) <= done["created"]
    # the campaign waiting for Auckland's window: its state changes; never dialled, never done
    assert sorted(e["type"] for e in nz_events) == sorted(
        ["campaign.started", "campaign.paused", "campaign.running", "campaign.cancelled"])
    assert all(e["data"]["name"] == "nz" for e in nz_events)
