"""One call's media: an `aiortp` RTP session (G.711 mu-law or A-law, G.722 or Opus where offered and
available, RTCP, the jitter buffer with loss concealment, RFC 4733 DTMF, symmetric RTP; SRTP with SDES keys
where negotiated) between the caller and the agent's pipeline. The negotiation itself (codec, `a=crypto`)
is `duetaspan.adapters.sip.negotiate`.

Inbound, aiortp's clocked playout hands us one decoded 20 ms frame of int16 at the codec's PCM rate
(`pcm_rate`: 8 kHz for G.711, 16 kHz for G.722, 48 kHz for Opus) per tick (a lost packet is concealed
there); `audio()` yields them to the pipeline, whose service resamples to the model's 24 kHz and feeds the
80 ms engine clock. Outbound, the agent's 24 kHz float32 audio is resampled to `pcm_rate` (soxr, streaming),
cut into 20 ms frames and queued on aiortp's paced sender, which sends one RTP packet per 20 ms on the media
clock; `clear()` drops what is queued (barge-in).

Example:
    >>> # media = await CallMedia.open(offer, bind_ip="127.0.0.1", port=20000)   # doctest: +SKIP
    >>> # async for pcm in media.audio(): media.send_audio(pcm.astype("float32") / 32768)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import soxr
from aiortp.dtmf import DTMF_EVENTS
from aiosipua.sdp import SdpMessage

from duetaspan.adapters.sip.codecs import PCMU, CodecSpec, tune_session
from duetaspan.adapters.sip.latch import LatchedRTPSession, RtpLatch
from duetaspan.adapters.sip.negotiate import (
    DTMF_PAYLOAD,
    MediaOptions,
    Negotiated,
    answer_offer,
    answered,
    same_origin,
)
from duetaspan.adapters.sip.srtp import CryptoLine, SrtpContext, SrtpRTPSession
from duetaspan.model.convention import SAMPLE_RATE

logger = logging.getLogger("duetaspan.sip")

RTP_RATE = 8000  # G.711's (the PCM rate of each codec: `CodecSpec.pcm_rate`)
FRAME_SAMPLES = 160  # 20 ms at 8 kHz
INBOUND_QUEUE_FRAMES = 50  # 1 s: past that the pipeline fell behind; the newest audio wins
DTMF_MIN_GAP_S = 0.01  # the least time between two RFC 4733 packets of an event (they are due every 20 ms)


class CallMedia:
    """The RTP side of one call. Build it with `CallMedia.open(...)`; `close()` releases the ports."""

    def __init__(self, answer: SdpMessage, payload_type: int, port: int, spec: CodecSpec = PCMU) -> None:
        self.answer = answer
        self.payload_type = payload_type
        self.port = port
        self.spec = spec
        self.pcm_rate = spec.pcm_rate  # of the caller's frames from `audio()` and of what goes on the wire
        self.options = MediaOptions()
        self.srtp: SrtpContext | None = None
        self.session: Any = None
        self.sample_rate = SAMPLE_RATE  # of the agent audio given to `send_audio`
        self.frames_in = 0
        self.frames_out = 0
        self.dropped_in = 0
        self.dtmf_in: list[str] = []
        self._inbound: asyncio.Queue[np.ndarray | None] = asyncio.Queue(maxsize=INBOUND_QUEUE_FRAMES)
        self._pending = np.zeros(0, dtype=np.int16)
        self._resampler = soxr.ResampleStream(SAMPLE_RATE, self.pcm_rate, 1, dtype="float32", quality="HQ")
        self._dtmf_listeners: list[Callable[[str], object]] = []
        self._closed = False
        self._ended_input = False
        self.bind_ip = "127.0.0.1"
        self.advertised_ip: str | None = None
        self.held = False  # the caller put us on hold (their offer: sendonly or inactive)
        self.holds = 0
        self.latch = RtpLatch(())  # who may send us RTP; nothing moves before `start()` (`latch.py`)
        self.source_ip: str | None = None  # of the peer's signalling (a phone behind NAT sends RTP from it)
        self.started_at: float | None = None  # monotonic, at `start()`
        self.offered: tuple[str, int] | None = None  # the RTP address the peer's SDP named

    @classmethod
    async def open(
        cls,
        offer: SdpMessage,
        *,
        bind_ip: str,
        port: int,
        advertised_ip: str | None = None,
        options: MediaOptions | None = None,
        source_ip: str | None = None,
    ) -> CallMedia:
        """Negotiate the answer to `offer` (raises `SdpNegotiationError` for no common codec, or when SRTP and
        the offer cannot meet) and bind RTP on `port` and RTCP on `port + 1`. Nothing is sent or taken in
        before `start()`; then RTP latches onto the first packet from the offer's host or `source_ip` (the
        INVITE's source)."""
        options = options or MediaOptions()
        got = answer_offer(offer, options, local_ip=bind_ip, port=port, advertised_ip=advertised_ip)
        remote = offer.rtp_address
        if remote is None:
            raise ValueError("SDP offer has no RTP address (no c= or audio m= line)")
        return await cls._start(got, options, bind_ip=bind_ip, port=port, remote=remote, advertised_ip=advertised_ip,
                                source_ip=source_ip)  # fmt: skip

    @classmethod
    async def _start(
        cls,
        got: Negotiated,
        options: MediaOptions,
        *,
        bind_ip: str,
        port: int,
        remote: tuple[str, int],
        advertised_ip: str | None,
        source_ip: str | None = None,
    ) -> CallMedia:
        media = cls(got.sdp, got.payload_type, port, got.spec)
        media.bind_ip, media.advertised_ip, media.options, media.srtp = bind_ip, advertised_ip, options, got.srtp
        media.source_ip, media.offered = source_ip, remote
        media.latch = RtpLatch((remote[0], source_ip or ""))
        session_class = SrtpRTPSession if got.srtp is not None else LatchedRTPSession
        media.session = await session_class.create(
            local_addr=(bind_ip, port),
            remote_addr=remote,
            payload_type=got.payload_type,
            codec=got.spec.make(),
            clock_rate=got.spec.clock_rate,
            dtmf_payload_type=DTMF_PAYLOAD,
            plc=True,
            playout=True,
            playout_max_delay_ms=200,
            paced=True,
            symmetric_rtp=True,  # NAT: answer where the caller's packets come from, once latched (`latch.py`)
        )
        media.session.latch = media.latch
        if got.srtp is not None:
            media.session.srtp = got.srtp
        tune_session(media.session, got.spec)
        media.session.on_audio = media._on_audio
        media.session.on_dtmf = media._on_dtmf
        return media

    def renegotiate(self, offer: SdpMessage) -> SdpMessage:
        """Answer a re-INVITE's offer on the same port and codec (raises `SdpNegotiationError`): hold
        (`sendonly`/`inactive` offered) stops our audio, resume (`sendrecv`) starts it again; a new RTP address
        is followed."""
        options = MediaOptions(self.options.codecs, "off")  # a plain call stays plain (SAVP re-offer: 488)
        answer = answer_offer(
            offer, options, local_ip=self.bind_ip, port=self.port, advertised_ip=self.advertised_ip,
            keep=(self.payload_type, self.spec), srtp=self.srtp,
        ).sdp  # fmt: skip
        answer = same_origin(self.answer, answer)  # the o= session id stays; its version moves on a change
        audio = offer.audio
        held = audio is not None and audio.direction in ("sendonly", "inactive")
        if held and not self.held:
            self.holds += 1
            self.clear()
        self.held = held
        remote = offer.rtp_address
        if remote is not None and remote[0] not in ("0.0.0.0", "::") and self.session is not None:
            moved = remote != self.offered
            # RFC 3550: the SSRC may change now; the address only where the offer moved it
            self.latch.release((remote[0], self.source_ip or ""), moved=moved)
            if moved:
                self.session.update_remote(remote)
            self.offered = remote
        self.answer = answer
        logger.info("re-INVITE: %s", "on hold" if held else "resumed")
        return answer

    @classmethod
    async def open_answered(
        cls,
        offer: SdpMessage,
        answer: SdpMessage,
        *,
        bind_ip: str,
        port: int,
        advertised_ip: str | None = None,
        options: MediaOptions | None = None,
        crypto: list[CryptoLine] | None = None,
        source_ip: str | None = None,
    ) -> CallMedia:
        """The media of a call we placed: our `offer` on `port` (with our `crypto` lines, from
        `negotiate.build_offer`), the callee's `answer` naming codec, address and its SRTP key; started at
        once (the 2xx is in and ACKed), latching onto the answer's host or `source_ip` (the 2xx's source)."""
        options = options or MediaOptions()
        remote = answer.rtp_address
        if remote is None:
            raise ValueError("the callee's SDP answer has no audio address")
        got = answered(offer, crypto or [], answer, options)
        media = await cls._start(got, options, bind_ip=bind_ip, port=port, remote=remote,
                                 advertised_ip=advertised_ip, source_ip=source_ip)  # fmt: skip
        media.start()
        return media

    def start(self) -> None:
        """The dialog is confirmed (the ACK came): RTP flows both ways from now on."""
        if self.started_at is None:
            self.started_at = time.monotonic()
            self.latch.open()

    @property
    def codec(self) -> str:
        return self.spec.name

    # --- the agent's side ---------------------------------------------------------------------------
    async def audio(self) -> AsyncIterator[np.ndarray]:
        """The caller's audio: int16 frames at `pcm_rate`, 20 ms each, until `close()`."""
        while True:
            item = await self._inbound.get()
            if item is None:
                return
            yield item

    def send_audio(self, pcm: np.ndarray) -> None:
        """Queue agent audio (float32 at `sample_rate`) as 20 ms RTP frames on the paced sender."""
        if self._closed or self.session is None or self.held:
            return
        out = self._resampler.resample_chunk(np.asarray(pcm, dtype=np.float32).reshape(-1))
        samples = np.clip(np.rint(out * 32768.0), -32768, 32767).astype(np.int16)
        buf = np.concatenate([self._pending, samples])
        step = self.spec.frame_samples
        whole = len(buf) // step * step
        for start in range(0, whole, step):
            self.session.send_audio_pcm_auto(buf[start : start + step].astype("<i2").tobytes())
            self.frames_out += 1
        self._pending = buf[whole:]

    def set_output_rate(self, rate: int) -> None:
        if rate != self.sample_rate:
            self.sample_rate = rate
            self._resampler = soxr.ResampleStream(rate, self.pcm_rate, 1, dtype="float32", quality="HQ")

    def clear(self) -> int:
        """Barge-in: drop queued agent audio; returns the ms dropped."""
        pacer = getattr(self.session, "_paced_sender", None)  # aiortp exposes no public discard
        dropped = pacer.queue_depth if pacer is not None else 0
        if pacer is not None:
            pacer.discard()
        self._pending = np.zeros(0, dtype=np.int16)
        self._resampler.clear()
        return dropped * 20

    def queued_ms(self) -> int:
        pacer = getattr(self.session, "_paced_sender", None)
        return pacer.queue_depth * 20 if pacer is not None else 0

    def send_dtmf(self, digit: str, duration_ms: int = 160) -> None:
        """Send one RFC 4733 telephone-event digit, stamped with the stream's current RTP timestamp (each
        event needs its own; aiortp would stamp every event 0)."""
        if self.session is not None and not self._closed:
            sender = getattr(self.session, "_sender", None)
            stamp = int(getattr(sender, "current_timestamp", 0)) if sender is not None else 0
            self.session.send_dtmf(digit, duration_ms, timestamp=stamp)

    async def send_dtmf_paced(self, digit: str, duration_ms: int = 160, volume: int = 10) -> None:
        """One RFC 4733 event as a phone sends it: the first packet with the marker bit, a progress packet
        every 20 ms in real time (an IVR misses a digit whose packets come in one burst, as aiortp sends
        them), then the end packet three times; all stamped with the stream's current RTP timestamp."""
        sender = getattr(self.session, "_sender", None)
        if sender is None or self._closed:
            return
        code = DTMF_EVENTS[digit.upper()]  # KeyError: not a DTMF key (the tool validates digits first)
        rate = int(getattr(getattr(self.session, "_dtmf_sender", None), "_clock_rate", 8000) or 8000)
        step, total = rate * 20 // 1000, max(rate * duration_ms // 1000, rate * 40 // 1000)
        stamp, addr = int(getattr(sender, "current_timestamp", 0)), getattr(self.session, "_remote_addr", None)
        loop = asyncio.get_running_loop()
        start, sent, duration = loop.time(), 0, step
        while duration < total and not self._closed:
            payload = struct.pack("!BBH", code, volume & 0x3F, duration)
            sender.send_raw(DTMF_PAYLOAD, payload, stamp, marker=1 if sent == 0 else 0, addr=addr)
            sent += 1
            duration += step
            # on the 20 ms grid; after a late wake-up the lost time is made up over the next packets, never by
            # sending two at once (a stalled loop once woke 27 ms late and the next packet left 18 us after it)
            await asyncio.sleep(max(DTMF_MIN_GAP_S, start + sent * 0.02 - loop.time()))
        end = struct.pack("!BBH", code, 0x80 | (volume & 0x3F), total)
        for _ in range(3):  # RFC 4733 2.5.1.4: the end packet three times
            if not self._closed:
                sender.send_raw(DTMF_PAYLOAD, end, stamp, marker=0, addr=addr)

    def on_dtmf(self, listener: Callable[[str], object]) -> None:
        self._dtmf_listeners.append(listener)

    def dtmf(self, digit: str) -> None:
        """A digit from the caller (RFC 4733 here, or SIP INFO from the endpoint)."""
        self.dtmf_in.append(digit)
        for listener in self._dtmf_listeners:
            try:
                listener(digit)
            except Exception:
                logger.exception("DTMF listener failed")

    def stats(self) -> dict[str, Any]:
        """RTP/RTCP figures for the record: packets, loss, jitter, concealment."""
        raw = dict(self.session.stats) if self.session is not None else {}
        keep = (
            "packets_sent",
            "packets_received",
            "packets_lost",
            "jitter",
            "concealed_frames",
            "late_dropped",
            "remote_fraction_lost",
            "remote_packets_lost",
            "remote_jitter",
        )
        out: dict[str, Any] = {k: raw[k] for k in keep if k in raw}
        out.update(
            codec=self.codec,
            frames_in=self.frames_in,
            frames_out=self.frames_out,
            dropped_in=self.dropped_in,
            dtmf_in="".join(self.dtmf_in),
        )
        out.update(self.latch.figures())
        if self.srtp is not None:
            out.update(self.srtp.stats())
        return out

    async def drain(self, timeout_s: float) -> None:
        if self.session is not None and not self._closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.session.drain(), timeout_s)

    def end_input(self) -> None:
        """End `audio()` (the call is over); idempotent."""
        if self._ended_input:
            return
        self._ended_input = True
        with contextlib.suppress(asyncio.QueueFull):
            if self._inbound.full():
                self._inbound.get_nowait()
            self._inbound.put_nowait(None)

    async def close(self) -> None:
        """End `audio()` and close the RTP session (an RTCP BYE goes out)."""
        self.end_input()
        if self._closed:
            return
        self._closed = True
        if self.session is not None:
            await self.session.close()

    # --- aiortp callbacks ----------------------------------------------------------------------------
    def _on_audio(self, pcm: bytes, timestamp: int) -> None:
        if self._ended_input:
            return
        frame = np.frombuffer(pcm, dtype="<i2").copy()
        self.frames_in += 1
        if self._inbound.full():
            self._inbound.get_nowait()
            self.dropped_in += 1
        self._inbound.put_nowait(frame)

    def _on_dtmf(self, digit: str, duration: int) -> None:
        logger.info("RTP DTMF %s (%d)", digit, duration)
        self.dtmf(digit)


__all__ = ["FRAME_SAMPLES", "RTP_RATE", "CallMedia"]
