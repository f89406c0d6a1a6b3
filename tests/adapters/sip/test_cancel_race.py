"""Our CANCEL of a ringing INVITE against a bare UDP callee (`tests.adapters.sip.rawsip`), timers shortened
(issue #32, SECURITY.md names them): a callee that answers the CANCEL 200 but never sends its 487 does not keep
our INVITE transaction for `PROCEEDING_MAX_S` (300 s): it ends 64*T1 after the CANCEL (RFC 3261 9.1); a callee
that answers the INVITE 200 as our CANCEL crosses it gets our ACK and then our BYE at once (RFC 3261 15), the
dial stays `no-answer`, no agent runs, and nothing is left (`checked_endpoint`). A callee that hangs up (BYE)
as soon as it answered, while our side still opens the call's media (a loaded machine), ends the call at once:
aiosipua answers that BYE and forgets the call before the endpoint knows it, and the call stayed up on our side
(its slot held) until its media timed out, or for as long as a SIPp echoing on a shared port ran."""

from __future__ import annotations

import asyncio
import logging

import pytest

from duetaspan.adapters.sip import outbound
from tests.adapters.sip.leaks import checked_endpoint
from tests.adapters.sip.peer import sip_e2e, wait_for
from tests.adapters.sip.rawsip import SDP, Peer, header, reply

pytestmark = [sip_e2e, pytest.mark.serial]
T1 = 0.05  # 64*T1 = 3.2 s


def _branch(message: bytes) -> str:
    return header(message, "via").split("branch=")[1].split(";")[0]


async def test_an_invite_whose_487_never_comes_ends_64_t1_after_our_cancel(caplog):
    caplog.set_level(logging.INFO, logger="duetaspan.sip")
    loop = asyncio.get_running_loop()
    with Peer() as callee:
        async with checked_endpoint(lambda call: None, timer_t1_s=T1) as ep:
            dial = asyncio.ensure_future(ep.dial(f"sip:7002@127.0.0.1:{callee.port}", ring_timeout_s=0.3))
            first = (await callee.until(b"INVITE "))[-1]
            await callee.send(reply(first, "180 Ringing"), ep.port)
            cancel = (await callee.until(b"CANCEL "))[-1]
            cancelled_at = loop.time()
            await callee.send(reply(cancel, "200 OK"), ep.port)  # and never a 487 for the INVITE
            result = await asyncio.wait_for(dial, 10)
            assert result.outcome == "no-answer", result.summary()
            key = (_branch(first), "INVITE")
            assert key in ep.txns._client  # the INVITE still waits for its final answer
            await wait_for(lambda: key not in ep.txns._client, 64 * T1 + 20, what="the INVITE's end")
            ended = loop.time() - cancelled_at
            assert 0.9 * 64 * T1 <= ended, ended  # not before 64*T1 (a 487 may still come until then)
            assert not [m for m in await callee.collect(0.2) if m.startswith(b"INVITE ")]  # nothing resent
    said = [r.getMessage() for r in caplog.records if "after our CANCEL" in r.getMessage()]
    assert said and "INVITE" in said[0], said


async def test_a_200_that_crosses_our_cancel_is_acked_then_byed():
    started: list[object] = []
    with Peer() as callee:
        async with checked_endpoint(lambda call: started.append(call), timer_t1_s=T1) as ep:
            dial = asyncio.ensure_future(ep.dial(f"sip:7002@127.0.0.1:{callee.port}", ring_timeout_s=0.3))
            first = (await callee.until(b"INVITE "))[-1]
            await callee.send(reply(first, "180 Ringing"), ep.port)
            cancel = (await callee.until(b"CANCEL "))[-1]
            # the callee answered just before our CANCEL reached it: its 200 to the INVITE (and no 487), then
            # the 200 to the CANCEL (RFC 3261 9.2: a CANCEL of an answered INVITE has no effect)
            contact = f"Contact: <sip:7002@127.0.0.1:{callee.port}>\r\nContent-Type: application/sdp\r\n"
            ok = reply(first, "200 OK", extra=contact).replace(b"Content-Length: 0\r\n\r\n", b"")
            ok += f"Content-Length: {len(SDP)}\r\n\r\n{SDP}".encode()
            await callee.send(ok, ep.port)
            await callee.send(reply(cancel, "200 OK"), ep.port)
            result = await asyncio.wait_for(dial, 10)
            assert result.outcome == "no-answer" and result.call is None, result.summary()
            got = await callee.until(b"BYE ", timeout_s=20)
            acks = [m for m in got if m.startswith(b"ACK ")]
            assert acks, [m.split(b"\r\n", 1)[0] for m in got]  # the ACK first (RFC 3261 13.2.2.4), then BYE
            assert got.index(acks[0]) < len(got) - 1
            ack, bye = acks[0], got[-1]
            assert header(ack, "cseq").split()[0] == header(first, "cseq").split()[0]
            assert "tag=peer1" in header(ack, "to") and "tag=peer1" in header(bye, "to")
            assert header(bye, "call-id") == header(first, "call-id")
            await callee.send(reply(bye, "200 OK"), ep.port)
            # the 200 retransmitted (our ACK lost): the same ACK again, no second BYE
            await callee.send(ok, ep.port)
            again = [m for m in await callee.collect(0.5) if not m.startswith(b"SIP/2.0 ")]
            assert [m for m in again if m.startswith(b"ACK ")], again
            assert not [m for m in again if m.startswith(b"BYE ")], again
            await wait_for(lambda: not [k for k in ep.txns._client if k[1] == "BYE"], what="our BYE answered")
            assert not started and not ep.calls  # no agent ran


async def test_a_bye_that_comes_while_the_answered_calls_media_opens_ends_the_call(monkeypatch):
    bye_answered = asyncio.Event()
    open_answered = outbound.CallMedia.open_answered

    async def loaded(*args, **kwargs):  # the media opens only once the callee's BYE was answered
        await bye_answered.wait()
        return await open_answered(*args, **kwargs)

    monkeypatch.setattr(outbound.CallMedia, "open_answered", loaded)

    async def handler(call) -> None:
        await call.ended.wait()

    with Peer() as callee:
        async with checked_endpoint(handler, timer_t1_s=T1) as ep:
            dial = asyncio.ensure_future(ep.dial(f"sip:7002@127.0.0.1:{callee.port}", ring_timeout_s=5.0))
            first = (await callee.until(b"INVITE "))[-1]
            contact = f"Contact: <sip:7002@127.0.0.1:{callee.port}>\r\nContent-Type: application/sdp\r\n"
            ok = reply(first, "200 OK", extra=contact).replace(b"Content-Length: 0\r\n\r\n", b"")
            ok += f"Content-Length: {len(SDP)}\r\n\r\n{SDP}".encode()
            await callee.send(ok, ep.port)
            await callee.until(b"ACK ")
            bye = (
                f"BYE {header(first, 'contact').split('<', 1)[1].split('>', 1)[0]} SIP/2.0\r\n"
                f"Via: SIP/2.0/UDP 127.0.0.1:{callee.port};branch=z9hG4bKbye1\r\nFrom: {header(ok, 'to')}\r\n"
                f"To: {header(first, 'from')}\r\nCall-ID: {header(first, 'call-id')}\r\nCSeq: 2 BYE\r\n"
                f"Max-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
            ).encode()
            await callee.send(bye, ep.port)
            answer = (await callee.until(b"SIP/2.0 "))[-1]
            assert answer.startswith(b"SIP/2.0 200") and header(answer, "cseq") == "2 BYE", answer
            bye_answered.set()
            result = await asyncio.wait_for(dial, 10)
            assert result.outcome == "answered", result.summary()
            await asyncio.wait_for(result.call.ended.wait(), 10)  # not once its media times out (30 s)
            assert result.call.end_reason == "caller hung up (BYE)", result.call.end_reason
            assert not [m for m in await callee.collect(0.5) if m.startswith(b"BYE ")]  # it hung up: no BYE back
            await wait_for(lambda: not ep.calls, what="the call's end on the endpoint")
