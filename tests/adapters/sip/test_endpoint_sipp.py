"""The SIP endpoint against SIPp (real SIP software), with a small echo handler instead of the agent: the
SipStone `uac` calls, CANCEL while ringing, BYE from our side, 486 when every slot is busy, the digest
challenge (right and wrong password), a refused source (403, or nothing with `refuse = "silence"`), the
same answer whatever user a request names, and oversize messages dropped. Loopback only."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import numpy as np
import pytest

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
from tests.adapters.sip.rawsip import ack_error, is_error_answer_to_invite

# serial: its calls mostly wait on SIP timers and SIPp (about 1 s of CPU in a minute of calls): in the serial
# lane beside the niced workers they fill that lane's idle time instead of holding a worker (CONTRIBUTING)
pytestmark = [needs_sipp, sip_e2e, pytest.mark.serial]


async def echo(call) -> None:
    call.media.set_output_rate(8000)
    async for pcm in call.media.audio():
        call.media.send_audio(pcm.astype(np.float32) / 32768)


async def test_sipstone_uac_calls_all_succeed(tmp_path):
    async with checked_endpoint(echo, max_calls=4) as ep:
        got = await run_sipp(
            f"127.0.0.1:{ep.port}", tmp_path, "-sn", "uac", "-m", "6", "-l", "3", "-d", "500"
        )
        await wait_for(lambda: len(ep.finished) == 6 and not ep.calls, what="six finished calls")
        assert got.rc == 0, got.output + got.errors
        assert got.count("Successful call") == 6 and got.count("Failed call") == 0
        assert all(c.end_reason == "caller hung up (BYE)" for c in ep.finished.values())
        assert ep.free_slots == 4 and not ep.answering and not ep.uas._calls  # nothing leaked
        assert ep.refusals.total() == 0


async def test_sipstone_uac_over_tcp(tmp_path):
    async with checked_endpoint(echo, transport="tcp") as ep:
        got = await run_sipp(
            f"127.0.0.1:{ep.port}", tmp_path, "-sn", "uac", "-t", "t1", "-m", "2", "-d", "300"
        )
        assert got.rc == 0, got.output + got.errors
        assert got.count("Successful call") == 2


async def test_cancel_while_ringing_gets_487_and_no_call(tmp_path):
    async with checked_endpoint(echo, answer_after_ms=3000) as ep:
        got = await run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf", str(scenario("cancel", tmp_path, USER="agent")),
                             "-m", "1")  # fmt: skip
        assert got.rc == 0, got.output + got.errors
        await asyncio.sleep(3.5)  # past the answer time: the cancelled call must not be answered late
        assert not ep.calls and not ep.finished and not ep.answering
        assert ep.free_slots == 4


async def test_bye_from_our_side(tmp_path):
    async def short(call) -> None:
        await asyncio.sleep(1.0)  # the handler returns: the endpoint hangs up

    async with checked_endpoint(short) as ep:
        path = scenario("bye_from_agent", tmp_path, USER="agent", BYE_TIMEOUT_MS=20000)
        got = await run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf", str(path), "-m", "1")
        assert got.rc == 0, got.output + got.errors
        await wait_for(lambda: len(ep.finished) == 1, what="the call to finish")
        assert next(iter(ep.finished.values())).end_reason == "agent ended the call"


async def test_busy_here_when_no_slot_is_free(tmp_path):
    async with checked_endpoint(echo, max_calls=1) as ep:
        first = asyncio.create_task(
            run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sn", "uac", "-m", "1", "-d", "6000", name="holder")
        )
        await wait_for(lambda: len(ep.calls) == 1, what="the first call to hold the slot")
        got = await run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf", str(scenario("busy", tmp_path, USER="agent")),
                             "-m", "2")  # fmt: skip
        assert got.rc == 0, got.output + got.errors
        assert ep.refusals["busy"] == 2
        assert (await first).rc == 0
        await wait_for(lambda: not ep.calls, what="the slot back")
        assert ep.free_slots == 1


async def test_refused_source_gets_403_whatever_the_user(tmp_path):
    async with checked_endpoint(echo, allow=["10.0.0.0/8"]) as ep:  # loopback is not allowed
        for user in ("100", "admin", "agent"):
            path = scenario("refused", tmp_path, USER=user)
            got = await run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf", str(path), "-m", "1", name=user)
            assert got.rc == 0, (user, got.output + got.errors)
        assert ep.refusals["forbidden"] == 3
        assert not ep.calls and not ep.finished


async def test_digest_challenge_then_the_call(tmp_path):
    async with checked_endpoint(echo, allow=["10.0.0.0/8"], auth_user="trunk", auth_password="s3cret") as ep:
        got = await run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf", str(scenario("digest", tmp_path, USER="agent")),
                             "-m", "1", "-au", "trunk", "-ap", "s3cret")  # fmt: skip
        assert got.rc == 0, got.output + got.errors
        await wait_for(lambda: len(ep.finished) == 1, what="the authenticated call to finish")
        bad = scenario("digest_refused", tmp_path, USER="agent")
        for user, password in (("trunk", "wrong"), ("nobody", "s3cret")):  # same answer: nothing to enumerate
            got = await run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf", str(bad), "-m", "1", "-au", user,
                                 "-ap", password, name=user)  # fmt: skip
            assert got.rc == 0, (user, got.output + got.errors)
        assert ep.refusals["forbidden"] == 2 and len(ep.finished) == 1


def _request(user: str, size: int = 0, method: str = "INVITE", n: int = 0) -> bytes:
    """An out-of-dialog request as a scanner sends it; its Via names the probe's own port (`PROBEPORT`)."""
    pad = f"X-Pad: {'a' * size}\r\n" if size else ""
    return (
        f"{method} sip:{user}@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:PROBEPORT;branch=z9hG4bK{user}{n}\r\n"
        f"From: <sip:scan@127.0.0.1>;tag=1\r\nTo: <sip:{user}@127.0.0.1>\r\nCall-ID: {user}{n}@scan\r\n"
        f"CSeq: 1 {method}\r\nMax-Forwards: 70\r\n{pad}Content-Length: 0\r\n\r\n"
    ).encode()


async def _probe(target: int, message: bytes, wait_s: float) -> bytes | None:
    """One datagram to the endpoint; its answer, or None when nothing came back in `wait_s`. An error answer to
    an INVITE is ACKed, as every UA does (else the endpoint resends it for 32 s)."""
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)
        message = message.replace(b"PROBEPORT", str(s.getsockname()[1]).encode())
        await loop.sock_sendto(s, message, ("127.0.0.1", target))
        try:
            answer = await asyncio.wait_for(loop.sock_recv(s, 65536), wait_s)
        except TimeoutError:
            return None
        final = answer
        with contextlib.suppress(TimeoutError):
            while final.startswith(b"SIP/2.0 1") and message.startswith(b"INVITE "):  # 100 Trying: the final next
                final = await asyncio.wait_for(loop.sock_recv(s, 65536), wait_s)
        if is_error_answer_to_invite(final):
            await loop.sock_sendto(s, ack_error(message, final), ("127.0.0.1", target))
        return answer


async def test_refuse_silence_answers_nothing_and_counts():
    async with checked_endpoint(echo, allow=["10.0.0.0/8"], refuse="silence") as ep:
        for user in ("100", "101"):
            assert await _probe(ep.port, _request(user), 1.5) is None
        assert ep.refusals["forbidden"] == 2
    async with checked_endpoint(echo, allow=["10.0.0.0/8"]) as ep:  # the probe does hear a 403
        answer = await _probe(ep.port, _request("100"), 5.0)
        assert answer is not None and answer.startswith(b"SIP/2.0 403")


async def test_oversize_messages_are_dropped_and_counted():
    async with checked_endpoint(echo, max_message_bytes=4096) as ep:
        assert await _probe(ep.port, _request("agent", size=8000, method="OPTIONS"), 1.5) is None
        assert ep.refusals["oversize"] == 1 and not ep.calls
        answer = await _probe(
            ep.port, _request("agent", size=2000, method="OPTIONS"), 5.0
        )  # within the bound
        assert answer is not None and answer.startswith(b"SIP/2.0 200")


async def test_options_answered_and_per_source_rate_limit():
    async with checked_endpoint(echo, rate_per_s=1.0) as ep:  # bursts of 4, then 1 per second
        answers = [await _probe(ep.port, _request("agent", method="OPTIONS", n=i), 1.0) for i in range(8)]
        answered = [a for a in answers if a is not None]
        assert answered and all(a.startswith(b"SIP/2.0 200") for a in answered)
        assert b"INVITE" in answered[0] and b"Allow:" in answered[0]
        assert len(answered) <= 6 and ep.refusals["rate_limited"] == 8 - len(answered)


async def test_hold_and_resume_by_reinvite(tmp_path):
    sent_while_held: list[int] = []

    async def talker(call) -> None:  # sends a tone; while held nothing may go out
        call.media.set_output_rate(8000)
        tone = (0.2 * np.sin(np.arange(160) * 0.3)).astype(np.float32)
        while not call.ended.is_set():
            before = call.media.frames_out
            call.media.send_audio(tone)
            if call.media.held:
                sent_while_held.append(call.media.frames_out - before)
            await asyncio.sleep(0.02)

    async with checked_endpoint(talker) as ep:
        path = scenario("hold", tmp_path, USER="agent", TALK_MS=800)
        got = await run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf", str(path), "-m", "1")
        assert got.rc == 0, got.output + got.errors  # a=recvonly answered the hold, a=sendrecv the resume
        await wait_for(lambda: len(ep.finished) == 1, what="the call to finish")
        media = next(iter(ep.finished.values())).media
    assert media.holds == 1 and not media.held
    assert sent_while_held and not any(sent_while_held)
    assert media.frames_out > 40  # before the hold and after the resume


async def test_tls_listener_answers_options(tmp_path):
    """SIP over TLS (`transport = "tls"`): SIPp here has no TLS, so a plain `ssl` client sends OPTIONS."""
    import shutil
    import ssl
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed (needed to make a test certificate)")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    made = await asyncio.create_subprocess_exec(
        "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
        "-days", "1", "-subj", "/CN=127.0.0.1", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    assert await made.wait() == 0
    async with checked_endpoint(echo, transport="tls", tls_cert=cert, tls_key=key) as ep:
        context = ssl.create_default_context(cafile=str(cert))
        context.check_hostname = False
        reader, writer = await asyncio.open_connection("127.0.0.1", ep.port, ssl=context)
        port = writer.get_extra_info("sockname")[1]
        request = (
            _request("agent", method="OPTIONS")
            .replace(b"UDP", b"TLS")
            .replace(b"PROBEPORT", str(port).encode())
        )
        writer.write(request)
        await writer.drain()
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        writer.close()
        plain_reader, plain_writer = await asyncio.open_connection("127.0.0.1", ep.port)  # no TLS: no answer
        plain_writer.write(request)
        await plain_writer.drain()
        with contextlib.suppress(ConnectionError):
            assert await asyncio.wait_for(plain_reader.read(100), 5) == b""
        plain_writer.close()
    assert answer.startswith(b"SIP/2.0 200")


async def _transferring(call) -> None:
    """A handler whose tool asks for a transfer at once, as `transfer_call` does through the call context."""
    from duetaspan.adapters.sip.bridge import perform_action
    from duetaspan.registry.context import CallAction

    await perform_action(call, CallAction("transfer_call", target="sip:desk@127.0.0.1"), drain_s=0)
    await call.ended.wait()


async def test_transfer_call_sends_refer_then_bye(tmp_path):
    async with checked_endpoint(_transferring) as ep:
        path = scenario(
            "refer_accept", tmp_path, USER="agent", BYE_TIMEOUT_MS=20000, TARGET="sip:desk@127.0.0.1"
        )
        got = await run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf", str(path), "-m", "1")
        assert got.rc == 0, got.output + got.errors  # REFER with our Refer-To, then our BYE
        await wait_for(lambda: len(ep.finished) == 1, what="the transferred call to finish")
    assert next(iter(ep.finished.values())).end_reason == "transferred to sip:desk@127.0.0.1"


async def test_refused_refer_is_a_clear_failure_and_the_call_goes_on(tmp_path, caplog):
    async with checked_endpoint(_transferring) as ep:
        path = scenario("refer_refuse", tmp_path, USER="agent", BYE_TIMEOUT_MS=20000)
        got = await run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf", str(path), "-m", "1")
        assert got.rc == 0, got.output + got.errors
        await wait_for(lambda: len(ep.finished) == 1, what="the call to finish")
    assert (
        next(iter(ep.finished.values())).end_reason == "caller hung up (BYE)"
    )  # not transferred, not dropped
    assert "refused the REFER (603 Declined)" in caplog.text


async def test_registers_as_an_extension_and_refreshes(tmp_path):
    registrar_port = free_udp_port()
    path = scenario(
        "registrar", tmp_path, USER="7001", PASSWORD="ext-secret", EXPIRES=10, REFRESH_TIMEOUT_MS=15000
    )
    sipp = asyncio.create_task(run_sipp("", tmp_path, "-sf", str(path), "-m", "1", port=registrar_port))
    await udp_bound(registrar_port)
    outcomes: list[str] = []
    async with checked_endpoint(echo, allow=["10.0.0.0/8"], registrar=f"127.0.0.1:{registrar_port}",
                                    user="7001", register_password="ext-secret") as ep:  # fmt: skip
        ep.on_registration = outcomes.append
        got = await sipp  # the challenge, our digest checked by SIPp, then the refresh at 90 % of 10 s
        assert got.rc == 0, got.output + got.errors
        assert ep.registration.state.value == "registered"
        assert ep.gate.source_allowed("127.0.0.1")  # the registrar may send the extension's calls
    assert outcomes.count("registered") >= 1


async def test_failed_registration_is_logged_and_counted(tmp_path, caplog):
    registrar_port = free_udp_port()
    path = scenario(
        "registrar", tmp_path, USER="7001", PASSWORD="ext-secret", EXPIRES=10, REFRESH_TIMEOUT_MS=15000
    )
    sipp = asyncio.create_task(run_sipp("", tmp_path, "-sf", str(path), "-m", "1", port=registrar_port))
    await udp_bound(registrar_port)
    outcomes: list[str] = []
    async with checked_endpoint(echo, registrar=f"127.0.0.1:{registrar_port}", user="7001",
                                    register_password="wrong") as ep:  # fmt: skip
        ep.on_registration = outcomes.append
        await wait_for(lambda: "failed" in outcomes, what="the registration to fail")
    await sipp
    assert "SIP registration as sip:7001@127.0.0.1" in caplog.text and "403 Forbidden" in caplog.text
    assert "wrong" not in caplog.text  # the password is never logged


async def test_dial_out_answered_then_bye_and_busy(tmp_path):
    """Outbound: SIPp's embedded `uas` scenario answers our INVITE and waits for our BYE; a busy callee's 486
    is the `busy` outcome."""

    async def short(call) -> None:
        await asyncio.sleep(1.0)  # the handler ends: we hang up

    async with checked_endpoint(short) as ep:
        callee_port = free_udp_port()
        callee = asyncio.create_task(
            run_sipp("", tmp_path, "-sn", "uas", "-m", "1", port=callee_port, name="callee")
        )
        await udp_bound(callee_port)
        result = await ep.dial(f"sip:service@127.0.0.1:{callee_port}", ring_timeout_s=20)
        assert result.outcome == "answered" and result.status == 200, result
        got = await callee
        assert got.rc == 0, got.output + got.errors  # SIPp's uas got our ACK, then our BYE
        await wait_for(lambda: result.call_id in ep.finished, what="the placed call to finish")
        assert ep.finished[result.call_id].end_reason == "agent ended the call"
        busy_port = free_udp_port()
        path = scenario("callee_busy", tmp_path)
        busy = asyncio.create_task(
            run_sipp("", tmp_path, "-sf", str(path), "-m", "1", port=busy_port, name="busy")
        )
        await udp_bound(busy_port)
        refused = await ep.dial(f"sip:service@127.0.0.1:{busy_port}", ring_timeout_s=20)
        assert (refused.outcome, refused.status) == ("busy", 486), refused
        got = await busy  # callee_busy.xml requires the ACK of its 486 (17.1.1.3): SIPp exits 0 only with it
        assert got.rc == 0 and got.count("Total Calls created") == 1, got.output + got.errors
        assert ep.free_slots == 4 and not ep.calls


async def test_requests_for_other_hosts_are_never_relayed():
    """We are a user agent, not a proxy: a request naming another host in its Request-URI and Route is
    answered (or refused) here, and nothing reaches the host it names."""
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as victim:
        victim.bind(("127.0.0.1", 0))
        victim.setblocking(False)
        vport = victim.getsockname()[1]
        async with checked_endpoint(echo) as ep:
            for method in ("OPTIONS", "INVITE"):
                request = _request("victim", method=method).replace(
                    b"sip:victim@127.0.0.1 SIP/2.0", f"sip:victim@127.0.0.1:{vport} SIP/2.0".encode()
                )
                request = request.replace(
                    b"Max-Forwards: 70\r\n",
                    f"Max-Forwards: 70\r\nRoute: <sip:127.0.0.1:{vport};lr>\r\n".encode(),
                )
                answer = await _probe(ep.port, request, 5.0)
                assert answer is not None and answer.startswith(b"SIP/2.0 "), method  # answered here
        with contextlib.suppress(TimeoutError):
            leaked = await asyncio.wait_for(loop.sock_recv(victim, 65536), 1.0)
            raise AssertionError(f"a request reached the host it named: {leaked[:80]!r}")


async def test_the_servers_shared_budget_and_its_drain_decide_for_sip_too(tmp_path):
    """Under `serve` the endpoint's slots are the server's one budget: a Twilio caller's reservation counts
    against SIP callers (486 though the endpoint itself has room), a SIP call holds its slot there until it
    ends, and a draining server answers INVITEs 503."""
    from duetaspan.pipeline.admission import Admission

    shared = Admission(2)
    phone = shared.try_acquire("twilio", "CA-phone", ttl_s=120)  # a phone call's webhook reservation
    async with checked_endpoint(echo, max_calls=4) as ep:
        ep.shared = shared
        first = asyncio.create_task(
            run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sn", "uac", "-m", "1", "-d", "6000", name="holder")
        )
        await wait_for(lambda: len(ep.calls) == 1, what="the SIP call to hold a slot")
        [sip_call] = ep.calls
        assert shared.held == 2 and shared.get(sip_call).transport == "sip"
        got = await run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf", str(scenario("busy", tmp_path, USER="agent")),
                             "-m", "1")  # fmt: skip
        assert got.rc == 0, got.output + got.errors
        assert ep.refusals["busy"] == 1 and ep.free_slots == 3  # the endpoint had room; the budget had none
        assert (await first).rc == 0
        await wait_for(
            lambda: not ep.calls and shared.held == 1, what="the SIP call's slot back in the budget"
        )
        phone.release()
        assert shared.start_drain("SIGTERM")
        got = await run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf",
                             str(scenario("draining", tmp_path, USER="agent")), "-m", "1")  # fmt: skip
        assert got.rc == 0, got.output + got.errors
        assert ep.refusals["draining"] == 1 and not ep.calls
