"""The SIP endpoint on the network's weather, against SIPp (real SIP software): 10 % of SIPp's messages lost in
both roles (20 inbound SipStone calls, 10 calls we place to a SIPp UAS), a retransmitted INVITE while ringing
(one call, not two), a CANCEL that crosses our 200 (answered, ignored: the caller's BYE ends the call), our
BYE sent to the caller's Contact (the remote target), not to where its INVITE came from. Loopback only."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

from tests.adapters.sip.leaks import LOSSY_TRANSACTIONS_GRACE_S, checked_endpoint
from tests.adapters.sip.peer import (
    free_udp_port,
    needs_sipp,
    run_sipp,
    scenario,
    sip_e2e,
    udp_bound,
    udp_socket,
    wait_for,
)
from tests.adapters.sip.rawsip import ack, reply

# serial: its calls mostly wait on SIP timers and SIPp (about 1 s of CPU in a minute of calls): in the serial
# lane beside the niced workers they fill that lane's idle time instead of holding a worker (CONTRIBUTING)
pytestmark = [needs_sipp, sip_e2e, pytest.mark.serial]

BYE_FROM_US = """<recv request="BYE" timeout="20000"/>
  <send>
    <![CDATA[

      SIP/2.0 200 OK
      [last_Via:]
      [last_From:]
      [last_To:]
      [last_Call-ID:]
      [last_CSeq:]
      Content-Length: 0

    ]]>
  </send>"""

BYE_FROM_CALLER = """<pause milliseconds="{TALK_MS}"/>
  <send retrans="500">
    <![CDATA[

      BYE sip:{{USER}}@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:{{USER}}@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 3 BYE
      Max-Forwards: 70
      Content-Length: 0

    ]]>
  </send>
  <recv response="200"/>"""

CANCEL = """<send>
    <![CDATA[

      CANCEL sip:{{USER}}@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=z9hG4bK-w[pid]-[call_number];rport
      From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:{{USER}}@[remote_ip]:[remote_port]>
      Call-ID: [call_id]
      CSeq: 1 CANCEL
      Max-Forwards: 70
      Content-Length: 0

    ]]>
  </send>
  <recv response="200">
    <action>
      <ereg regexp="^ *1 CANCEL" search_in="hdr" header="CSeq:" check_it="true" assign_to="cancelled"/>
    </action>
  </recv>
  <Reference variables="cancelled"/>"""


async def echo(call) -> None:
    call.media.set_output_rate(8000)
    async for pcm in call.media.audio():
        call.media.send_audio(pcm.astype(np.float32) / 32768)


async def short(call) -> None:
    await asyncio.sleep(1.0)  # then the handler ends: we hang up (BYE)


async def held(call) -> None:
    await asyncio.sleep(4.0)  # past the callee's 200 retransmissions (0.5, 1, 2 s) should our ACK be lost


def weather(tmp_path, *, after_200: str = "", then: str = BYE_FROM_US, contact: str = "", **values) -> str:
    text = scenario("caller_weather", tmp_path, USER="agent").read_text()
    invite = text[text.index("<send retrans") : text.index("</send>") + len("</send>")]
    after_200 = after_200.replace("{INVITE}", invite.replace(' retrans="500"', ""))
    text = text.replace("{{AFTER_200}}", after_200).replace("{{THEN}}", then.format(**values))
    text = text.replace("{{CONTACT}}", contact or "sip:sipp@[local_ip]:[local_port]").replace(
        "{{USER}}", "agent"
    )
    path = tmp_path / "weather.xml"
    path.write_text(text)
    return str(path)


async def test_inbound_calls_survive_ten_percent_loss(tmp_path):
    async with checked_endpoint(echo, max_calls=6) as ep:
        got = await run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sn", "uac", "-m", "20", "-l", "5", "-r", "10",
                             "-d", "1000", "-lost", "10", timeout_s=150)  # fmt: skip
        done = got.count("Successful call")
        assert done >= 19, (done, got.output[-3000:] + got.errors[-3000:])
        await wait_for(lambda: not ep.calls and not ep.answering, timeout_s=60, what="every call over")
        assert ep.free_slots == 6 and not ep.uas._calls
    print(f"\nSIPp -lost 10, 20 inbound calls: {done}/20 complete")


async def test_outbound_calls_survive_ten_percent_loss(tmp_path):
    port = free_udp_port()
    callee_xml = scenario("callee_lossy", tmp_path)  # answers our retransmissions (SIPp's `uas` may abort)
    callee = asyncio.create_task(run_sipp("", tmp_path, "-sf", str(callee_xml), "-m", "10", "-lost", "10",
                                          port=port, name="uas", timeout_s=150))  # fmt: skip
    await udp_bound(port)
    # a BYE whose answers the loss all ate runs until Timer F (SIPp gone): LOSSY_TRANSACTIONS_GRACE_S
    async with checked_endpoint(held, max_calls=10, transactions_grace_s=LOSSY_TRANSACTIONS_GRACE_S) as ep:
        results = []
        for batch in range(2):  # five at a time
            results += await asyncio.gather(
                *(ep.dial(f"sip:callee{batch}{i}@127.0.0.1:{port}") for i in range(5))
            )
        errors = tmp_path / "uas-errors.txt"  # SIPp's own account, for a failure to explain itself
        assert [r.outcome for r in results] == ["answered"] * 10, (
            [r.summary() for r in results],
            errors.read_text(errors="replace")[-3000:] if errors.is_file() else "",
        )
        await wait_for(lambda: len(ep.finished) == 10 and not ep.calls, timeout_s=90, what="ten calls over")
        got = await callee
        assert got.count("Successful call") == 10, got.output[-3000:] + got.errors[-3000:]
        # every call was ACKed but where the loss ate the ACK and each re-ACK (~1 in 700 calls): a UAC that
        # never ACKed, or stopped re-ACKing the 200's retransmissions, fails here
        acked = got.received("ACK")
        assert acked >= 9 and got.received("BYE") == 10, (acked, got.screen[-3000:])
    print(f"\nSIPp -lost 10, 10 outbound calls to a SIPp UAS: 10/10 answered and hung up, {acked} ACKs taken")


def _invite(port: int, local: int, branch: str = "z9hG4bKdup1", call_id: str = "dup-1@test") -> bytes:
    sdp = (
        "v=0\r\no=t 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 40000 RTP/AVP 0\r\n"
    )
    return (
        f"INVITE sip:agent@127.0.0.1:{port} SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:{local};branch={branch};rport\r\n"
        f"From: <sip:t@127.0.0.1>;tag=caller1\r\nTo: <sip:agent@127.0.0.1:{port}>\r\nCall-ID: {call_id}\r\n"
        f"CSeq: 1 INVITE\r\nContact: <sip:t@127.0.0.1:{local}>\r\nMax-Forwards: 70\r\n"
        f"Content-Type: application/sdp\r\nContent-Length: {len(sdp)}\r\n\r\n{sdp}"
    ).encode()


async def _answers(sock: socket.socket, until: bytes, timeout_s: float = 20.0) -> list[bytes]:
    """Every datagram up to (and with) the first that starts with `until`."""
    loop, got = asyncio.get_running_loop(), []
    while True:
        data = await asyncio.wait_for(loop.sock_recv(sock, 65536), timeout_s)
        got.append(data)
        if data.startswith(until):
            return got


def _to_tags(answers: list[bytes]) -> set[str]:
    return {ln.split("tag=")[1].split(";")[0] for a in answers for ln in a.decode().split("\r\n")
            if ln.lower().startswith("to:") and "tag=" in ln}  # fmt: skip


async def test_retransmitted_invite_while_ringing_is_one_call():
    """A caller that did not hear our 100/180 resends its INVITE (same branch): the copy gets our last answer
    again; one call, one To tag, one agent (RFC 3261 17.2.1)."""
    loop = asyncio.get_running_loop()
    async with checked_endpoint(short, answer_after_ms=1500) as ep:
        with udp_socket() as s:
            invite = _invite(ep.port, s.getsockname()[1])
            await loop.sock_sendto(s, invite, ("127.0.0.1", ep.port))
            first = await _answers(s, b"SIP/2.0 180")
            for _ in range(2):  # two copies while it rings
                await loop.sock_sendto(s, invite, ("127.0.0.1", ep.port))
            rest = await _answers(s, b"SIP/2.0 200")
            assert sum(a.startswith(b"SIP/2.0 180") for a in rest) == 2  # each copy got the 180 again
            one_call = lambda: len(ep.calls) + len(ep.answering) == 1  # noqa: E731  # (unACKed: answering)
            assert len(_to_tags(first + rest)) == 1 and one_call()
            assert ep.txns.retransmissions_absorbed == 2
            for _ in range(2):  # the 200 lost, the INVITE resent: the same 200 again, still one call
                await loop.sock_sendto(s, invite, ("127.0.0.1", ep.port))
                again = await _answers(s, b"SIP/2.0 200")
                assert len(_to_tags(first + rest + again)) == 1
            assert one_call()
            await loop.sock_sendto(s, ack(ep.port, s.getsockname()[1], again[-1]), ("127.0.0.1", ep.port))
            bye = [m for m in await _answers(s, b"BYE ") if m.startswith(b"BYE ")][-1]  # the agent hangs up
            await loop.sock_sendto(s, reply(bye, "200 OK"), ("127.0.0.1", ep.port))
            await wait_for(lambda: len(ep.finished) == 1, what="the one call over")
            await wait_for(
                lambda: ep.finished["dup-1@test"].signalling.get("BYE") == "200", what="BYE answered"
            )


async def test_cancel_crossing_our_200_is_ignored(tmp_path):
    async with checked_endpoint(echo) as ep:
        path = weather(tmp_path, after_200=CANCEL, then=BYE_FROM_CALLER, TALK_MS=800)
        got = await run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf", path, "-m", "1")
        assert got.rc == 0, got.output + got.errors  # the BYE got 200, not 481
        await wait_for(lambda: len(ep.finished) == 1 and not ep.calls, what="the call over")
        assert next(iter(ep.finished.values())).end_reason == "caller hung up (BYE)"


async def test_our_bye_goes_to_the_callers_contact(tmp_path):
    loop = asyncio.get_running_loop()
    with udp_socket() as phone:  # where the caller's Contact points
        contact = f"<sip:phone@127.0.0.1:{phone.getsockname()[1]}>"
        async with checked_endpoint(short) as ep:
            path = weather(tmp_path, contact=contact, then='<pause milliseconds="200"/>')
            got = await run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf", path, "-m", "1")
            assert got.rc == 0, got.output + got.errors
            data, addr = await asyncio.wait_for(loop.sock_recvfrom(phone, 65536), 20)
            assert data.startswith(f"BYE sip:phone@127.0.0.1:{phone.getsockname()[1]} SIP/2.0".encode()), data
            head, _, _ = data.decode().partition("\r\n\r\n")
            lines = [
                ln for ln in head.split("\r\n")[1:] if not ln.lower().startswith(("contact", "max-forwards"))
            ]
            ok = "SIP/2.0 200 OK\r\n" + "\r\n".join(lines) + "\r\n\r\n"
            await loop.sock_sendto(phone, ok.replace("Content-Length: 0", "Content-Length: 0").encode(), addr)
            await wait_for(lambda: len(ep.finished) == 1, what="the call over")
            call = next(iter(ep.finished.values()))
            await wait_for(lambda: call.signalling.get("BYE") == "200", what="our BYE answered")


def _answer_200(invite: bytes, local: int) -> bytes:
    head = invite.decode().partition("\r\n\r\n")[0].split("\r\n")
    keep = [ln for ln in head[1:] if ln.lower().startswith(("via:", "from:", "call-id:", "cseq:"))]
    to = next(ln for ln in head if ln.lower().startswith("to:")) + ";tag=callee1"
    sdp = (
        "v=0\r\no=c 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 40002 RTP/AVP 0\r\n"
    )
    return (
        "SIP/2.0 200 OK\r\n" + "\r\n".join([*keep, to]) + f"\r\nContact: <sip:callee@127.0.0.1:{local}>\r\n"
        f"Content-Type: application/sdp\r\nContent-Length: {len(sdp)}\r\n\r\n{sdp}"
    ).encode()


async def test_a_retransmitted_200_gets_the_same_ack_again():
    """The callee did not hear our ACK and resends its 200: the ACK that goes back is the first one, byte for
    byte (RFC 3261 13.2.2.4: the UAC core retransmits its ACK). A fresh ACK (new branch) is a new request to
    the callee: SIPp aborts the call on one (while expecting the BYE)."""
    loop = asyncio.get_running_loop()
    release = asyncio.Event()

    async def talk(call) -> None:
        await release.wait()  # then we hang up (BYE)

    with udp_socket() as callee:
        port = callee.getsockname()[1]
        async with checked_endpoint(talk) as ep:
            dialled = asyncio.create_task(ep.dial(f"sip:callee@127.0.0.1:{port}"))
            invite, addr = await asyncio.wait_for(loop.sock_recvfrom(callee, 65536), 60)
            assert invite.startswith(b"INVITE ")
            ok = _answer_200(invite, port)
            acks = []
            for _ in range(3):  # the 200, then two retransmissions of it
                await loop.sock_sendto(callee, ok, addr)
                while True:
                    data = await asyncio.wait_for(loop.sock_recv(callee, 65536), 60)
                    if data.startswith(b"ACK "):
                        acks.append(data)
                        break
            assert (await dialled).outcome == "answered"
            assert len(set(acks)) == 1, acks  # one ACK, sent three times
            assert ep.txns.retransmissions_absorbed >= 2
            release.set()
            while not (bye := await asyncio.wait_for(loop.sock_recv(callee, 65536), 30)).startswith(b"BYE "):
                pass
            await loop.sock_sendto(callee, reply(bye, "200 OK"), addr)
            call = (await dialled).call
            await wait_for(lambda: call.signalling.get("BYE") == "200", what="our BYE answered")
