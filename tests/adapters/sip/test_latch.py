"""Latching (RFC 7362) on its own and on real sockets: what the latch takes in and drops, that nothing moves
before the ACK starts a call's media, that with SRTP only an authenticated packet can latch, and the SDP
answer's `o=` line across re-INVITEs."""

from __future__ import annotations

import asyncio
import struct

import numpy as np
import pylibsrtp
from aiosipua.sdp import parse_sdp

from duetaspan.adapters.sip.latch import SSRC_HANDOVER_S, RtpLatch
from duetaspan.adapters.sip.media import CallMedia
from duetaspan.adapters.sip.negotiate import MediaOptions
from duetaspan.config.sip import SipConfig
from tests.adapters.sip.peer import drain, free_udp_port, udp_socket, wait_for
from tests.adapters.sip.test_srtp import KEY, offer

CALLER, NAT = ("10.0.0.7", 4000), ("203.0.113.5", 31000)


def rtp(seq: int, ssrc: int = 0x1111, payload: bytes = b"\xff" * 160) -> bytes:
    return struct.pack("!BBHII", 0x80, 0, seq, seq * 160, ssrc) + payload


def test_the_latch_takes_the_first_good_source_and_holds_it():
    latch = RtpLatch({"10.0.0.7", "203.0.113.5"})  # the SDP's host, the INVITE's source
    assert not latch.admit_rtp(rtp(1), NAT, now=0.0) and latch.dropped["early"] == 1  # before the ACK
    latch.open()
    assert not latch.admit_rtp(rtp(1), ("198.51.100.1", 4000), now=0.0)  # a host of neither
    assert not latch.admit_rtp(b"\x00" * 20, NAT, now=0.0) and latch.dropped["malformed"] == 1
    assert latch.admit_rtp(rtp(1), NAT, now=0.0) and latch.addr == NAT  # behind NAT: its public address
    assert not latch.admit_rtp(rtp(2), CALLER, now=0.02)  # an allowed host, but not the latched address
    assert not latch.admit_rtp(rtp(2), (NAT[0], NAT[1] + 2), now=0.02)  # another port of the same host
    assert not latch.admit_rtp(rtp(2, ssrc=0x2222), NAT, now=0.02)  # another SSRC while the stream is live
    assert latch.admit_rtp(rtp(3), NAT, now=0.04)
    assert latch.dropped == {"early": 1, "foreign": 3, "malformed": 1, "ssrc": 1}
    # the stream stops; a new source from the latched address is taken once the old one is quiet
    assert latch.admit_rtp(rtp(1, ssrc=0x3333), NAT, now=0.04 + SSRC_HANDOVER_S) and latch.ssrc == 0x3333
    assert not latch.admit_rtp(rtp(4), NAT, now=0.06 + SSRC_HANDOVER_S)  # the old one is now the stranger
    # RTCP: first from the RTP host, then only from there
    assert not latch.admit_rtcp(b"\x81\xc9" + bytes(30), ("198.51.100.1", 4001))
    assert latch.admit_rtcp(b"\x81\xc9" + bytes(30), (NAT[0], NAT[1] + 1)) and latch.rtcp_addr == (NAT[0], 31001)
    assert not latch.admit_rtcp(b"\x81\xc9" + bytes(30), (NAT[0], 5555))


def test_a_reinvite_releases_the_ssrc_and_a_moved_address():
    latch = RtpLatch({"10.0.0.7"})
    latch.open()
    assert latch.admit_rtp(rtp(1), CALLER, now=0.0)
    latch.release({"10.0.0.7"}, moved=False)  # hold / resume: same address, the source may change
    assert latch.admit_rtp(rtp(2, ssrc=0x4444), CALLER, now=0.02) and latch.addr == CALLER
    latch.release({"192.0.2.9"}, moved=True)  # the media moved (a PBX re-anchoring it)
    assert not latch.admit_rtp(rtp(3, ssrc=0x4444), CALLER, now=0.04)
    assert latch.admit_rtp(rtp(1, ssrc=0x5555), ("192.0.2.9", 7000), now=0.04) and latch.addr == ("192.0.2.9", 7000)




async def test_nothing_moves_before_the_media_starts():
    peer = udp_socket()
    port = free_udp_port() // 2 * 2
    media = await CallMedia.open(offer(peer.getsockname()[1], "RTP/AVP", None), bind_ip="127.0.0.1", port=port,
                                 options=MediaOptions(srtp="off"))  # fmt: skip
    try:
        media.set_output_rate(8000)
        media.send_audio(np.full(8000, 0.2, np.float32))  # the agent would speak: queued, never sent
        for seq in range(20):
            peer.sendto(rtp(seq), ("127.0.0.1", port))
        await wait_for(lambda: media.latch.dropped["early"] >= 20, what="the early packets dropped")
        await asyncio.sleep(0.3)  # a quiet wire is only seen by waiting: 15 pacer ticks
        assert drain(peer) == 0 and media.frames_in == 0 and media.session._stream_stats is None
        media.start()  # the ACK came
        media.send_audio(np.full(1600, 0.2, np.float32))
        for seq in range(20, 40):
            peer.sendto(rtp(seq), ("127.0.0.1", port))
            await asyncio.sleep(0.02)
        await wait_for(lambda: media.frames_in >= 5, what="caller audio once started")
        await wait_for(lambda: drain(peer) > 0, what="our RTP once started")
    finally:
        await media.close()
        peer.close()


async def test_with_srtp_only_an_authenticated_packet_latches():
    peer, forger = udp_socket(), udp_socket()
    port = free_udp_port() // 2 * 2
    media = await CallMedia.open(offer(peer.getsockname()[1]), bind_ip="127.0.0.1", port=port,
                                 options=MediaOptions(srtp="required"))  # fmt: skip
    media.start()
    tx = pylibsrtp.Session(pylibsrtp.Policy(key=KEY, ssrc_type=pylibsrtp.Policy.SSRC_ANY_OUTBOUND,
                                            srtp_profile=pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80))  # fmt: skip
    try:
        for seq in range(10):  # plain RTP from the SDP's own host, first: it cannot latch
            forger.sendto(rtp(seq, ssrc=0x9999), ("127.0.0.1", port))
        await wait_for(lambda: media.srtp is not None and media.srtp.auth_failures >= 10, what="forgeries refused")
        assert media.latch.addr is None
        for seq in range(10):
            peer.sendto(tx.protect(rtp(seq)), ("127.0.0.1", port))
        await wait_for(lambda: media.latch.addr is not None, what="the latch")
        assert media.latch.addr == peer.getsockname() and media.latch.ssrc == 0x1111
    finally:
        await media.close()
        peer.close()
        forger.close()


async def test_reinvite_answers_keep_the_session_id():
    port = free_udp_port() // 2 * 2
    media = await CallMedia.open(offer(4000, "RTP/AVP", None), bind_ip="127.0.0.1", port=port)
    try:
        first = media.answer.origin
        same = media.renegotiate(offer(4000, "RTP/AVP", None))
        assert (same.origin.session_id, same.origin.session_version) == (first.session_id, first.session_version)
        held = media.renegotiate(parse_sdp(str(_with(offer(4000, "RTP/AVP", None), "a=sendonly"))))
        assert held.origin.session_id == first.session_id
        assert int(held.origin.session_version) == int(first.session_version) + 1  # the SDP changed: recvonly
        moved = media.renegotiate(offer(4002, "RTP/AVP", None))
        assert moved.origin.session_id == first.session_id
        assert int(moved.origin.session_version) == int(first.session_version) + 2
    finally:
        await media.close()


def _with(sdp, line: str):
    from aiosipua.sdp import serialize_sdp

    return serialize_sdp(sdp).replace("a=sendrecv", line)


def test_srtp_is_optional_by_default_over_tls():
    from duetaspan.adapters.sip.serve import sip_settings
    from duetaspan.config import AgentConfig

    tls = SipConfig(transport="tls", tls_cert="c.pem", tls_key="k.pem")
    assert tls.srtp_mode == "optional"
    assert SipConfig().srtp_mode == "off"  # keys in readable signalling: never by default
    assert SipConfig(transport="tls", tls_cert="c.pem", tls_key="k.pem", srtp="off").srtp_mode == "off"
    # `serve --sip-transport tls` over an agent.toml that names no srtp: optional, as if the file said tls
    config = AgentConfig.model_validate({"sip": {"tls_cert": "c.pem", "tls_key": "k.pem"}})
    assert sip_settings(config, {"transport": "tls"}, host="127.0.0.1", env={}).srtp == "optional"
    assert sip_settings(config, True, host="127.0.0.1", env={}).srtp == "off"
