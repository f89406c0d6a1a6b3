"""The media path under attack, with SIPp as the real caller and plain UDP sockets as the attacker: a flood of
forged RTP from another port during a live call never becomes caller audio and never receives the agent's
audio (latching, `adapters/sip/latch.py`); a spoofed INVITE that is never ACKed gets no RTP and no agent, and
costs only its slot until the 200's retransmissions give up. Each test leaves nothing behind."""

from __future__ import annotations

import asyncio
import struct
import uuid

import aiosipua.transaction
import numpy as np
from aiortp.codecs import PcmuCodec
from prometheus_client import CollectorRegistry

from duetaspan.adapters.sip.serve import wire_rtp_metrics
from duetaspan.observability.sip_metrics import SipMetrics
from tests.adapters.sip.leaks import checked_endpoint
from tests.adapters.sip.peer import (
    drain,
    free_udp_port,
    needs_sipp,
    run_sipp,
    scenario,
    sip_e2e,
    udp_socket,
    wait_for,
)

pytestmark = [needs_sipp, sip_e2e]

LOUD = PcmuCodec().encode((np.sin(np.arange(160) / 3) * 20000).astype("<i2").tobytes())


async def test_forged_rtp_flood_never_reaches_the_agent_nor_hears_it(tmp_path):
    heard: list[np.ndarray] = []
    flood_done = asyncio.Event()

    async def agent(call) -> None:  # hears the caller, talks all the time (a tone), hangs up after the flood
        call.media.set_output_rate(8000)
        tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(1600) / 8000)).astype(np.float32)
        while not flood_done.is_set():
            if call.media.queued_ms() < 200:
                call.media.send_audio(tone)
            try:  # the queue `media.audio()` reads (a cancelled wait on it loses nothing)
                frame = await asyncio.wait_for(call.media._inbound.get(), 0.1)
            except TimeoutError:
                continue
            if frame is None:
                return
            heard.append(frame)
        await asyncio.sleep(0.3)

    silence = tmp_path / "silence.raw"
    silence.write_bytes(b"\xff" * 8000 * 2)  # 2 s of mu-law silence, looped: the real caller says nothing
    path = scenario("caller_streams", tmp_path, USER="agent", AUDIO=silence, PT=0, BYE_TIMEOUT_MS=30000)
    attacker = udp_socket()
    metrics = SipMetrics(CollectorRegistry())
    async with checked_endpoint(agent) as ep:
        wire_rtp_metrics(ep, metrics)  # as `serve` wires it: live counters, the rest at the end
        sipp = asyncio.ensure_future(run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf", str(path), "-m", "1"))
        await wait_for(lambda: ep.calls and next(iter(ep.calls.values())).media.latch.addr is not None,
                       what="the caller's RTP latched")  # fmt: skip
        call = next(iter(ep.calls.values()))
        media = call.media
        latched = media.latch.addr
        before = len(heard)
        for seq in range(500):  # a one-second flood from another port of the same host
            packet = struct.pack("!BBHII", 0x80, 0, seq, seq * 160, 0xBAD5EED) + LOUD
            attacker.sendto(packet, ("127.0.0.1", media.port))
            if seq % 10 == 9:
                await asyncio.sleep(0.02)
        await wait_for(lambda: media.latch.dropped["foreign"] >= 500, what="the forged packets counted")
        await wait_for(lambda: (foreign(metrics) or 0) >= 500, what="the flood in /metrics while the call runs")
        received_live = metrics.registry.get_sample_value("duetaspan_rtp_packets_received_total", {"transport": "sip"})
        assert ep.calls and received_live  # the call is still up; the caller's packets are counted already
        await wait_for(lambda: len(heard) >= before + 25, what="the caller heard for half a second more")
        sent_after_flood = media.stats()["packets_sent"]
        await wait_for(lambda: media.stats()["packets_sent"] >= sent_after_flood + 25, what="agent audio sent")
        flood_done.set()
        got = await sipp
        await wait_for(lambda: len(ep.finished) == 1, what="the call's end")
    reached_attacker = drain(attacker)
    attacker.close()
    assert got.rc == 0, got.output + got.errors
    assert reached_attacker == 0  # not one packet of the agent's audio went to the forger
    assert media.latch.addr == latched  # still latched to the caller
    assert max(int(np.abs(f).max()) for f in heard) < 1000  # the forged loud audio never became caller audio
    figures = media.stats()
    assert figures["rtp_dropped_foreign"] >= 500 and figures["rtp_dropped_ssrc"] == 0
    assert foreign(metrics) == figures["rtp_dropped_foreign"]  # in /metrics, each counted once (live + at the end)
    received = metrics.registry.get_sample_value("duetaspan_rtp_packets_received_total", {"transport": "sip"})
    assert received == call.quality.figures()["packets_received"] > received_live


def foreign(metrics: SipMetrics) -> float | None:
    return metrics.registry.get_sample_value(
        "duetaspan_rtp_packets_dropped_total", {"transport": "sip", "reason": "foreign"}
    )


def spoofed_invite(target_port: int, rtp_port: int, source: tuple[str, int], *, transport: str = "UDP") -> bytes:
    """An INVITE whose Via names an address that will never ACK (the forger's answers go nowhere it reads)."""
    sdp = (
        "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
        f"m=audio {rtp_port} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\na=sendrecv\r\n"
    )
    call_id = uuid.uuid4().hex
    head = (
        f"INVITE sip:agent@127.0.0.1:{target_port} SIP/2.0\r\n"
        f"Via: SIP/2.0/{transport} {source[0]}:{source[1]};branch=z9hG4bK{call_id[:10]};rport\r\n"
        f"From: <sip:trunk@127.0.0.1>;tag={call_id[:8]}\r\nTo: <sip:agent@127.0.0.1>\r\n"
        f"Call-ID: {call_id}\r\nCSeq: 1 INVITE\r\nContact: <sip:trunk@{source[0]}:{source[1]}>\r\n"
        f"Max-Forwards: 70\r\nContent-Type: application/sdp\r\nContent-Length: {len(sdp)}\r\n\r\n"
    )
    return (head + sdp).encode()


async def test_spoofed_invite_never_acked_gets_no_rtp_and_no_agent(monkeypatch):
    monkeypatch.setattr(aiosipua.transaction, "TIMER_H", 2.0)  # the 200's retransmissions give up at 2 s
    started: list[str] = []

    async def agent(call) -> None:
        started.append(call.call_sid)

    signalling, victim = udp_socket(), udp_socket()  # the forged Via's address; the SDP's (the reflection target)
    rtp_port = victim.getsockname()[1]
    async with checked_endpoint(agent) as ep:
        signalling.sendto(spoofed_invite(ep.port, rtp_port, signalling.getsockname()), ("127.0.0.1", ep.port))
        await wait_for(lambda: ep.ports.in_use == 1 or started, what="the INVITE answered on an RTP port")
        for ours in list(ep.ports.allocated):  # "RTP" to our port before any ACK: taken in and answered by nobody
            for seq in range(5):
                victim.sendto(struct.pack("!BBHII", 0x80, 0, seq, 160 * seq, 7) + LOUD, ("127.0.0.1", ours))
        await wait_for(lambda: not ep.answering, timeout_s=20, what="the unACKed call given up")
    answers = drain(signalling)
    reflected = drain(victim)
    signalling.close()
    victim.close()
    assert answers >= 2  # our 200 was retransmitted to the Via (the forger never ACKs it)
    assert reflected == 0  # and not one RTP or RTCP packet went toward the SDP's address
    assert started == [] and not ep.finished  # no agent ran


async def test_an_invite_answered_over_tcp_and_never_acked_is_given_up_too(monkeypatch):
    """RFC 3261 13.3.1.4: the 2xx is retransmitted, and its ACK awaited for 64*T1, on every transport (a TCP hop
    says nothing of the hops past it). A caller over TCP that never ACKs our 200 gets the retransmissions over
    its connection, no RTP and no agent, and its slot and ports back once they give up: not held until a BYE."""
    monkeypatch.setattr(aiosipua.transaction, "TIMER_H", 2.0)  # the 200's retransmissions give up at 2 s
    started: list[str] = []

    async def agent(call) -> None:
        started.append(call.call_sid)

    victim = udp_socket()
    rtp_port = victim.getsockname()[1]
    async with checked_endpoint(agent, transport="tcp") as ep:
        reader, writer = await asyncio.open_connection("127.0.0.1", ep.port)
        source = writer.get_extra_info("sockname")
        writer.write(spoofed_invite(ep.port, rtp_port, source, transport="TCP"))
        await writer.drain()
        received = bytearray()

        async def read_all() -> None:
            while chunk := await reader.read(65536):
                received.extend(chunk)

        reading = asyncio.create_task(read_all())
        await wait_for(lambda: b"SIP/2.0 200" in received, timeout_s=20, what="the INVITE answered over TCP")
        await wait_for(lambda: not ep.answering and ep.ports.in_use == 0 and not ep.uas._calls, timeout_s=20,
                       what="the unACKed TCP call given up, its RTP ports back")  # fmt: skip
        writer.close()  # the caller's side closes; the endpoint's side sees it before the endpoint stops
        await asyncio.wait_for(reading, 20)
        await wait_for(lambda: ep.uas.transport._open.total() == 0, timeout_s=20, what="the connection closed")
    reflected = drain(victim)
    victim.close()
    assert received.count(b"SIP/2.0 200 OK") >= 2  # retransmitted over the connection while no ACK came
    assert reflected == 0 and started == [] and not ep.finished


async def test_an_acked_call_latches_onto_the_invite_source_not_only_the_sdp_host(tmp_path):
    """A phone behind NAT: its SDP names a private address, its RTP comes from its public one (here: SIPp's
    media on 127.0.0.1 while the SDP says 10.0.0.1)."""
    silence = tmp_path / "silence.raw"
    silence.write_bytes(b"\xff" * 8000)
    text = (scenario("caller_streams", tmp_path, USER="agent", AUDIO=silence, PT=0, BYE_TIMEOUT_MS=30000)
            .read_text().replace("c=IN IP[media_ip_type] [media_ip]", "c=IN IP4 10.0.0.1"))  # fmt: skip
    path = tmp_path / "nat.xml"
    path.write_text(text)

    async def agent(call) -> None:
        await wait_for(lambda: call.media.latch.addr is not None, what="latched")
        call.media.set_output_rate(8000)
        call.media.send_audio(np.zeros(8000, np.float32))
        await wait_for(lambda: call.media.stats()["packets_sent"] >= 10, what="our RTP out")

    async with checked_endpoint(agent) as ep:
        got = await run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf", str(path), "-m", "1")
        await wait_for(lambda: len(ep.finished) == 1, what="the call's end")
    media = next(iter(ep.finished.values())).media
    assert got.rc == 0, got.output + got.errors
    assert media.latch.addr is not None and media.latch.addr[0] == "127.0.0.1"  # the INVITE's source host
    assert media.session._remote_addr == media.latch.addr  # our RTP went there, not to 10.0.0.1


def test_ports_are_drawn_at_random():
    from duetaspan.adapters.sip.ports import RtpPorts

    async def draw() -> list[int]:
        low = free_udp_port() // 2 * 2
        ports = RtpPorts((low, low + 400), host="127.0.0.1")
        got = [(await ports.allocate())[0] for _ in range(8)]
        assert ports.in_use == 8 and all(p % 2 == 0 and low <= p < low + 400 for p in got)
        for p in got:
            await ports.release(p)
        assert ports.in_use == 0
        return got

    got = asyncio.run(draw())
    assert got != sorted(got) or len(set(np.diff(got))) > 1  # not handed out in order from the bottom
