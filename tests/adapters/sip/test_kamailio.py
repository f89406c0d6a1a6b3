"""The SIP endpoint behind Kamailio (Debian `kamailio` 5.6: real, record-routing, stateful proxies), two in a
row so the route set's order counts: a call from SIPp through both to us, whose ACK, re-INVITE and our BYE
go through both proxies (their logs say so, and SIPp checks the BYE came from the first); and a call we place
through an authenticating Kamailio (407 digest challenge, answered with `[sip] user` and the password) and a
second one to a SIPp callee, whose ACK and our BYE take the 2xx's route set, reversed. Inbound through an
authenticating edge (the auth module, one static user and password): a SIPp caller that answers the 407
reaches the agent (the endpoint's, and a real `serve --sip`'s), its ACK and BYE through the edge; a wrong
password or none never reaches our endpoint; a captured Proxy-Authorization replayed from elsewhere is
refused (`one_time_nonce`, or `nonce_count` with qop=auth), while the caller's own retransmission of it is
answered, not challenged. Loopback only."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiosipua.auth import SipDigestAuth, build_credentials
from aiosipua.headers import parse_auth, stringify_auth

from tests.adapters.sip.leaks import checked_endpoint
from tests.adapters.sip.peer import (
    free_udp_port,
    needs_sipp,
    run_sipp,
    scenario,
    sip_e2e,
    udp_bound,
    wait_for,
)
from tests.adapters.sip.rawsip import Peer, header, invite, reply

KAMAILIO = shutil.which("kamailio")
MODULES = Path("/usr/lib/x86_64-linux-gnu/kamailio/modules")
pytestmark = [
    needs_sipp,
    sip_e2e,
    pytest.mark.skipif(
        KAMAILIO is None, reason="Kamailio not installed: apt-get install kamailio (scripts/test.sh)"
    ),
]

PASSWORD = "edge-secret-9"
REALM = "edge.duetaspan.invalid"

CONFIG = """#!KAMAILIO
debug=2
fork=yes
children=1
log_stderror=yes
listen=udp:127.0.0.1:{port}
mpath="{modules}/"
loadmodule "tm.so"
loadmodule "sl.so"
loadmodule "rr.so"
loadmodule "maxfwd.so"
loadmodule "textops.so"
loadmodule "pv.so"
loadmodule "siputils.so"
loadmodule "xlog.so"
{auth_module}
request_route {{
    xlog("L_NOTICE", "PROXY $rm $ru\\n");
    if (!mf_process_maxfwd_header("10")) {{ sl_send_reply("483", "Too Many Hops"); exit; }}
    if (has_totag()) {{
        if (loose_route()) {{ t_relay(); exit; }}
        if (is_method("ACK")) {{ if (t_check_trans()) {{ t_relay(); }} exit; }}
        sl_send_reply("404", "Not here"); exit;
    }}
    if (is_method("CANCEL")) {{ if (t_check_trans()) {{ t_relay(); }} exit; }}
    {auth}
    if (is_method("INVITE|SUBSCRIBE")) {{ record_route(); }}
    $du = "sip:127.0.0.1:{next_port}";
    xlog("L_NOTICE", "RELAY $rm $ci\\n");
    t_relay();
}}
"""
# The edge's digest check (the auth module, a static user and password): a retransmission is matched by tm
# first (so a single-use nonce does not challenge it), then an INVITE without valid credentials for `user` is
# challenged (407) statelessly, and a good one relayed without its Proxy-Authorization (consume_credentials).
AUTH = """if (is_method("INVITE")) {{
        t_check_trans();
        if (!pv_proxy_authenticate("{realm}", "{password}", "0")) {{
            $var(rc) = $rc;
            xlog("L_NOTICE", "EDGE refused $rm $ci from $si:$sp rc=$var(rc)\\n");
            if ($var(rc) == -4 || $var(rc) == -6) {{ proxy_challenge("{realm}", "{stale}"); exit; }}
            proxy_challenge("{realm}", "{qop}"); exit;
        }}
        if ($au != "{user}") {{ xlog("L_NOTICE", "EDGE refused $rm $ci user $au\\n"); sl_send_reply("403", "Forbidden"); exit; }}
        consume_credentials();
    }}"""
# What makes a captured answer single-use, and the challenge flags with it (1: qop=auth; 16: stale=true, for a
# reused (-6) or stale (-4) nonce): `one_time_nonce` (any UA: each nonce is good for one request, so every
# new INVITE is challenged) or `nonce_count` (UAs that do qop=auth: `nc` must grow).
GUARDS = {"one_time_nonce": 0, "nonce_count": 1}


@contextlib.asynccontextmanager
async def kamailio(
    tmp_path: Path,
    name: str,
    port: int,
    next_port: int,
    *,
    auth_user: str = "",
    guard: str = "one_time_nonce",
) -> AsyncIterator[Path]:
    """A Kamailio on 127.0.0.1:`port` sending new requests to `next_port`; with `auth_user` an authenticating
    edge (INVITEs need that user's digest, `PASSWORD`; `guard` against replays); yields its log (stderr)."""
    assert KAMAILIO is not None
    folder = tmp_path / name
    folder.mkdir()
    cfg = folder / "k.cfg"
    qop = GUARDS[guard]
    auth = (
        AUTH.format(realm=REALM, password=PASSWORD, user=auth_user, qop=qop, stale=qop | 16)
        if auth_user
        else ""
    )
    module = f'loadmodule "auth.so"\nmodparam("auth", "{guard}", 1)' if auth_user else ""
    cfg.write_text(
        CONFIG.format(port=port, next_port=next_port, modules=MODULES, auth=auth, auth_module=module)
    )
    log = folder / "kamailio.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            KAMAILIO, "-f", str(cfg), "-DD", "-E", "-w", str(folder), "-P", str(folder / "k.pid"),
            stdout=out, stderr=out,
        )  # fmt: skip
        try:
            bound, exited = asyncio.ensure_future(udp_bound(port)), asyncio.ensure_future(proc.wait())
            await asyncio.wait([bound, exited], return_when=asyncio.FIRST_COMPLETED)
            exited.cancel()
            if not bound.done():  # it exited (a bad config): say why at once
                bound.cancel()
                raise AssertionError(f"kamailio exited: {log.read_text(errors='replace')[-2000:]}")
            bound.result()
            yield log
        finally:
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 10)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


def record_routes(*ports: int) -> str:
    """A SIPp regexp (XML-escaped): the Record-Route headers of these proxies, one after the other, in order."""
    one = r"Record-Route: &lt;sip:127\.0\.0\.1:{};lr[^&]*&gt;"
    return r"[^\n]*\n".join(one.format(port) for port in ports)


def methods(log: Path) -> list[str]:
    return [
        line.split("PROXY ", 1)[1].split()[0]
        for line in log.read_text(errors="replace").splitlines()
        if "PROXY " in line
    ]


async def test_inbound_call_through_two_record_routing_kamailios(tmp_path):
    async def talk(call) -> None:
        await call.confirmed.wait()
        await asyncio.sleep(2.0)  # the caller's re-INVITE comes meanwhile; then we hang up (BYE)

    first, second = free_udp_port(), free_udp_port()
    async with checked_endpoint(talk) as ep:
        async with (
            kamailio(tmp_path, "k2", second, ep.port) as log2,
            kamailio(tmp_path, "k1", first, second) as log1,
        ):
            rr = record_routes(second, first)
            path = scenario("caller_via_proxies", tmp_path, USER="agent", AGENT_PORT=ep.port, FIRST_PORT=first,
                            RR_RE=rr)  # fmt: skip
            got = await run_sipp(f"127.0.0.1:{first}", tmp_path, "-sf", str(path), "-m", "1")
            assert got.rc == 0, got.output + got.errors
            await wait_for(lambda: len(ep.finished) == 1, what="the call over")
            call = next(iter(ep.finished.values()))
            assert call.end_reason == "agent ended the call"
            await wait_for(lambda: call.signalling.get("BYE") == "200", what="our BYE answered through both")
            for log in (log1, log2):  # the dialog's requests went through each proxy, not around it
                seen = methods(log)
                assert seen.count("INVITE") == 2 and seen.count("ACK") == 2 and "BYE" in seen, (log, seen)


async def test_outbound_call_through_an_authenticating_kamailio_and_a_second(tmp_path):
    async def short(call) -> None:
        await asyncio.sleep(1.0)

    first, second, callee = free_udp_port(), free_udp_port(), free_udp_port()
    rr = record_routes(second, first)
    path = scenario("callee_via_proxies", tmp_path, LAST_PORT=second, RR_RE=rr)
    sipp = asyncio.create_task(
        run_sipp("", tmp_path, "-sf", str(path), "-m", "1", port=callee, name="callee")
    )
    await udp_bound(callee)
    settings = dict(outbound_proxy=f"127.0.0.1:{first}", user="7001", register_password=PASSWORD)
    async with checked_endpoint(short, **settings) as ep:
        async with (
            kamailio(tmp_path, "k2", second, callee) as log2,
            kamailio(tmp_path, "k1", first, second, auth_user="7001") as log1,
        ):
            result = await ep.dial(f"sip:callee@127.0.0.1:{callee}")
            assert result.outcome == "answered", result.summary()
            got = await sipp
            assert got.rc == 0, got.output + got.errors
            call = result.call
            await wait_for(lambda: call.signalling.get("BYE") == "200", what="our BYE answered")
            assert methods(log1).count("INVITE") == 2  # challenged (407), then with our Proxy-Authorization
            assert methods(log2).count("INVITE") == 1  # only the authenticated one got past the edge
            for log in (log1, log2):
                seen = methods(log)
                assert "ACK" in seen and "BYE" in seen, (log, seen)


@pytest.mark.slow
async def test_sipstone_calls_through_a_kamailio_edge_to_serve_sip(tmp_path):
    """The reported failure: `serve --sip --model tiny-random` behind the standard record-routing edge; SIPp's
    SipStone calls (their ACK and BYE by the route set from our 200's Record-Route; SIPp's built-in `-sn uac`
    sends no Route, so it cannot pass any record-routing proxy) all complete through Kamailio."""
    from tests.adapters.sip.test_serve_sip import serve_sip

    edge = free_udp_port()
    async with serve_sip(tmp_path, "--max-calls", "3") as (_, sip_port, _proc):
        async with kamailio(tmp_path, "edge", edge, sip_port) as log:
            path = scenario("sipstone_routed", tmp_path, USER="agent", AGENT_PORT=sip_port, TALK_MS=1000)
            got = await run_sipp(f"127.0.0.1:{edge}", tmp_path, "-sf", str(path), "-m", "3", "-l", "3")
            assert got.rc == 0, got.output + got.errors
            assert got.count("Successful call") == 3 and got.count("Failed call") == 0
            seen = methods(log)
            assert seen.count("INVITE") == 3 and seen.count("ACK") == 3 and seen.count("BYE") == 3, seen


CALLER = "1001"  # the one user the authenticating edge admits (password `PASSWORD`)


def invites_seen(ep) -> list[str]:
    """The Call-IDs of the INVITEs that reached our endpoint (its server transactions, kept for 64*T1)."""
    assert ep.txns is not None
    return [call_id for (_, method, call_id) in ep.txns._server if method == "INVITE"]


async def authenticated_call(tmp_path: Path, ep, edge: int, *extra: str) -> None:
    """One SIPp call through the edge with `CALLER`'s password: challenged, ACKed, answered, hung up."""
    path = scenario("caller_auth_via_edge", tmp_path, USER="agent", AGENT_PORT=ep.port, AUTH_USER=CALLER,
                    PASSWORD=PASSWORD, RR_RE=record_routes(edge), TALK_MS=500)  # fmt: skip
    got = await run_sipp(f"127.0.0.1:{edge}", tmp_path, "-sf", str(path), "-m", "1", *extra)
    assert got.rc == 0, got.output + got.errors
    await wait_for(lambda: len(ep.finished) == 1, what="the call over")


async def final_answer(peer: Peer) -> bytes:
    """The first final response `peer` receives (provisional ones skipped)."""
    while True:
        data, _ = await peer.recv()
        if data.startswith(b"SIP/2.0 ") and not data.startswith(b"SIP/2.0 1"):
            return data


def agent_reached(reached: list[str]) -> Any:
    """A handler that notes who reached the agent and holds the call until it ends."""

    async def agent(call) -> None:
        reached.append(call.info.caller)
        await call.ended.wait()

    return agent


async def test_inbound_caller_authenticated_by_a_kamailio_edge(tmp_path):
    """SIPp calls through a Kamailio edge that challenges INVITEs (407, digest, a static user and password):
    the ACKed challenge, the INVITE with the caller's Proxy-Authorization relayed record-routed to us, the
    agent answers, the caller's ACK and BYE go through the edge by our 200's Record-Route."""
    reached: list[str] = []
    edge = free_udp_port()
    async with checked_endpoint(agent_reached(reached)) as ep:
        async with kamailio(tmp_path, "edge", edge, ep.port, auth_user=CALLER) as log:
            await authenticated_call(tmp_path, ep, edge)
            call = next(iter(ep.finished.values()))
            assert reached == [CALLER] and call.end_reason == "caller hung up (BYE)"
            assert len(invites_seen(ep)) == 1  # only the authenticated INVITE got past the edge
            seen, text = methods(log), log.read_text(errors="replace")
            # (counts are at least: on a slow box SIPp may resend a message, which Kamailio logs again)
            assert seen.count("INVITE") >= 2 and "rc=-5" in text  # the first had no credentials: 407
            assert text.count("RELAY INVITE") == 1  # the authenticated one, relayed once
            assert seen.count("ACK") >= 1 and seen.count("BYE") >= 1, seen  # the 2xx's ACK and the BYE
            # (the 407's ACK is absorbed by Kamailio's sl module before the script: it is not logged)


async def test_callers_without_the_password_never_reach_the_endpoint(tmp_path):
    """A wrong password (challenged again, 407) and no credentials at all (407): Kamailio refuses both and our
    endpoint never sees an INVITE, no call, no slot."""
    reached: list[str] = []
    edge = free_udp_port()
    async with checked_endpoint(agent_reached(reached)) as ep:
        async with kamailio(tmp_path, "edge", edge, ep.port, auth_user=CALLER) as log:
            path = scenario("caller_wrong_password", tmp_path, USER="agent", AGENT_PORT=ep.port,
                            AUTH_USER=CALLER, PASSWORD="not-" + PASSWORD)  # fmt: skip
            got = await run_sipp(f"127.0.0.1:{edge}", tmp_path, "-sf", str(path), "-m", "1")
            assert got.rc == 0, got.output + got.errors  # 407, ACK, wrong digest, 407 again, ACK
            with Peer() as stranger:  # no credentials, the same URI
                await stranger.send(
                    invite(ep.port, stranger.port, branch="z9hG4bKn1", call_id="nocred-1"), edge
                )
                challenge = (await stranger.until(b"SIP/2.0 407"))[-1]
                assert f'realm="{REALM}"' in header(challenge, "proxy-authenticate")
            text = log.read_text(errors="replace")
            assert "rc=-2" in text and "nocred-1" in text  # the wrong password (-2), the missing one (-5)
            assert "RELAY" not in text and methods(log).count("INVITE") >= 3
            assert invites_seen(ep) == [] and reached == [] and not ep.finished and not ep.calls


@pytest.mark.parametrize("guard", list(GUARDS))
async def test_a_replayed_proxy_authorization_is_refused_by_the_edge(tmp_path, guard):
    """A caller's authenticated INVITE, captured (SIPp's message trace) and replayed by another host with its
    own Call-ID and branch but the same Request-URI and Proxy-Authorization (same nonce): the edge refuses it
    (407, stale), it never reaches us. `one_time_nonce`: each nonce good for one request; `nonce_count` (with
    qop=auth): the `nc` must grow."""
    reached: list[str] = []
    edge = free_udp_port()
    async with checked_endpoint(agent_reached(reached)) as ep:
        async with kamailio(tmp_path, "edge", edge, ep.port, auth_user=CALLER, guard=guard) as log:
            trace = tmp_path / "messages.log"
            await authenticated_call(tmp_path, ep, edge, "-trace_msg", "-message_file", str(trace))
            captured = [ln.strip() for ln in trace.read_text(errors="replace").splitlines()
                        if ln.lower().startswith("proxy-authorization:")]  # fmt: skip
            assert len(captured) == 1, captured
            assert ("qop=auth" in captured[0]) is (guard == "nonce_count")
            with Peer() as attacker:
                replay = invite(ep.port, attacker.port, branch="z9hG4bKr1", call_id="replayed-1",
                                extra=captured[0] + "\r\n")  # fmt: skip
                await attacker.send(replay, edge)
                refused = await final_answer(attacker)  # relayed, it would be our 200
                assert refused.startswith(b"SIP/2.0 407"), refused
                assert "stale=true" in header(refused, "proxy-authenticate").lower()
            reason = {"one_time_nonce": "rc=-6", "nonce_count": "rc=-4"}[guard]  # nonce reused; nc not above
            assert (
                f"EDGE refused INVITE replayed-1 from 127.0.0.1:{attacker.port} {reason}" in log.read_text()
            )
            assert len(invites_seen(ep)) == 1 and reached == [CALLER] and len(ep.finished) == 1


def ack_of(request: bytes, answer: bytes, *, branch: str = "", route: str = "") -> bytes:
    """The ACK of `answer` to INVITE `request`: on the INVITE's Via (a non-2xx's), or on a new `branch` by the
    2xx's Record-Route (`route`)."""
    uri, seq = request.split(b" ")[1].decode(), header(request, "cseq").split()[0]
    via = header(request, "via")
    if branch:
        via = re.sub(r"branch=[^;]+", f"branch={branch}", via)
    routes = f"Route: {route}\r\n" if route else ""
    return (
        f"ACK {uri} SIP/2.0\r\nVia: {via}\r\n{routes}From: {header(request, 'from')}\r\n"
        f"To: {header(answer, 'to')}\r\nCall-ID: {header(request, 'call-id')}\r\nCSeq: {seq} ACK\r\n"
        "Max-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
    ).encode()


async def test_a_retransmitted_authenticated_invite_is_not_taken_for_a_replay(tmp_path):
    """The caller resends its authenticated INVITE (same branch): Kamailio's tm answers the copy (the edge
    config runs `t_check_trans()` before the digest check); with `one_time_nonce` the copy would otherwise
    be challenged as a replay (407, nonce reused) in the middle of the call."""

    async def agent(call) -> None:
        await call.confirmed.wait()
        await asyncio.sleep(0.2)  # then we hang up (BYE, through the edge)

    edge = free_udp_port()
    async with checked_endpoint(agent) as ep:
        async with kamailio(tmp_path, "edge", edge, ep.port, auth_user=CALLER) as log:
            with Peer() as caller:
                first = invite(ep.port, caller.port, branch="z9hG4bKq1", call_id="resent-1")
                await caller.send(first, edge)
                challenge = (await caller.until(b"SIP/2.0 407"))[-1]
                await caller.send(ack_of(first, challenge), edge)
                params = parse_auth(header(challenge, "proxy-authenticate"))
                creds = build_credentials(
                    SipDigestAuth(CALLER, PASSWORD), params, "INVITE", f"sip:agent@127.0.0.1:{ep.port}"
                )
                assert creds is not None
                signed = invite(ep.port, caller.port, branch="z9hG4bKq2", call_id="resent-1", cseq=2,
                                extra=f"Proxy-Authorization: {stringify_auth(creds)}\r\n")  # fmt: skip
                for _ in range(2):  # the INVITE and its retransmission
                    await caller.send(signed, edge)
                answers = await caller.until(b"SIP/2.0 200")
                ok = answers[-1]
                await caller.send(
                    ack_of(signed, ok, branch="z9hG4bKq3", route=header(ok, "record-route")), edge
                )
                bye = [m for m in await caller.until(b"BYE ") if m.startswith(b"BYE ")][-1]
                await caller.send(reply(bye, "200 OK"), edge)
                await wait_for(lambda: len(ep.finished) == 1, what="the call over")
                call = ep.finished["resent-1"]
                await wait_for(lambda: call.signalling.get("BYE") == "200", what="our BYE answered")
            assert not [a for a in answers if a.startswith(b"SIP/2.0 407")], answers
            assert "rc=-6" not in log.read_text() and invites_seen(ep) == ["resent-1"]
            assert methods(log).count("INVITE") == 3  # the challenged one, the signed one, its copy


@pytest.mark.slow
async def test_an_authenticated_caller_through_a_kamailio_edge_reaches_serve_sip(tmp_path):
    """The same authenticating edge in front of a real `serve --sip --model tiny-random`: the caller that
    answers the 407 is relayed to the agent, talks, and hangs up, its ACK and BYE through the edge."""
    from tests.adapters.sip.test_serve_sip import serve_sip

    edge = free_udp_port()
    async with serve_sip(tmp_path, "--max-calls", "1") as (_, sip_port, _proc):
        async with kamailio(tmp_path, "edge", edge, sip_port, auth_user=CALLER) as log:
            path = scenario("caller_auth_via_edge", tmp_path, USER="agent", AGENT_PORT=sip_port, AUTH_USER=CALLER,
                            PASSWORD=PASSWORD, RR_RE=record_routes(edge), TALK_MS=1000)  # fmt: skip
            got = await run_sipp(f"127.0.0.1:{edge}", tmp_path, "-sf", str(path), "-m", "1")
            assert got.rc == 0, got.output + got.errors
            assert got.count("Successful call") == 1
            text, seen = log.read_text(errors="replace"), methods(log)
            assert "rc=-5" in text and text.count("RELAY INVITE") == 1  # challenged, then relayed once
            assert "ACK" in seen and "BYE" in seen, seen
        calls = tmp_path / "calls"
        await wait_for(lambda: len(list(calls.glob("*.json"))) == 1, timeout_s=60, what="the call's record")
        record = json.loads(next(calls.glob("*.json")).read_text())
        assert record["complete"] is True and record["meta"]["caller"] == CALLER
        assert record["meta"]["bye"] == {"by": "caller"} and any(t["who"] == "agent" for t in record["turns"])
