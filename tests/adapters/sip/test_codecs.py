"""Codec negotiation and RTP clocks: the caller's preference wins among what we allow and can load, Opus's
dynamic payload type and rtpmap, and the timestamps on the wire (G.722: 160 per 20 ms on its 8000 Hz clock,
RFC 3551, though a frame is 320 samples; Opus: 960 at 48 kHz)."""

from __future__ import annotations

import asyncio
import itertools
import socket
import struct

import numpy as np
import pytest
from aiosipua.sdp import SdpNegotiationError, parse_sdp

from duetaspan.adapters.sip.codecs import importable
from duetaspan.adapters.sip.media import CallMedia
from duetaspan.adapters.sip.negotiate import MediaOptions, answer_offer
from tests.adapters.sip.peer import free_udp_port

OPUS = "a=rtpmap:96 opus/48000/2"


def offer(port: int, formats: str, *rtpmaps: str):
    lines = ["v=0", "o=- 1 1 IN IP4 127.0.0.1", "s=-", "c=IN IP4 127.0.0.1", "t=0 0",
             f"m=audio {port} RTP/AVP {formats} 101", *rtpmaps, "a=rtpmap:101 telephone-event/8000", "a=sendrecv"]  # fmt: skip
    return parse_sdp("\r\n".join([*lines, ""]))


def test_the_callers_preference_among_what_we_allow():
    got = answer_offer(offer(4000, "0 9 96", OPUS), MediaOptions(), local_ip="127.0.0.1", port=5000)
    assert got.spec.name == "PCMU"  # the caller listed PCMU first
    if importable("opus"):
        got = answer_offer(offer(4000, "96 9 0", OPUS), MediaOptions(), local_ip="127.0.0.1", port=5000)
        assert (got.spec.name, got.payload_type) == ("opus", 96)  # the offer's dynamic number
        assert "96 opus/48000/2" in got.sdp.audio.attributes["rtpmap"]  # type: ignore[union-attr]
    only_g711 = MediaOptions(codecs=("pcmu", "pcma"))
    got = answer_offer(offer(4000, "96 9 8", OPUS), only_g711, local_ip="127.0.0.1", port=5000)
    assert got.spec.name == "PCMA"  # G.711 when the wideband codecs are not allowed (or not installed)
    with pytest.raises(SdpNegotiationError):
        answer_offer(offer(4000, "96", OPUS), only_g711, local_ip="127.0.0.1", port=5000)


@pytest.mark.parametrize(("fmt", "rtpmap", "key", "step", "payload"), [
    ("9", "a=rtpmap:9 G722/8000", "g722", 160, 160), ("96", OPUS, "opus", 960, None),
], ids=["g722", "opus"])  # fmt: skip
async def test_rtp_timestamps_follow_the_codec_clock(fmt, rtpmap, key, step, payload):
    if not importable(key):
        pytest.skip(f"{key} not available: pip install duetaspan[sip-codecs]")
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))
    peer.setblocking(False)
    port = free_udp_port() // 2 * 2
    media = await CallMedia.open(offer(peer.getsockname()[1], fmt, rtpmap), bind_ip="127.0.0.1", port=port)
    media.start()  # the ACK confirmed the call: media flows
    loop = asyncio.get_running_loop()
    try:
        assert media.pcm_rate == {"g722": 16000, "opus": 48000}[key]
        t = np.arange(24000 // 2) / 24000  # 0.5 s of the agent at 24 kHz
        media.send_audio((0.3 * np.sin(2 * np.pi * 5000 * t)).astype(np.float32))
        packets: list[bytes] = []
        while len(packets) < 12:
            data = await asyncio.wait_for(loop.sock_recv(peer, 2048), 10)
            if not 200 <= data[1] <= 206:  # not RTCP
                packets.append(data)
        stamps = [struct.unpack_from("!I", p, 4)[0] for p in packets]
        assert {b - a for a, b in itertools.pairwise(stamps)} == {step}, stamps
        if payload is not None:
            assert {len(p) - 12 for p in packets} == {payload}  # 320 samples -> 160 bytes of G.722
    finally:
        await media.close()
        peer.close()
