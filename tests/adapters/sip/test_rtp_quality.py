"""A call's RTP quality figures from real packets on loopback: our side is the endpoint's `CallMedia` on an
aiortp session, the peer another aiortp session whose RTP reaches us through a UDP relay that drops every
tenth packet; both send RTCP every ~0.2 s. The record's figures (`rtp_figures`) must show the loss the relay
made, a plausible interarrival jitter, and a round-trip time from the peer's receiver reports (RFC 3550
6.4.1); the same figures land in the `/metrics` series (`transport="sip"`)."""

from __future__ import annotations

import asyncio
import socket
import struct

import aiortp
import numpy as np
from aiosipua import build_sdp
from prometheus_client import CollectorRegistry, generate_latest

from duetaspan.adapters.sip.media import CallMedia
from duetaspan.adapters.sip.records import RtpQuality
from duetaspan.observability.sip_metrics import SipMetrics
from tests.adapters.sip.peer import free_udp_port, wait_for

FRAME = (np.zeros(160, dtype="<i2") + 200).tobytes()  # 20 ms of 8 kHz audio


class DroppingRelay(asyncio.DatagramProtocol):
    """Forwards datagrams to `target`, dropping every `drop_every`-th (0: none)."""

    def __init__(self, target: tuple[str, int], drop_every: int = 0) -> None:
        self.target, self.drop_every, self.seen = target, drop_every, 0
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        self.seen += 1
        if self.drop_every and self.seen % self.drop_every == 0:
            return
        assert self.transport is not None
        self.transport.sendto(data, self.target)


def _pair() -> int:
    return free_udp_port() // 2 * 2


async def test_loss_jitter_and_round_trip_from_real_rtp_and_rtcp():
    loop = asyncio.get_running_loop()
    ours, theirs, relay = _pair(), _pair(), _pair()
    if len({ours, theirs, relay}) < 3:
        relay = _pair()
    rtp_relay, _ = await loop.create_datagram_endpoint(
        lambda: DroppingRelay(("127.0.0.1", ours), drop_every=10), local_addr=("127.0.0.1", relay)
    )
    rtcp_relay, _ = await loop.create_datagram_endpoint(
        lambda: DroppingRelay(("127.0.0.1", ours + 1)), local_addr=("127.0.0.1", relay + 1)
    )
    offer = build_sdp(local_ip="127.0.0.1", rtp_port=ours, payload_type=0, codec_name="PCMU")
    media = CallMedia(offer, 0, ours)
    media.session = await aiortp.RTPSession.create(
        local_addr=("127.0.0.1", ours), remote_addr=("127.0.0.1", theirs), payload_type=0, rtcp_interval=0.2
    )
    peer = await aiortp.RTPSession.create(
        local_addr=("127.0.0.1", theirs), remote_addr=("127.0.0.1", relay), payload_type=0, rtcp_interval=0.2
    )
    quality = RtpQuality(media)
    try:
        for _ in range(150):  # 3 s both ways, on a 20 ms clock
            media.session.send_audio_pcm_auto(FRAME)
            peer.send_audio_pcm_auto(FRAME)
            await asyncio.sleep(0.02)
        await wait_for(lambda: len(quality.rtt_ms) >= 2, timeout_s=30, what="RTCP round trips")
        figures = quality.figures()
    finally:
        await peer.close()
        await media.close()
        rtp_relay.close()
        rtcp_relay.close()
    assert figures["packets_sent"] == 150 and figures["sources"] == 1
    assert 120 <= figures["packets_received"] <= 136, figures  # 150 sent, one in ten dropped by the relay
    assert 0.05 <= figures["loss_fraction"] <= 0.15, figures
    assert figures["packets_lost"] >= 10, figures
    assert 0.0 <= figures["jitter_ms"] < 100.0, figures
    assert 0.0 <= figures["rtt_ms"] < 500.0 and figures["rtt_samples"] >= 2, figures  # loopback
    assert "remote" in figures and figures["remote"]["loss_fraction"] <= 0.05  # nothing dropped our way

    metrics = SipMetrics(CollectorRegistry())
    metrics.call_rtp(figures, quality.rtt_ms)
    text = generate_latest(metrics.registry).decode()
    assert (
        f'duetaspan_rtp_packets_received_total{{transport="sip"}} {float(figures["packets_received"])}'
        in text
    )
    assert f'duetaspan_rtp_packets_lost_total{{transport="sip"}} {float(figures["packets_lost"])}' in text
    assert 'duetaspan_rtp_jitter_seconds_count{transport="sip"} 1.0' in text
    assert f'duetaspan_rtp_round_trip_seconds_count{{transport="sip"}} {float(len(quality.rtt_ms))}' in text


async def test_late_frames_are_counted_while_the_call_runs():
    """A caller whose every tenth packet arrives 400 ms late (after its playout time, the playout buffer holds
    at most 200 ms): the frames are dropped as late, counted in the figures and in `/metrics` while the call
    still runs, and the end of the call adds only what grew after that."""
    ours = _pair()
    caller = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    caller.bind(("127.0.0.1", 0))
    offer = build_sdp(local_ip="127.0.0.1", rtp_port=caller.getsockname()[1], payload_type=0, codec_name="PCMU")
    media = await CallMedia.open(offer, bind_ip="127.0.0.1", port=ours, source_ip="127.0.0.1")
    media.start()
    metrics = SipMetrics(CollectorRegistry())
    late = lambda: metrics.registry.get_sample_value("duetaspan_rtp_frames_late_total", {"transport": "sip"})  # noqa: E731
    held: list[tuple[float, bytes]] = []
    loop = asyncio.get_running_loop()
    payload = bytes([0xFF]) * 160
    try:
        for seq in range(150):  # 3 s on a 20 ms clock
            packet = struct.pack("!BBHII", 0x80, 0, seq, seq * 160, 0x1234) + payload
            if seq % 10 == 5:
                held.append((loop.time() + 0.4, packet))
            else:
                caller.sendto(packet, ("127.0.0.1", ours))
            while held and held[0][0] <= loop.time():
                caller.sendto(held.pop(0)[1], ("127.0.0.1", ours))
            await asyncio.sleep(0.02)
        quality = RtpQuality(media)
        await wait_for(lambda: quality.figures()["late"] >= 5, what="late frames counted")
        metrics.call_rtp(quality.figures(), call_id="c1", final=False)  # a report while the call runs
        live = late()
        assert live is not None and live >= 5
        final = quality.figures()
    finally:
        await media.close()
        caller.close()
    metrics.call_rtp(final, call_id="c1")
    assert late() == final["late"] >= live  # each counted once: live, then only what grew after
