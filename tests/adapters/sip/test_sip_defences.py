"""The SIP endpoint against peers that do not answer and peers that attack, with a bare UDP peer
(`tests.adapters.sip.rawsip`) and T1 shortened so that 64*T1 comes in seconds: our INVITE retransmitted
(timer A) then given up (`failed`, `no response`); our BYE retransmitted (timer E) until answered, else
`no response`; a REGISTER with no answer registered again after a backoff, then NAT keep-alives (OPTIONS);
a replayed digest answer refused (401 stale) while a retransmission of the same request is not a replay;
a flood of unparsable or refused datagrams counted and logged once; TCP connections limited per source and
closed when idle; session timers only for callers that ask; `host = 0.0.0.0` without `advertised_ip` refused."""

from __future__ import annotations

import asyncio
import logging
import socket

import numpy as np
import pytest
from aiosipua.auth import SipDigestAuth, build_credentials
from aiosipua.headers import parse_auth, stringify_auth

from duetaspan.adapters.sip.endpoint import SipEndpoint, SipSettings
from tests.adapters.sip.leaks import checked_endpoint
from tests.adapters.sip.peer import sip_e2e, wait_for
from tests.adapters.sip.rawsip import Peer, ack, ack_error, header, invite, reply

# serial: its calls mostly wait on SIP timers and SIPp (about 1 s of CPU in a minute of calls): in the serial
# lane beside the niced workers they fill that lane's idle time instead of holding a worker (CONTRIBUTING)
pytestmark = [sip_e2e, pytest.mark.serial]
T1 = 0.05  # 64*T1 = 3.2 s


async def short(call) -> None:
    await call.confirmed.wait()
    await asyncio.sleep(0.5)


async def echo(call) -> None:
    async for pcm in call.media.audio():
        call.media.send_audio(pcm.astype(np.float32) / 32768)


def branches(messages: list[bytes], method: bytes) -> list[str]:
    return [header(m, "via").split("branch=")[1].split(";")[0] for m in messages if m.startswith(method)]


async def test_our_invite_is_retransmitted_then_given_up():
    with Peer() as callee:  # a host that swallows everything
        async with checked_endpoint(short, timer_t1_s=T1) as ep:
            dial = asyncio.ensure_future(ep.dial(f"sip:7002@127.0.0.1:{callee.port}", ring_timeout_s=30))
            got = await callee.collect(64 * T1 + 0.5)
            result = await asyncio.wait_for(dial, 10)
        assert (result.outcome, result.status, result.reason) == ("failed", None, "no response"), (
            result.summary()
        )
        sent = branches(got, b"INVITE ")
        assert len(sent) >= 6 and len(set(sent)) == 1  # timer A: T1, 2*T1, 4*T1, ... on the same branch
        assert not ep.answering and ep.txns.pending() == 0


async def test_our_bye_is_retransmitted_until_answered_else_no_response():
    for answer_after in (3, None):  # the third BYE answered; never answered
        with Peer() as caller:
            async with checked_endpoint(short, timer_t1_s=T1) as ep:
                await caller.send(
                    invite(ep.port, caller.port, branch="z9hG4bKi1", call_id=f"bye{answer_after}"), ep.port
                )
                ok = (await caller.until(b"SIP/2.0 200"))[-1]
                await caller.send(ack(ep.port, caller.port, ok), ep.port)
                byes = []
                while len(byes) < (answer_after or 99):
                    try:
                        data, _ = await caller.recv(64 * T1 + 1)
                    except TimeoutError:
                        break
                    if data.startswith(b"BYE "):
                        byes.append(data)
                if answer_after:
                    await caller.send(reply(byes[-1], "200 OK"), ep.port)
                await wait_for(lambda: len(ep.finished) == 1, what="the call over")
                signalling = next(iter(ep.finished.values())).signalling
                want = "200" if answer_after else "no response"
                await wait_for(lambda: signalling.get("BYE") == want, timeout_s=10, what=f"BYE: {want}")  # noqa: B023
                assert len(set(branches(byes, b"BYE "))) == 1 and len(byes) >= 3


async def test_register_retried_after_no_answer_then_kept_alive():
    with Peer() as registrar:
        outcomes: list[str] = []
        async with checked_endpoint(echo, timer_t1_s=T1, keepalive_s=0.5, registrar=f"127.0.0.1:{registrar.port}",
                                        user="7001") as ep:  # fmt: skip
            ep.on_registration = outcomes.append
            first = await registrar.collect(64 * T1 + 0.3)  # never answered: retransmitted, then given up
            assert len(branches(first, b"REGISTER ")) >= 5 and len(set(branches(first, b"REGISTER "))) == 1
            again = [
                m for m in await registrar.until(b"REGISTER ", timeout_s=10) if m.startswith(b"REGISTER ")
            ][-1]
            assert branches([again], b"REGISTER ")[0] not in branches(first, b"REGISTER ")  # a new REGISTER
            await registrar.send(reply(again, "200 OK", extra="Expires: 300\r\n"), ep.port)
            await wait_for(lambda: outcomes == ["registered"], what="registered")
            keepalive = [
                m for m in await registrar.until(b"OPTIONS ", timeout_s=10) if m.startswith(b"OPTIONS ")
            ]
            await registrar.send(reply(keepalive[-1], "200 OK"), ep.port)
            assert ep.registration.retries == 1


async def test_replayed_digest_is_refused_but_a_retransmission_is_not_a_replay():
    async with checked_endpoint(short, allow=["10.0.0.0/8"], auth_user="trunk", auth_password="s3cret") as ep:
        with Peer() as trunk, Peer() as attacker:
            first = invite(ep.port, trunk.port, branch="z9hG4bKa1", call_id="auth-1")
            await trunk.send(first, ep.port)
            challenge = (await trunk.until(b"SIP/2.0 401"))[-1]
            await trunk.send(ack_error(first, challenge), ep.port)  # as every trunk does
            params = parse_auth(header(challenge, "www-authenticate"))
            creds = build_credentials(
                SipDigestAuth("trunk", "s3cret"), params, "INVITE", f"sip:agent@127.0.0.1:{ep.port}"
            )
            assert creds is not None
            authorization = f"Authorization: {stringify_auth(creds)}\r\n"
            signed = invite(
                ep.port, trunk.port, branch="z9hG4bKa2", call_id="auth-1", cseq=2, extra=authorization
            )
            await trunk.send(signed, ep.port)
            ok = (await trunk.until(b"SIP/2.0 200"))[-1]
            await trunk.send(signed, ep.port)  # a retransmission (the 200 lost): the same 200, not a replay
            again = await trunk.collect(0.4)
            assert again and all(a == ok for a in again), again
            await trunk.send(ack(ep.port, trunk.port, ok, cseq=2), ep.port)
            replay = invite(
                ep.port, attacker.port, branch="z9hG4bKx1", call_id="stolen-1", cseq=2, extra=authorization
            )
            await attacker.send(replay, ep.port)
            refused = (await attacker.until(b"SIP/2.0 401"))[-1]
            await attacker.send(ack_error(replay, refused), ep.port)
            assert "stale=true" in header(refused, "www-authenticate")
            assert ep.refusals["replayed"] == 1 and list(ep.calls) == ["auth-1"]
            bye = [m for m in await trunk.until(b"BYE ") if m.startswith(b"BYE ")][-1]  # the agent hangs up
            await trunk.send(reply(bye, "200 OK"), ep.port)
            await wait_for(lambda: ep.finished.get("auth-1") is not None, what="the call over")
            await wait_for(lambda: ep.finished["auth-1"].signalling.get("BYE") == "200", what="BYE answered")


async def test_floods_are_counted_and_logged_once_per_source(caplog):
    caplog.set_level(logging.WARNING, logger="duetaspan.sip")
    async with checked_endpoint(echo, allow=["10.0.0.0/8"], rate_per_s=1000) as ep:
        with Peer() as flood:
            for i in range(40):
                await flood.send(b"\x00\xffnot sip at all %d\r\n\r\n" % i, ep.port)
                await flood.send(b"OPTIONS sip:a@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bKf%d\r\n"
                                 b"From: <sip:x@y>;tag=1\r\nTo: <sip:a@b>\r\nCall-ID: f%d\r\nCSeq: 1 OPTIONS\r\n"
                                 b"Max-Forwards: 70\r\nContent-Length: 0\r\n\r\n" % (i, i), ep.port)  # fmt: skip
            await wait_for(
                lambda: ep.refusals["unparsable"] == 40 and ep.refusals["forbidden"] == 40, what="counted"
            )
    lines = [r for r in caplog.records if "sip refused" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert not [r for r in caplog.records if r.exc_info]  # no traceback per datagram


async def test_tcp_connections_are_limited_per_source_and_closed_when_idle():
    async with checked_endpoint(echo, transport="tcp") as ep:
        ep.uas.transport.max_per_source, ep.uas.transport.idle_timeout_s = 2, 0.5
        held = [await asyncio.open_connection("127.0.0.1", ep.port) for _ in range(2)]
        await wait_for(lambda: ep.uas.transport._open["127.0.0.1"] == 2, what="two connections open")
        reader, writer = await asyncio.open_connection("127.0.0.1", ep.port)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # the third from one source: closed at once
        writer.close()
        assert ep.refusals["connections"] == 1
        for reader, writer in held:  # silent for longer than the idle timeout: closed
            assert await asyncio.wait_for(reader.read(), 5) == b""
            writer.close()


async def test_session_timers_only_for_callers_that_ask():
    release = asyncio.Event()

    async def held(call) -> None:
        await release.wait()  # then we hang up (BYE)

    async with checked_endpoint(held) as ep:
        with Peer() as caller:
            asks = "Supported: timer\r\nSession-Expires: 120;refresher=uac\r\n"
            await caller.send(
                invite(ep.port, caller.port, branch="z9hG4bKt1", call_id="st-1", extra=asks), ep.port
            )
            ok = (await caller.until(b"SIP/2.0 200"))[-1]
            assert header(ok, "session-expires") == "120;refresher=uac" and header(ok, "require") == "timer"
            await caller.send(invite(ep.port, caller.port, branch="z9hG4bKt2", call_id="st-2"), ep.port)
            plain = (await caller.until(b"SIP/2.0 200"))[-1]
            assert header(plain, "session-expires") == "" and header(plain, "require") == ""
            for answer in (ok, plain):
                await caller.send(ack(ep.port, caller.port, answer), ep.port)
            await wait_for(lambda: all(c.confirmed.is_set() for c in ep.calls.values()) and len(ep.calls) == 2,
                           what="both calls confirmed by their ACK")  # fmt: skip
            assert (
                ep.uas._calls["st-1"]._session_timer is not None
                and ep.uas._calls["st-2"]._session_timer is None
            )
            release.set()
            for _ in range(2):  # our BYE of each call, answered
                bye = [m for m in await caller.until(b"BYE ") if m.startswith(b"BYE ")][-1]
                await caller.send(reply(bye, "200 OK"), ep.port)
            await wait_for(lambda: len(ep.finished) == 2, what="both calls over")


async def test_host_any_without_advertised_ip_is_refused():
    endpoint = SipEndpoint(SipSettings(host="0.0.0.0", port=0), echo, max_calls=1)
    with pytest.raises(ValueError, match=r"advertised_ip.*c=IN IP4 0\.0\.0\.0"):
        await endpoint.start()
    assert socket.socket  # nothing was bound: start refused before the transport


async def test_a_resent_challenge_does_not_end_the_call_it_challenged():
    """A trunk whose 407 crossed our ACK sends it again: we ACK it again and the authenticated INVITE rings on,
    is answered, ACKed and BYEd (the reported bug: the second 407 ended our call)."""

    async def short_call(call) -> None:
        await asyncio.sleep(0.3)

    challenge = 'Proxy-Authenticate: Digest realm="trunk.test", nonce="n0nce1", algorithm=MD5, qop="auth"\r\n'
    with Peer() as trunk:
        settings = dict(
            outbound_proxy=f"127.0.0.1:{trunk.port}", user="7001", register_password="pw", timer_t1_s=T1
        )
        async with checked_endpoint(short_call, **settings) as ep:
            dial = asyncio.ensure_future(ep.dial("sip:+15551234567@trunk.example"))
            first = (await trunk.until(b"INVITE "))[-1]
            for _ in range(2):  # the challenge, and its copy
                await trunk.send(reply(first, "407 Proxy Authentication Required", extra=challenge), ep.port)
            got = await trunk.until(b"INVITE ")
            signed = got[-1]
            assert header(signed, "proxy-authorization").startswith("Digest ")
            more = await trunk.collect(0.5)  # the ACK of the copy may come after the signed INVITE
            acks = [m for m in got + more if m.startswith(b"ACK ")]
            assert len(acks) == 2 and all(
                branches([a], b"ACK ") == branches([first], b"INVITE ") for a in acks
            )
            answer = reply(signed, "200 OK", extra=f"Contact: <sip:trunk@127.0.0.1:{trunk.port}>\r\n")
            sdp = "v=0\r\no=t 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 40002 RTP/AVP 0\r\n"
            answer = answer.replace(
                b"Content-Length: 0\r\n\r\n",
                f"Content-Type: application/sdp\r\nContent-Length: {len(sdp)}\r\n\r\n{sdp}".encode(),
            )
            await trunk.send(answer, ep.port)
            result = await asyncio.wait_for(dial, 10)
            assert result.outcome == "answered", result.summary()
            bye = [m for m in await trunk.until(b"BYE ") if m.startswith(b"BYE ")][-1]
            await trunk.send(reply(bye, "200 OK"), ep.port)
            await wait_for(lambda: result.call.signalling.get("BYE") == "200", what="our BYE answered")


async def test_our_error_answer_is_retransmitted_until_acked():
    async with checked_endpoint(echo, allow=["10.0.0.0/8"], timer_t1_s=T1) as ep:  # loopback refused: 403
        with Peer() as caller:
            request = invite(ep.port, caller.port, branch="z9hG4bKe1", call_id="err-1")
            await caller.send(request, ep.port)
            copies = [m for m in await caller.collect(0.6) if m.startswith(b"SIP/2.0 403")]
            assert len(copies) >= 3  # timer G: T1, 2*T1, 4*T1, ...
            ack_403 = (
                request.split(b"\r\n\r\n")[0]
                .replace(b"INVITE sip:", b"ACK sip:", 1)
                .replace(b"1 INVITE", b"1 ACK")
            )
            to = header(copies[0], "to").encode()
            ack_403 = b"\r\n".join(
                ln if not ln.startswith(b"To:") else b"To: " + to for ln in ack_403.split(b"\r\n")
            )
            ack_403 = ack_403.replace(b"Content-Type: application/sdp\r\n", b"").split(b"Content-Length")[0]
            await caller.send(ack_403 + b"Content-Length: 0\r\n\r\n", ep.port)
            await asyncio.sleep(0.1)
            assert not [m for m in await caller.collect(1.0) if m.startswith(b"SIP/2.0 403")]  # ACKed: quiet
            assert ep.refusals["forbidden"] == 1  # the copies were counted once
