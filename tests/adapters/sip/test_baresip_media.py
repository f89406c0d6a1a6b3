"""baresip, a real softphone, on the media the endpoint negotiates beyond G.711: SRTP over SIP/TLS (baresip's
`srtp` module, `mediaenc=srtp-mand`), and G.722 and Opus when baresip offers only those. Each call carries
audio both ways: the caller's fixture reaches the agent's side, our audio reaches baresip's recording."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import soxr

from duetaspan.adapters.sip.bridge import agent_call_handler
from duetaspan.adapters.sip.codecs import importable
from duetaspan.agent import Agent
from tests.adapters.sip.leaks import checked_endpoint
from tests.adapters.sip.peer import needs_baresip, sip_e2e, udp_bound, wait_for
from tests.adapters.sip.softphone import (
    audible_share,
    dial,
    heard,
    make_certificate,
    needs_openssl,
    softphone,
)
from tests.support import load_wav

# serial: real-time calls whose share of the call heard as audio is asserted (beside busy workers a SRTP and a
# G.722 call heard 79 % and 75 % of it): they want a core when they ask
pytestmark = [needs_baresip, sip_e2e, pytest.mark.slow, pytest.mark.serial]


def tone_and_listen(frequency: float, received: list[np.ndarray]):
    """A call handler that keeps what the caller says and answers with a steady tone at `frequency`."""

    async def handler(call) -> None:
        rate = 24000
        t = np.arange(rate // 50 * 4) / rate  # 80 ms, as the agent's frames

        async def speak() -> None:
            n = 0
            while not call.ended.is_set():
                chunk = 0.25 * np.sin(2 * np.pi * frequency * (t + n * 0.08))
                call.media.send_audio(chunk.astype(np.float32))
                n += 1
                await asyncio.sleep(0.08)

        speaker = asyncio.ensure_future(speak())
        try:
            async for pcm in call.media.audio():
                received.append(pcm)
        finally:
            speaker.cancel()

    return handler


def band_share(pcm: np.ndarray, rate: int, low: float, high: float) -> float:
    spectrum = np.abs(np.fft.rfft(pcm)) ** 2
    freqs = np.fft.rfftfreq(len(pcm), 1 / rate)
    return float(spectrum[(freqs >= low) & (freqs < high)].sum() / max(spectrum.sum(), 1e-12))


@needs_openssl
async def test_srtp_over_tls_with_baresip(tmp_path):
    """baresip over SIP/TLS with `mediaenc=srtp-mand` (RTP/SAVP, a=crypto) dials the agent: the call is
    SRTP both ways (the endpoint decrypts baresip's packets, baresip decrypts ours: with mandatory SRTP it
    drops anything else) and the agent is heard through the call."""
    cert, key = make_certificate(tmp_path)
    phone = softphone(tmp_path, "time_tokyo", pad_s=2.0, mediaenc="srtp-mand", cafile=cert)
    agent = Agent(model="tiny-random", device="cpu", router=False, record_dir=tmp_path, seed=0, max_calls=1)
    async with (
        agent,
        checked_endpoint(
            agent_call_handler(agent),
            max_calls=1,
            transport="tls",
            tls_cert=cert,
            tls_key=key,
            srtp="required",
        ) as ep,
    ):
        log = await dial(phone, ep.port, tmp_path)
        await wait_for(lambda: len(ep.finished) == 1, timeout_s=30, what="the call to finish")
        call = next(iter(ep.finished.values()))
    assert "Call established" in log, log[-3000:]
    assert call.end_reason == "caller hung up (BYE)"
    stats = call.media.stats()
    assert stats["srtp"] == "AES_CM_128_HMAC_SHA1_80", stats
    assert stats["srtp_unprotected"] >= 150 and stats["srtp_auth_failures"] == 0, (
        stats
    )  # baresip's, decrypted
    assert stats["srtp_protected"] >= 150, stats
    call_s = call.media.frames_in * 0.02
    assert call_s > 4.0
    pcm, rate = heard(phone)
    assert len(pcm) / rate >= 0.8 * call_s, (len(pcm) / rate, call_s)
    assert audible_share(pcm, rate) >= 0.8  # agent audio that baresip decrypted, not silence
    assert (tmp_path / f"{call.call_sid}.json").is_file()


@needs_openssl
async def test_srtp_required_refuses_a_plain_offer_with_488(tmp_path):
    cert, key = make_certificate(tmp_path)
    phone = softphone(tmp_path, "greeting", pad_s=0.0, cafile=cert)  # plain RTP/AVP over TLS
    received: list[np.ndarray] = []
    async with checked_endpoint(
        tone_and_listen(440, received), transport="tls", tls_cert=cert, tls_key=key, srtp="required"
    ) as ep:
        log = await dial(phone, ep.port, tmp_path, seconds=8)
        assert ep.refusals["no_srtp"] == 1, (ep.refusals, log[-2000:])
    assert "488" in log and "Call established" not in log, log[-2000:]
    assert not received


async def test_dialling_baresip_offers_rtp_savp(tmp_path):
    """We dial baresip (auto-answer, `mediaenc=srtp-mand`) with `srtp = "required"`: our RTP/SAVP offer with
    a=crypto is answered and the call is SRTP both ways. (SIP over UDP here, `srtp_plain_signalling`: our TLS
    listener does not open outbound connections.)"""
    phone = softphone(tmp_path, "greeting", pad_s=6.0, mediaenc="srtp-mand", answer=True)
    received: list[np.ndarray] = []
    async with checked_endpoint(
        tone_and_listen(440, received), srtp="required", srtp_plain_signalling=True
    ) as ep:
        baresip = asyncio.ensure_future(dial(phone, None, tmp_path, seconds=25))
        await udp_bound(phone.sip_port)
        result = await ep.dial(f"sip:tester@127.0.0.1:{phone.sip_port}", ring_timeout_s=20)
        assert result.outcome == "answered", result
        call = result.call
        await wait_for(lambda: len(received) >= 100, timeout_s=30, what="2 s of baresip's audio")
        await call.end_call("done", drain_s=0)
        await wait_for(lambda: len(ep.finished) == 1, timeout_s=30, what="the call to finish")
        log = await baresip
    stats = call.media.stats()
    assert "Call established" in log, log[-3000:]
    assert stats["srtp"] == "AES_CM_128_HMAC_SHA1_80" and stats["srtp_auth_failures"] == 0, stats
    assert stats["srtp_unprotected"] >= 100 and stats["srtp_protected"] >= 50, stats
    pcm, rate = heard(phone)
    assert audible_share(pcm, rate) >= 0.5  # our tone, which baresip (mandatory SRTP) decrypted


@pytest.mark.parametrize(
    ("module", "codec", "rate"), [("g722", "G722", 16000), ("opus", "opus", 48000)], ids=["g722", "opus"]
)
async def test_wideband_codec_offered_alone_is_negotiated(tmp_path, module, codec, rate):
    """baresip offers only G.722 (or only Opus): the call runs on it, at its rate both ways. Wideband shows
    in the spectrum: the caller's speech reaches us with its 4-7 kHz band (G.711 stops at 4 kHz), and our
    6 kHz tone reaches baresip's recording."""
    if not importable(codec.lower()):
        pytest.skip(f"{codec} is not available here: pip install duetaspan[sip-codecs]")
    phone = softphone(tmp_path, "greeting", pad_s=1.5, codecs=(module,), rate=16000)
    received: list[np.ndarray] = []
    async with checked_endpoint(tone_and_listen(6000, received)) as ep:
        log = await dial(phone, ep.port, tmp_path)
        assert "Call established" in log, log[-3000:]
        await wait_for(lambda: len(ep.finished) == 1, timeout_s=30, what="the call to finish")
        call = next(iter(ep.finished.values()))
    assert call.media.codec == codec and call.media.pcm_rate == rate and call.in_rate == rate
    caller = np.concatenate(received).astype(np.float32) / 32768
    assert len(caller) / rate > 3.0
    fixture, fixture_rate = load_wav("greeting")
    expected = band_share(soxr.resample(fixture, fixture_rate, 16000), 16000, 4000, 7000)
    got = band_share(caller, rate, 4000, 7000)
    assert expected > 0.002 and got > 0.3 * expected, (got, expected)  # wideband speech, not 8 kHz audio
    pcm, heard_rate = heard(phone)
    assert audible_share(pcm, heard_rate) >= 0.8
    assert band_share(pcm, heard_rate, 5800, 6200) > 0.5  # our 6 kHz tone, carried above G.711's band


async def test_the_agent_on_a_g722_call(tmp_path):
    """The agent itself (tiny-random) on a G.722 call: the caller's 16 kHz frames enter the pipeline at
    16 kHz (the service resamples them once), and baresip hears the agent through the call."""
    if not importable("g722"):
        pytest.skip("G722 is not available here: pip install duetaspan[sip-codecs]")
    phone = softphone(tmp_path, "time_tokyo", pad_s=2.0, codecs=("g722",), rate=16000)
    agent = Agent(model="tiny-random", device="cpu", router=False, record_dir=tmp_path, seed=0, max_calls=1)
    async with agent, checked_endpoint(agent_call_handler(agent), max_calls=1) as ep:
        log = await dial(phone, ep.port, tmp_path)
        assert "Call established" in log, log[-3000:]
        await wait_for(lambda: len(ep.finished) == 1, timeout_s=30, what="the call to finish")
        call = next(iter(ep.finished.values()))
    assert call.media.codec == "G722" and call.in_rate == 16000
    call_s = call.media.frames_in * 0.02
    assert call_s > 4.0
    pcm, rate = heard(phone)
    assert len(pcm) / rate >= 0.8 * call_s and audible_share(pcm, rate) >= 0.8
    record = tmp_path / f"{call.call_sid}.json"
    assert record.is_file()
