"""Two real `duetaspan serve --sip` processes on ONE PostgreSQL database run one campaign (`[store] url`, as
several servers behind a proxy do): started through one server with the CLI, seen and dialled by both. The
callee (SIPp) proves from its own message trace that every number got exactly one INVITE dialog (none twice,
none lost); the store has one answered attempt per number, from both servers; the campaign's `max_concurrent`
holds over both (the callee never has more than 4 calls up); and each server recorded the calls it placed."""

from __future__ import annotations

import asyncio
import collections
import json
import re
import time

import pytest

from tests.adapters.sip.peer import free_udp_port, needs_sipp, run_sipp, scenario, sip_e2e, udp_bound
from tests.outbound.test_campaign_serve import MONDAY_NOON_UTC, _attempts, _cli, _poll, _serve
from tests.support import free_port, stop_process, wait_until_healthy

pytestmark = [needs_sipp, sip_e2e, pytest.mark.slow, pytest.mark.timeout(600)]

NUMBERS = 16
SERVERS = ("node-a", "node-b")
TOML = """
[store]
server_id = "{server_id}"
[campaign]
max_concurrent = 4
calls_per_minute = 6000
reserve_inbound = 0
max_attempts = 1
poll_s = 0.2
lease_s = 30
ring_timeout_s = 5
"""


def _callee_view(trace: str) -> tuple[dict[str, set[str]], int]:
    """What SIPp's message trace (`-trace_msg`, in the order SIPp saw them) says: the INVITE dialogs it received
    by the Request-URI's user, {user: {Call-ID, ...}} (a retransmitted INVITE has its original's Call-ID, a
    second dial of a number a new one), and the most calls up at once at the callee: from a dialog's first
    INVITE to the BYE it sent (the server learns of the end only after that BYE, so this never overcounts)."""
    dialogs: dict[str, set[str]] = collections.defaultdict(set)
    live: set[str] = set()
    most = 0
    for message in re.split(r"^-{20,}.*$", trace, flags=re.M)[1:]:
        head = re.search(r"message (received|sent)\b[^\n]*\n\s*(.+)", message)
        call_id = re.search(r"^(?:Call-ID|i):\s*(\S+)", message, re.M | re.I)
        if head is None or call_id is None:
            continue
        way, first, cid = head.group(1), head.group(2), call_id.group(1)
        invite = re.match(r"INVITE sip:([^@;>\s]+)@", first)
        if way == "received" and invite and cid not in dialogs[invite.group(1)]:
            dialogs[invite.group(1)].add(cid)
            live.add(cid)
            most = max(most, len(live))
        elif way == "sent" and first.startswith("BYE "):
            live.discard(cid)
    return dict(dialogs), most


async def test_two_serve_processes_on_one_postgresql_dial_every_number_once(tmp_path, pg_url, monkeypatch):
    monkeypatch.setenv("DUETASPAN_STORE_URL", pg_url)  # both servers, the CLI and `_attempts`: one database
    (tmp_path / "clock").write_text(str(MONDAY_NOON_UTC - time.time()))  # Monday 12:00 UTC: London is open
    for server_id in SERVERS:
        (tmp_path / f"{server_id}.toml").write_text(TOML.format(server_id=server_id))
    uas_port = free_udp_port()
    users = [f"+4420794608{i:02d}" for i in range(NUMBERS)]
    numbers = [f"sip:{u}@127.0.0.1:{uas_port}" for u in users]
    (tmp_path / "contacts.csv").write_text("to\n" + "".join(f"{n}\n" for n in numbers))
    trace = tmp_path / "uas-messages.txt"
    sipp = asyncio.create_task(run_sipp(
        "", tmp_path, "-sf", str(scenario("callee_holds_first", tmp_path, HOLD_CALLS=0, HOLD_MS=0, TALK_MS=300)), "-m", str(NUMBERS),
        "-rtp_echo", "-trace_msg", "-message_file", str(trace), port=uas_port, timeout_s=240, name="uas"))  # fmt: skip
    await udp_bound(uas_port)
    servers = []
    try:
        for server_id in SERVERS:  # --max-calls 3 each: neither alone can fill the campaign's 4
            port = free_port()
            proc, log = _serve(tmp_path, port, free_udp_port(), server_id, config=f"{server_id}.toml",
                               record_dir=f"calls-{server_id}")
            servers.append((f"http://127.0.0.1:{port}", proc, log, server_id))
        await asyncio.gather(*(wait_until_healthy(base, proc, tmp_path / f"{sid}.log", timeout_s=180)
                               for base, proc, _, sid in servers))  # fmt: skip
        first, second = servers[0][0], servers[1][0]
        rc, out, err = await _cli(tmp_path, "start", "contacts.csv", "--server", first, "--name", "shared", "--detach")
        assert rc == 0 and f"campaign shared started: {NUMBERS} numbers" in out, out + err
        status = await _poll(second, "shared", lambda s: s["state"] == "done", timeout_s=240)  # the other server
        got = await asyncio.wait_for(sipp, 120)
    finally:
        if not sipp.done():
            sipp.cancel()
        for _, proc, log, _ in servers:
            stop_process(proc)
            log.close()
    assert status["counts"] == {"answered": NUMBERS} and status["attempts"] == NUMBERS, status
    assert got.count("Successful call") == NUMBERS, got.screen[-2000:] + got.errors
    dialogs, most_at_once = _callee_view(trace.read_text(errors="replace"))
    assert sorted(dialogs) == sorted(users), dialogs  # none lost
    assert {u: len(ids) for u, ids in dialogs.items() if len(ids) != 1} == {}  # none dialled twice
    assert most_at_once <= 4  # the campaign's max_concurrent, over both servers, as the callee saw it
    attempts = await _attempts("shared")
    assert sorted(a["to_number"] for a in attempts) == sorted(numbers)
    assert {a["outcome"] for a in attempts} == {"answered"}
    owners = collections.Counter(a["owner"] for a in attempts)
    assert set(owners) == set(SERVERS), owners  # both servers dialled; the database kept them apart
    recorded: dict[str, list[str]] = {}
    for server_id in SERVERS:
        records = [json.loads(p.read_text()) for p in (tmp_path / f"calls-{server_id}").glob("*.json")]
        recorded[server_id] = [r["meta"]["called"] for r in records if r["meta"].get("campaign_id")]
    assert sorted(recorded["node-a"] + recorded["node-b"]) == sorted(users)  # each call recorded once
    assert {sid: len(called) for sid, called in recorded.items()} == dict(owners)  # by the server that placed it
