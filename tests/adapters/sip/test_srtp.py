"""SRTP with SDES keys: the `a=crypto` negotiation and what goes on the wire. The peer here is a plain UDP
socket keyed with libsrtp (`pylibsrtp`) from the SDP alone, as any SRTP phone would be: it must see no
plain RTP from us, decrypt our audio with the key our answer gave, and reach the agent only through SRTP."""

from __future__ import annotations

import asyncio
import base64
import socket
import struct

import numpy as np
import pylibsrtp
import pytest
from aiortp.codecs import PcmuCodec
from aiosipua.sdp import parse_sdp

from duetaspan.adapters.sip.media import CallMedia
from duetaspan.adapters.sip.negotiate import MediaOptions, answer_offer, build_offer
from duetaspan.adapters.sip.srtp import (
    CryptoLine,
    SrtpRefused,
    SrtpRequired,
    effective_mode,
)
from tests.adapters.sip.peer import free_udp_port, wait_for

KEY = bytes(range(30))
KEY_B64 = base64.b64encode(KEY).decode()


def offer(
    port: int, proto: str = "RTP/SAVP", crypto: str | None = f"1 AES_CM_128_HMAC_SHA1_80 inline:{KEY_B64}"
):
    lines = [
        "v=0", "o=- 1 1 IN IP4 127.0.0.1", "s=-", "c=IN IP4 127.0.0.1", "t=0 0",
        f"m=audio {port} {proto} 0 101", "a=rtpmap:0 PCMU/8000", "a=rtpmap:101 telephone-event/8000",
    ]  # fmt: skip
    if crypto:
        lines.append(f"a=crypto:{crypto}")
    return parse_sdp("\r\n".join([*lines, "a=sendrecv", ""]))


def test_crypto_lines_parse_only_what_we_can_use():
    good = CryptoLine.parse(f"1 AES_CM_128_HMAC_SHA1_80 inline:{KEY_B64}")
    assert good is not None and good.key == KEY and good.tag == 1
    assert KEY_B64 not in repr(good)  # keys never reach a log line through repr
    assert CryptoLine.parse(f"1 AES_CM_128_HMAC_SHA1_32 inline:{KEY_B64}|2^20") is not None  # a lifetime
    for bad in (
        f"1 F8_128_HMAC_SHA1_80 inline:{KEY_B64}",  # a suite we do not speak
        f"1 AES_CM_128_HMAC_SHA1_80 inline:{KEY_B64}|2^20|1:4",  # an MKI
        f"1 AES_CM_128_HMAC_SHA1_80 inline:{base64.b64encode(KEY[:20]).decode()}",  # a short key
        f"1 AES_CM_128_HMAC_SHA1_80 inline:{KEY_B64} UNENCRYPTED_SRTP",  # session parameters
        "x AES_CM_128_HMAC_SHA1_80 inline:!!!",
    ):
        assert CryptoLine.parse(bad) is None, bad


def test_modes_decide_the_answer():
    required, optional, off = (MediaOptions(srtp=m) for m in ("required", "optional", "off"))
    got = answer_offer(offer(4000), required, local_ip="127.0.0.1", port=5000)
    audio = got.sdp.audio
    assert audio is not None and audio.proto == "RTP/SAVP" and got.srtp is not None
    ours = CryptoLine.parse(audio.attributes["crypto"][0])
    assert ours is not None and ours.tag == 1 and ours.key != KEY  # a fresh key of ours, the offer's tag
    with pytest.raises(SrtpRequired):  # required: a plain offer is refused (488)
        answer_offer(offer(4000, "RTP/AVP", None), required, local_ip="127.0.0.1", port=5000)
    with pytest.raises(SrtpRefused):  # off: RTP/SAVP cannot be answered with plain RTP
        answer_offer(offer(4000), off, local_ip="127.0.0.1", port=5000)
    plain = answer_offer(offer(4000, "RTP/AVP", None), optional, local_ip="127.0.0.1", port=5000)
    assert plain.srtp is None and "crypto" not in plain.sdp.audio.attributes  # type: ignore[union-attr]
    best_effort = answer_offer(offer(4000, "RTP/AVP"), optional, local_ip="127.0.0.1", port=5000)
    assert best_effort.srtp is not None  # a=crypto in RTP/AVP (baresip's `mediaenc srtp`)
    sdp, lines = build_offer(required, local_ip="127.0.0.1", port=5000)
    assert sdp.audio is not None and sdp.audio.proto == "RTP/SAVP" and len(lines) == 2
    with pytest.raises(ValueError, match="tls"):  # keys over readable signalling need saying so
        effective_mode("required", "udp", plain_signalling=False)
    assert effective_mode("optional", "udp", plain_signalling=True) == "optional"


def _rtp(seq: int, payload: bytes, ssrc: int = 0x1234) -> bytes:
    return struct.pack("!BBHII", 0x80, 0, seq, seq * 160, ssrc) + payload


async def test_the_wire_carries_srtp_both_ways():
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))
    peer.setblocking(False)
    peer_port = peer.getsockname()[1]
    port = free_udp_port() // 2 * 2
    media = await CallMedia.open(
        offer(peer_port), bind_ip="127.0.0.1", port=port, options=MediaOptions(srtp="required")
    )
    media.start()  # the ACK confirmed the call: media flows
    loop = asyncio.get_running_loop()
    try:
        answer = media.answer.audio
        assert answer is not None and media.srtp is not None
        ours = CryptoLine.parse(answer.attributes["crypto"][0])
        assert ours is not None
        rx = pylibsrtp.Session(pylibsrtp.Policy(key=ours.key, ssrc_type=pylibsrtp.Policy.SSRC_ANY_INBOUND,
                                                srtp_profile=pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80))  # fmt: skip
        tx = pylibsrtp.Session(pylibsrtp.Policy(key=KEY, ssrc_type=pylibsrtp.Policy.SSRC_ANY_OUTBOUND,
                                                srtp_profile=pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80))  # fmt: skip
        # ours -> the peer: a 1 kHz tone, 24 kHz float, as the agent speaks
        t = np.arange(24000 * 0.5) / 24000
        media.send_audio((0.3 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32))
        wire: list[bytes] = []
        deadline = loop.time() + 20
        while len(wire) < 10 and loop.time() < deadline:
            try:
                wire.append(await asyncio.wait_for(loop.sock_recv(peer, 2048), 5))
            except TimeoutError:
                break
        rtp = [p for p in wire if not 200 <= p[1] <= 206]
        assert len(rtp) >= 10, len(wire)
        codec = PcmuCodec()
        decoded = []
        for packet in rtp:
            assert len(packet) == 12 + 160 + 10  # header, G.711 payload, the 80-bit auth tag
            plain = rx.unprotect(packet)
            assert packet[12:172] != plain[12:]  # the payload on the wire is not the audio
            decoded.append(np.frombuffer(codec.decode(plain[12:]), "<i2"))
        tone = np.concatenate(decoded).astype(np.float32) / 32768
        assert np.sqrt((tone[-800:] ** 2).mean()) > 0.1  # our audio, decrypted with the answer's key
        # the peer -> ours: SRTP is decoded, a plain packet (a forgery without the key) is dropped
        silence = codec.encode(np.zeros(160, "<i2").tobytes())
        loud = codec.encode((np.sin(np.arange(160) / 3) * 20000).astype("<i2").tobytes())
        peer.sendto(_rtp(1, loud), ("127.0.0.1", port))  # plain RTP: a forgery, without the key
        for seq in range(2, 40):
            peer.sendto(tx.protect(_rtp(seq, silence)), ("127.0.0.1", port))
            await asyncio.sleep(0.02)
        await wait_for(lambda: media.srtp is not None and media.srtp.unprotected >= 30, 20, "SRTP in")
        await wait_for(lambda: media.frames_in >= 10, 20, "decoded frames")
        assert media.srtp.auth_failures == 1
        frames = media.audio()
        heard = [await asyncio.wait_for(anext(frames), 5) for _ in range(media.frames_in)]
        assert max(int(np.abs(f).max()) for f in heard) < 1000  # the forged loud packet never reached us
        stats = media.stats()
        assert stats["srtp"] == "AES_CM_128_HMAC_SHA1_80" and stats["srtp_auth_failures"] == 1
        assert KEY_B64 not in repr(stats) and base64.b64encode(ours.key).decode() not in repr(stats)
    finally:
        await media.close()
        peer.close()
