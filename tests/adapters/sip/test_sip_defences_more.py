"""More SIP defences proved (issue #32), each test failing when its defence is removed (SECURITY.md names them):
the inbound digest (`SipGate`, called directly): an answer computed for another Request-URI is refused
(`_same_target`), a nonce count of 0 is refused, a nonce is good for one request whatever its count (the same
or a later `nc` is a replay: `stale`) and from whichever source it is replayed (nonces are deliberately not
bound to a source address: trunks send from several); with a bare UDP caller (`tests.adapters.sip.rawsip`):
the same Call-ID on another branch while the first INVITE rings gets `482 Loop Detected` while a copy on the
first branch gets our 180 again (one call), the INVITE's Record-Route is copied into our 180 as well as our
200; with a bare UDP callee that rings and never answers our CANCEL: the CANCEL is retransmitted (timer E:
T1, 2*T1, 4*T1, then every T2) and given up at 64*T1 (logged; nothing left running); and unparsable datagrams
reach `/metrics` (`duetaspan_sip_refused_total{reason="unparsable"}`) through `serve`'s own wiring
(`adapters/sip/serve.py::build_endpoint`)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import statistics
import time
from types import SimpleNamespace

import pytest
from aiosipua.auth import SipDigestAuth, build_credentials
from aiosipua.headers import parse_auth, stringify_auth
from aiosipua.message import SipRequest

from duetaspan.adapters.sip.call import SipActionFailed
from duetaspan.adapters.sip.endpoint import SipSettings
from duetaspan.adapters.sip.gate import SipGate
from duetaspan.adapters.sip.serve import build_endpoint
from duetaspan.observability.metrics import ServeMetrics
from tests.adapters.sip.leaks import checked_endpoint
from tests.adapters.sip.peer import free_udp_port, sip_e2e, wait_for
from tests.adapters.sip.rawsip import Peer, ack, ack_error, header, invite, reply
from tests.support import worker_sip_settings

# the same lane as test_sip_defences.py: the SIP tests mostly wait on timers (little CPU)
pytestmark = [sip_e2e, pytest.mark.serial]
T1 = 0.05  # 64*T1 = 3.2 s, T2 = 8*T1 = 0.4 s
URI = "sip:agent@127.0.0.1:5060"
ROUTE_SET = b"<sip:edge2.test;lr>, <sip:10.0.0.1:5060;lr>, <sip:edge1.test;lr;ftag=x>"


# --- the inbound digest, on the gate itself -------------------------------------------------------------------
def _gate() -> SipGate:
    return SipGate(allow=["10.0.0.0/8"], auth_user="trunk", auth_password="s3cret")


def _signed(
    gate: SipGate, *, request_uri: str = URI, digest_uri: str = URI, nc: int = 1, nonce: str = ""
) -> SipRequest:
    """An INVITE to `request_uri` whose Authorization is the right answer (user trunk, password s3cret) to a
    fresh challenge of `gate` (or to `nonce`), computed for `digest_uri` with nonce count `nc`."""
    challenge = parse_auth(gate.challenge_header())
    if nonce:
        challenge.params["nonce"] = nonce
    creds = build_credentials(SipDigestAuth("trunk", "s3cret"), challenge, "INVITE", digest_uri, nonce_count=nc,
                              cnonce="0a1b2c3d")  # fmt: skip
    assert creds is not None
    req = SipRequest(method="INVITE", uri=request_uri)
    req.headers.set_single("Authorization", stringify_auth(creds))
    return req


def _nonce(req: SipRequest) -> str:
    return parse_auth(req.get_header("authorization") or "").params["nonce"]


def test_a_digest_computed_for_another_request_uri_is_refused():
    gate = _gate()
    # the response is right for the uri= it names: only `_same_target` tells it is not this request's
    assert gate.check(_signed(gate, digest_uri="sip:agent@198.51.100.9:5060"), "192.0.2.1") == "refuse"
    assert gate.check(_signed(gate, digest_uri="sip:admin@127.0.0.1:5060"), "192.0.2.1") == "refuse"
    assert gate.check(_signed(gate, digest_uri="sip:agent@127.0.0.1:5070"), "192.0.2.1") == "refuse"
    assert gate.refusals == {}  # counting is the endpoint's (`replayed`, `forbidden`)
    # what the request names is accepted: the same URI, or its host and port without a user (SIPp writes that)
    assert gate.check(_signed(gate), "192.0.2.1") == "allow"
    assert gate.check(_signed(gate, digest_uri="sip:127.0.0.1:5060"), "192.0.2.1") == "allow"
    assert gate.check(_signed(gate, request_uri="sip:agent@127.0.0.1", digest_uri="sip:127.0.0.1"),
                      "192.0.2.1") == "allow"  # fmt: skip


def test_a_nonce_is_good_for_one_request_whatever_its_count():
    gate = _gate()
    assert gate.check(_signed(gate, nc=0), "192.0.2.1") == "refuse"  # a count starts at 1 (RFC 7616 3.4)
    first = _signed(gate, nc=1)
    nonce = _nonce(first)
    assert gate.check(first, "192.0.2.1") == "allow"
    assert gate.check(first, "192.0.2.1") == "stale"  # the same nc again: a replay (a fresh 401, stale=true)
    later = _signed(gate, nc=2, nonce=nonce)  # a right answer with the next count: still a second request
    assert gate.check(later, "192.0.2.1") == "stale"
    assert gate.check(_signed(gate, nc=2), "192.0.2.1") == "allow"  # a fresh nonce, whatever its first count


def test_an_answer_without_the_offered_qop_is_refused():
    """Our challenge offers qop="auth"; an Authorization that drops it (RFC 2069's digest: no qop, nc, cnonce,
    the response over nonce and HA2 only) is a downgrade RFC 7616 3.4 does not allow: refused, even when its
    response is right for what it names."""
    gate = _gate()
    challenge = parse_auth(gate.challenge_header())
    challenge.params.pop("qop")  # the answer a client gives when it ignores the offered qop
    creds = build_credentials(SipDigestAuth("trunk", "s3cret"), challenge, "INVITE", URI)
    assert creds is not None and "qop" not in creds.params and "nc" not in creds.params
    req = SipRequest(method="INVITE", uri=URI)
    req.headers.set_single("Authorization", stringify_auth(creds))
    assert gate.check(req, "192.0.2.1") == "refuse"
    assert gate.check(_signed(gate), "192.0.2.1") == "allow"  # the same caller with qop=auth gets in


def test_a_valid_answer_replayed_from_another_source_is_refused():
    gate = _gate()
    captured = _signed(gate)
    assert gate.check(captured, "192.0.2.1") == "allow"
    assert gate.check(captured, "198.51.100.7") == "stale"  # the attacker's copy, from anywhere: refused
    # by design the nonce is not bound to the address it was sent to (a trunk challenged from one address may
    # answer from another): what stops a replay is the one-time nonce, above
    assert gate.check(_signed(gate), "203.0.113.5") == "allow"


def test_two_challenges_in_the_same_millisecond_get_distinct_nonces():
    """A trunk's burst: two INVITEs challenged in one millisecond; each right answer lets its own call in (the
    nonce was `hex(ms).HMAC` alone: the second answer was refused as a replay of the first)."""
    gate = _gate()
    now = time.time()
    nonces = [parse_auth(gate.challenge_header(now)).params["nonce"] for _ in range(2)]
    assert nonces[0] != nonces[1]
    assert [gate.check(_signed(gate, nonce=n), "192.0.2.1") for n in nonces] == ["allow", "allow"]


# --- loops and record-routing, against a running endpoint ------------------------------------------------------
async def short(call) -> None:
    await call.confirmed.wait()
    await asyncio.sleep(0.2)


async def _hang_up(caller: Peer, ep, call_id: str) -> None:
    """The agent hangs up: answer our BYE, and wait for the call to be over."""
    bye = [m for m in await caller.until(b"BYE ") if m.startswith(b"BYE ")][-1]
    await caller.send(reply(bye, "200 OK"), ep.port)
    await wait_for(lambda: ep.finished.get(call_id) is not None, what="the call over")
    await wait_for(lambda: ep.finished[call_id].signalling.get("BYE") == "200", what="our BYE answered")


async def _answers_on(caller: Peer, branch: str) -> list[bytes]:
    """The answers on `branch`, up to (and with) the first that is not `100 Trying`."""
    got = []
    while True:
        data, _ = await caller.recv()
        if data.startswith(b"SIP/2.0 ") and f"branch={branch};" in header(data, "via") + ";":
            got.append(data)
            if not data.startswith(b"SIP/2.0 100"):
                return got


async def test_the_same_call_id_on_another_branch_while_ringing_gets_482():
    async with checked_endpoint(short, answer_after_ms=2500) as ep:
        with Peer() as caller:
            first = invite(ep.port, caller.port, branch="z9hG4bKl1", call_id="loop-1")
            await caller.send(first, ep.port)
            ringing = (await caller.until(b"SIP/2.0 180"))[-1]
            # the same INVITE back on another branch (forked, or looped through a proxy)
            looped = invite(ep.port, caller.port, branch="z9hG4bKl2", call_id="loop-1")
            await caller.send(looped, ep.port)
            got = await _answers_on(caller, "z9hG4bKl2")
            assert [a.split(b" ", 2)[1] for a in got] == [b"482"], got  # not 100, 180, 200: a second call
            loop_detected = got[-1]
            await caller.send(ack_error(looped, loop_detected), ep.port)  # else retransmitted until ACKed
            await caller.send(first, ep.port)  # a copy on the first branch: the same call, our 180 again
            again = (await caller.until(b"SIP/2.0 180"))[-1]
            assert again == ringing
            ok = (await caller.until(b"SIP/2.0 200"))[-1]
            assert "z9hG4bKl1" in header(ok, "via") and header(ok, "to") == header(ringing, "to")
            assert len(ep.calls) + len(ep.answering) == 1  # one call (unACKed: answering)
            await caller.send(ack(ep.port, caller.port, ok), ep.port)
            await _hang_up(caller, ep, "loop-1")
            assert ep.txns.retransmissions_absorbed >= 1


async def test_record_route_is_copied_into_our_180_and_200():
    # two headers, the second with two entries
    routes = (
        "Record-Route: <sip:edge2.test;lr>\r\nRecord-Route: " + ROUTE_SET.decode().split(", ", 1)[1] + "\r\n"
    )
    async with checked_endpoint(short) as ep:
        with Peer() as caller:
            request = invite(ep.port, caller.port, branch="z9hG4bKr1", call_id="rr-1", extra=routes)
            await caller.send(request, ep.port)
            got = await caller.until(b"SIP/2.0 200")
            ringing = [m for m in got if m.startswith(b"SIP/2.0 180")]
            assert ringing, got
            for answer in (ringing[0], got[-1]):  # the route set, in the INVITE's order (RFC 3261 12.1.1)
                values = [ln.split(b":", 1)[1].strip() for ln in answer.split(b"\r\n\r\n")[0].split(b"\r\n")
                          if ln.lower().startswith(b"record-route:")]  # fmt: skip
                assert b", ".join(values) == ROUTE_SET, answer
            await caller.send(ack(ep.port, caller.port, got[-1]), ep.port)
            await _hang_up(caller, ep, "rr-1")


# --- our CANCEL, never answered -------------------------------------------------------------------------------
async def test_our_cancel_is_retransmitted_capped_at_t2_then_given_up(caplog):
    caplog.set_level(logging.WARNING, logger="duetaspan.sip")
    loop = asyncio.get_running_loop()
    t2 = 8 * T1
    with Peer() as callee:  # rings, then never answers our CANCEL (nor the INVITE)
        async with checked_endpoint(short, timer_t1_s=T1) as ep:
            dial = asyncio.ensure_future(ep.dial(f"sip:7002@127.0.0.1:{callee.port}", ring_timeout_s=0.3))
            first = (await callee.until(b"INVITE "))[-1]
            await callee.send(reply(first, "180 Ringing"), ep.port)
            cancels: list[tuple[float, bytes]] = []
            deadline = loop.time() + 10 + 64 * T1
            while loop.time() < deadline:  # every CANCEL, until 1 s without one after 64*T1
                quiet = 1.0 if cancels and loop.time() - cancels[0][0] > 64 * T1 else 64 * T1
                try:
                    data, _ = await callee.recv(quiet)
                except TimeoutError:
                    break
                if data.startswith(b"CANCEL "):
                    cancels.append((loop.time(), data))
            result = await asyncio.wait_for(dial, 10)
            assert result.outcome == "no-answer", result.summary()
            assert cancels, "no CANCEL sent"
            branch = header(first, "via").split("branch=")[1].split(";")[0]
            assert all(f"branch={branch}" in header(c, "via") for _, c in cancels)  # the INVITE's branch
            at = [t - cancels[0][0] for t, _ in cancels]
            gaps = [b - a for a, b in itertools.pairwise(at)]
            # timer E: T1, 2*T1, 4*T1 (a sleep is never short), then every T2 until 64*T1
            assert len(gaps) >= 7, at
            assert all(gaps[i] >= 0.9 * T1 * 2**i for i in range(3)), gaps
            assert 0.75 * t2 <= statistics.median(gaps[3:]) <= 1.3 * t2, gaps  # capped (uncapped: 0.8, 1.6 s)
            assert at[-1] <= 64 * T1 + 0.5, at  # given up at 64*T1
            cancelling = lambda: [k for k in ep.txns._client if k[1] == "CANCEL"]  # noqa: E731
            await wait_for(lambda: not cancelling(), what="the CANCEL transaction over")
    given_up = [r.getMessage() for r in caplog.records if r.getMessage().startswith("SIP CANCEL")]
    assert given_up and "given up" in given_up[0], given_up


# --- unparsable datagrams in /metrics, as `serve` wires them --------------------------------------------------
async def test_unparsable_datagrams_are_counted_in_metrics():
    metrics = ServeMetrics(engine=None, transports=("sip",))
    agent = SimpleNamespace(started=True, runner=None, admission=None)
    settings = SipSettings(host="127.0.0.1", port=free_udp_port(), **worker_sip_settings())
    endpoint = build_endpoint(settings, agent, metrics)
    await endpoint.start()
    try:
        assert b'duetaspan_sip_refused_total{reason="unparsable"} 0.0' in metrics.render()
        with Peer() as flood:
            for i in range(3):
                await flood.send(b"\x00\xffnot sip %d\r\n\r\n" % i, endpoint.port)
            started = time.monotonic()
            while b'duetaspan_sip_refused_total{reason="unparsable"} 3.0' not in metrics.render():
                refused = [ln for ln in metrics.render().decode().splitlines() if "sip_refused_total" in ln]
                assert time.monotonic() - started < 20, refused
                await asyncio.sleep(0.05)
        assert endpoint.refusals == {"unparsable": 3}
    finally:
        await endpoint.aclose()


# --- keep-alives and connection limits over TCP --------------------------------------------------------------
def _options(port: int, n: int, source: tuple[str, int]) -> bytes:
    return (
        f"OPTIONS sip:agent@127.0.0.1:{port} SIP/2.0\r\n"
        f"Via: SIP/2.0/TCP {source[0]}:{source[1]};branch=z9hG4bKka{n}\r\n"
        f"From: <sip:trunk@127.0.0.1>;tag=ka{n}\r\nTo: <sip:agent@127.0.0.1>\r\nCall-ID: keepalive-{n}\r\n"
        f"CSeq: {n} OPTIONS\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
    ).encode()


async def test_a_crlf_ping_over_tcp_gets_its_pong_and_the_connection_goes_on():
    """RFC 5626 4.4.1: a flow kept alive with CRLFCRLF pings expects a CRLF pong, else the peer takes the
    connection for dead and opens another; CRLFs before a start line are ignored (RFC 3261 7.5), so the
    next request on the connection is answered."""
    async with checked_endpoint(short, transport="tcp") as ep:
        reader, writer = await asyncio.open_connection("127.0.0.1", ep.port)
        source = writer.get_extra_info("sockname")
        try:
            writer.write(b"\r\n\r\n")
            await writer.drain()
            assert await asyncio.wait_for(reader.readexactly(2), 20) == b"\r\n"  # the pong
            writer.write(b"\r\n\r\n" + _options(ep.port, 1, source))  # a ping, then a request at once
            await writer.drain()
            assert await asyncio.wait_for(reader.readexactly(2), 20) == b"\r\n"
            status = await asyncio.wait_for(reader.readline(), 20)
            assert status.startswith(b"SIP/2.0 200"), status
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
            writer.write(b"\r\n" + _options(ep.port, 2, source))  # one stray CRLF before the start line
            await writer.drain()
            status = await asyncio.wait_for(reader.readline(), 20)
            assert status.startswith(b"SIP/2.0 200"), status
            assert ep.refusals["unparsable"] == 0
        finally:
            writer.close()


async def test_tcp_connections_are_limited_in_all_not_only_per_source():
    """`max_connections` (256 by default) bounds the open connections whatever their sources (a botnet opens
    a few from each of many addresses): past it a new one is closed at once and counted (`connections`)."""
    async with checked_endpoint(short, transport="tcp") as ep:
        ep.uas.transport.max_connections, ep.uas.transport.max_per_source = 2, 100
        held = [await asyncio.open_connection("127.0.0.1", ep.port) for _ in range(2)]
        await wait_for(lambda: ep.uas.transport._open.total() == 2, what="two connections open")
        reader, writer = await asyncio.open_connection("127.0.0.1", ep.port)
        assert await asyncio.wait_for(reader.read(), 20) == b""  # the third: closed at once
        writer.close()
        assert ep.refusals["connections"] == 1
        for _reader, held_writer in held:
            held_writer.close()
        await wait_for(lambda: ep.uas.transport._open.total() == 0, what="the held connections closed")


# --- our REFER, never answered ---------------------------------------------------------------------------------
async def test_our_refer_is_retransmitted_to_the_callers_contact_then_the_transfer_fails_cleanly():
    """A transfer (`transfer_call`: REFER, RFC 3515) to a caller whose side never answers it: the REFER goes to
    the caller's Contact, is retransmitted on one branch (timer E) and given up at 64*T1; the tool gets a clear
    `SipActionFailed` (no answer to the REFER), and the call then ends with our BYE as any call does."""
    failures: list[str] = []

    async def transfers(call) -> None:
        await call.confirmed.wait()
        try:
            await call.transfer_call("sip:desk@127.0.0.1", drain_s=0)
        except SipActionFailed as exc:
            failures.append(str(exc))

    loop = asyncio.get_running_loop()
    with Peer() as caller:
        async with checked_endpoint(transfers, timer_t1_s=T1) as ep:
            await caller.send(invite(ep.port, caller.port, branch="z9hG4bKrf1", call_id="refer-unanswered"), ep.port)
            ok = (await caller.until(b"SIP/2.0 200"))[-1]
            await caller.send(ack(ep.port, caller.port, ok), ep.port)
            refers: list[tuple[float, bytes]] = []
            deadline = loop.time() + 64 * T1 + 20
            bye = None
            while bye is None and loop.time() < deadline:
                data, _ = await caller.recv(64 * T1 + 20)
                if data.startswith(b"REFER "):
                    refers.append((loop.time(), data))
                elif data.startswith(b"BYE "):
                    bye = data
            assert bye is not None, "no BYE after the failed transfer"
            await caller.send(reply(bye, "200 OK", to_tag="caller1"), ep.port)
            await wait_for(lambda: len(ep.finished) == 1, what="the call over")
    assert failures and "no answer to the REFER" in failures[0], failures
    assert len(refers) >= 5, [round(t - refers[0][0], 2) for t, _ in refers]
    assert all(r.startswith(f"REFER sip:t@127.0.0.1:{caller.port}".encode()) for _, r in refers)  # the Contact
    assert len({header(r, "via").split("branch=")[1].split(";")[0] for _, r in refers}) == 1  # one transaction
    assert all(header(r, "refer-to").strip("<>").startswith("sip:desk@127.0.0.1") for _, r in refers)
    span = refers[-1][0] - refers[0][0]
    assert span <= 64 * T1 + 0.5, span  # given up at 64*T1
