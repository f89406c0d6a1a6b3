"""`duetaspan call sip:... --server URL` (the contract) against a real `duetaspan serve --sip` process, with
SIPp as the callee: the command asks the server's `POST /admin/sip/dial` (admin token from
`$DUETASPAN_ADMIN_TOKEN`, in the header only) to place the call, prints the outcome in one line and exits 0
when answered (the call runs on the agent; its record says `direction: "outbound"` and has the RTP figures of
SIPp echoing the agent's audio), 2 when busy (SIPp answers 486), 3 when it rings past `--timeout` (CANCEL);
without the token, with a wrong one, or with the token in the query string it is refused (401) and nothing
is dialled; malformed requests (a URI
smuggling a header) get 400; no server, a server without `--sip` (409) and a local-demo server started
without an admin token (403: this admin route is never open without one) are one clear error line each."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import aiohttp
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
from tests.adapters.sip.test_serve_sip import _metric, _text, serve_sip
from tests.support import REPO_ROOT, free_port

pytestmark = [needs_sipp, sip_e2e, pytest.mark.slow]

ADMIN = "dial-test-admin-token-0123456789"
CLI = [sys.executable, "-m", "duetaspan"]


async def call_cli(*args: str, token: str | None = None) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DUETASPAN_ADMIN_TOKEN"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    if token is not None:
        env["DUETASPAN_ADMIN_TOKEN"] = token
    proc = await asyncio.create_subprocess_exec(
        *CLI, "call", *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 180)
    return proc.returncode or 0, out.decode(), err.decode()


async def post(base: str, body: object, headers: dict[str, str] | None = None, query: str = "") -> tuple:
    async with aiohttp.ClientSession() as client:
        async with client.post(f"{base}/admin/sip/dial{query}", json=body, headers=headers or {}) as r:
            return r.status, await r.text()


def _records(folder) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


async def test_call_cli_dials_through_serve_sip_answered_busy_and_refused(tmp_path):
    env = {"DUETASPAN_ADMIN_TOKEN": ADMIN}
    calls = tmp_path / "calls"
    async with serve_sip(tmp_path, "--max-calls", "2", env=env) as (base, _sip_port, proc):
        # refused first: nothing may be dialled without the admin token
        port = free_udp_port()
        target = f"sip:service@127.0.0.1:{port}"
        for token in (None, "wrong-token"):
            rc, out, err = await call_cli(target, "--server", base, "--timeout", "5", token=token)
            assert rc == 1 and out == "", (rc, out, err)
            assert err.strip().splitlines() == [
                f"duetaspan call: error: {base} refused the admin token (401): set $DUETASPAN_ADMIN_TOKEN "
                "to the server's admin token"
            ], err
        assert (await post(base, {"to": target}, query=f"?token={ADMIN}"))[0] == 401  # header only
        for smuggled in ("7001\r\nX-Evil: 1", "7001;transport=tcp", "7001@evil.example"):  # our From URI
            status, text = await post(
                base, {"to": target, "from": smuggled}, {"Authorization": f"Bearer {ADMIN}"}
            )
            assert status == 400 and "from" in text and "user part" in text, (smuggled, text)
        status, text = await post(
            base, {"to": target + ">\r\nX-Evil: 1"}, {"Authorization": f"Bearer {ADMIN}"}
        )
        assert status == 400 and "SIP URI" in text
        status, text = await post(base, {"to": "+15551234567"}, {"Authorization": f"Bearer {ADMIN}"})
        assert status == 400 and "SIP URI" in text
        async with aiohttp.ClientSession() as client:
            metrics = await _text(client, base + "/metrics")
        assert sum(_metric(metrics, f'duetaspan_sip_dial_total{{outcome="{o}"}}') for o in
                   ("answered", "busy", "no-answer", "failed")) == 0  # fmt: skip

        # answered: SIPp answers, echoes the agent's RTP for 3 s and hangs up (one 200 per INVITE, no 180:
        # callee_holds_first.xml says why SIPp's 180-then-200 callee aborts a call whose INVITE came again)
        answers = scenario("callee_holds_first", tmp_path, HOLD_CALLS=0, HOLD_MS=0, TALK_MS=3000)
        callee = asyncio.create_task(run_sipp(
            "", tmp_path, "-sf", str(answers), "-m", "1", "-rtp_echo", port=port, name="callee",
        ))  # fmt: skip
        await udp_bound(port)
        rc, out, err = await call_cli(
            target, "--server", base, "--from", "7001", "--timeout", "20", token=ADMIN
        )
        assert rc == 0, (rc, out, err)
        line = out.strip()
        assert line.startswith(f"answered {target}: call ") and line.endswith(" is on the agent"), out
        call_id = line.split(": call ", 1)[1].split(" ", 1)[0]
        got = await callee
        assert got.rc == 0, got.output + got.errors  # SIPp got our ACK, its BYE was answered

        # busy: SIPp answers 486
        busy_port = free_udp_port()
        busy = asyncio.create_task(run_sipp("", tmp_path, "-sf", str(scenario("callee_busy", tmp_path)), "-m", "1",
                                            port=busy_port, name="busy"))  # fmt: skip
        await udp_bound(busy_port)
        rc, out, err = await call_cli(f"sip:7002@127.0.0.1:{busy_port}", "--server", base, token=ADMIN)
        assert (rc, out.strip()) == (2, f"busy sip:7002@127.0.0.1:{busy_port}: 486 Busy Here"), (rc, out, err)
        got = await busy
        assert got.rc == 0, got.output + got.errors  # callee_busy.xml requires our ACK of its 486

        # no answer: SIPp rings past --timeout 2 and waits for our CANCEL
        ring_port = free_udp_port()
        rings = asyncio.create_task(run_sipp("", tmp_path, "-sf", str(scenario("callee_rings", tmp_path)), "-m", "1",
                                             port=ring_port, name="rings"))  # fmt: skip
        await udp_bound(ring_port)
        rc, out, err = await call_cli(
            f"sip:7003@127.0.0.1:{ring_port}", "--server", base, "--timeout", "2", token=ADMIN
        )
        assert rc == 3 and out.startswith(f"no-answer sip:7003@127.0.0.1:{ring_port}: no answer in 2 s"), (
            rc,
            out,
            err,
        )
        assert (await rings).rc == 0  # SIPp got the CANCEL

        def recorded() -> bool:
            return len([r for r in _records(calls) if r.get("meta", {}).get("direction") == "outbound"]) == 3

        await wait_for(recorded, timeout_s=60, what="both placed calls' records")
        async with aiohttp.ClientSession() as client:
            for _ in range(300):
                metrics = await _text(client, base + "/metrics")
                if _metric(metrics, 'duetaspan_rtp_jitter_seconds_count{transport="sip"}') >= 1:
                    break
                await asyncio.sleep(0.1)
        assert proc.poll() is None
    records = {r["call_id"]: r for r in _records(calls)}
    answered = records[call_id]
    meta = answered["meta"]
    assert (meta["transport"], meta["direction"], meta["outcome"], meta["sip_status"]) == (
        "sip", "outbound", "answered", 200)  # fmt: skip
    assert meta["caller"] == "7001" and meta["dial"]["to"] == target
    assert answered["complete"] is True and len(answered["frames"]) > 10  # it ran on the agent
    rtp = answered["rtp"]  # SIPp echoed the agent's RTP back: real packets, counted by aiortp
    assert rtp["packets_received"] > 20 and rtp["packets_sent"] >= rtp["packets_received"] * 0.5, rtp
    assert 0.0 <= rtp["loss_fraction"] <= 1.0 and 0.0 <= rtp["jitter_ms"] < 200.0, rtp
    refused = next(r for r in records.values() if r["meta"].get("outcome") == "busy")
    assert refused["meta"]["sip_status"] == 486 and refused["summary"]["ended_by"] == "busy"
    assert _metric(metrics, 'duetaspan_sip_dial_total{outcome="answered"}') == 1
    assert _metric(metrics, 'duetaspan_sip_dial_total{outcome="busy"}') == 1
    assert _metric(metrics, 'duetaspan_sip_dial_total{outcome="no-answer"}') == 1
    assert (
        _metric(metrics, 'duetaspan_rtp_packets_received_total{transport="sip"}') == rtp["packets_received"]
    )
    assert _metric(metrics, 'duetaspan_rtp_packets_lost_total{transport="sip"}') == rtp["packets_lost"]
    log = (tmp_path / "serve.log").read_text()
    assert ADMIN not in log


async def test_call_cli_says_when_no_server_or_no_sip_is_there(tmp_path):
    nowhere = f"http://127.0.0.1:{free_port()}"
    rc, out, err = await call_cli("sip:7002@127.0.0.1:5070", "--server", nowhere, token=ADMIN)
    assert rc == 1 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"duetaspan call: error: no server at {nowhere}: "), err
    rc, _out, err = await call_cli("sip:7002@127.0.0.1:5070", token=ADMIN)
    assert rc == 1 and "pass --server http://HOST:PORT" in err
    rc, _out, err = await call_cli("+15551234567", "--server", nowhere, token=ADMIN)
    assert rc == 1 and f"no server at {nowhere}" in err  # a number goes to the server's POST /admin/dial

    from tests.reliability.test_roles import serve

    async with serve(tmp_path, twilio=False, admin=ADMIN) as server:  # a WebRTC-only server: no SIP endpoint
        rc, out, err = await call_cli("sip:7002@127.0.0.1:5070", "--server", server.base, token=ADMIN)
        no_token = await post(server.base, {"to": "sip:7002@127.0.0.1:5070"})
    assert rc == 1 and out == "", (rc, out, err)
    assert err.strip() == (
        f"duetaspan call: error: {server.base} does not serve SIP: start it with duetaspan serve --sip"
    )
    assert no_token[0] == 401  # the admin check comes first there too

    # a local-demo `serve --sip` (loopback, no public URL) opens /admin/drain without a token, never this
    (tmp_path / "demo").mkdir()
    async with serve_sip(tmp_path / "demo") as (base, _sip_port, _proc):
        rc, out, err = await call_cli("sip:7002@127.0.0.1:5070", "--server", base)
    assert rc == 1 and out == "", (rc, out, err)
    assert err.startswith(f"duetaspan call: error: {base} refused the dial (403): placing calls needs the admin "
                          "token even on a local demo server"), err  # fmt: skip
