"""The audio codecs the SIP endpoint speaks, and how each one meets the pipeline: G.711 mu-law and A-law
(always), G.722 (wideband; the `G722` package) and Opus (the `opuslib` package and libopus), the last two
where they import (`pip install duetaspan[sip-codecs]`). An answer takes the first codec of the caller's
offer that is allowed (`[sip] codecs`) and available, by encoding name (Opus has a dynamic payload type);
our own offers list them in `[sip] codecs` order.

Rates: the RTP clock and the PCM rate differ for G.722 (16 kHz audio, an 8000 Hz RTP clock, the RFC 3551
quirk: a 20 ms frame is 320 samples but 160 timestamp units; aiortp's sender would step 320, so
`open_session` sets 160) and for Opus (48 kHz audio and clock, `opus/48000/2` in SDP whatever the channels,
RFC 7587; we encode and decode mono). The caller's decoded audio goes to the pipeline at the codec's PCM
rate (the service resamples it to 24 kHz once); the agent's audio is resampled to it.

Example:
    >>> [c.name for c in available(["opus", "g722", "pcmu"])]   # doctest: +SKIP
    ['opus', 'G722', 'PCMU']
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiortp.codecs import Codec, PcmaCodec, PcmuCodec
from aiosipua.sdp import Codec as SdpCodec
from aiosipua.sdp import MediaDescription

logger = logging.getLogger("duetaspan.sip")

OPUS_PAYLOAD = 111  # our own offers; an answer uses the offer's number


@dataclass(frozen=True)
class CodecSpec:
    """One codec: its SDP name, static payload type (None: dynamic), RTP clock, PCM rate and rtpmap."""

    key: str  # as in `[sip] codecs`
    name: str  # the SDP encoding name
    payload_type: int | None
    clock_rate: int
    pcm_rate: int
    channels: int | None = None  # in rtpmap

    @property
    def frame_samples(self) -> int:
        """PCM samples in one 20 ms frame."""
        return self.pcm_rate // 50

    @property
    def timestamp_step(self) -> int:
        """RTP timestamp units per 20 ms frame."""
        return self.clock_rate // 50

    def rtpmap(self, payload_type: int) -> str:
        return f"{payload_type} {self.name}/{self.clock_rate}" + (
            f"/{self.channels}" if self.channels else ""
        )

    def matches(self, codec: SdpCodec) -> bool:
        if codec.encoding_name:
            same = codec.encoding_name.lower() == self.name.lower()
            return same and (not codec.clock_rate or codec.clock_rate == self.clock_rate)
        return self.payload_type is not None and codec.payload_type == self.payload_type

    def make(self) -> Codec:
        if self.key == "pcmu":
            return PcmuCodec()
        if self.key == "pcma":
            return PcmaCodec()
        if self.key == "g722":
            from aiortp.codecs.g722 import G722Codec

            return G722Codec()
        from aiortp.codecs.opus import OpusCodec

        return OpusCodec(sample_rate=48000, channels=1, frame_ms=20)


PCMU = CodecSpec("pcmu", "PCMU", 0, 8000, 8000)
PCMA = CodecSpec("pcma", "PCMA", 8, 8000, 8000)
G722 = CodecSpec("g722", "G722", 9, 8000, 16000)
OPUS = CodecSpec("opus", "opus", None, 48000, 48000, channels=2)
CODECS: dict[str, CodecSpec] = {c.key: c for c in (OPUS, G722, PCMU, PCMA)}
DEFAULT_CODECS = ("opus", "g722", "pcmu", "pcma")


@functools.cache
def importable(key: str) -> bool:
    """Whether the codec's optional package imports (G.711 always does)."""
    try:
        CODECS[key].make()
    except Exception as exc:  # ImportError, or opuslib's plain Exception without libopus
        logger.info("SIP codec %s not available (%s): pip install duetaspan[sip-codecs]", key, exc)
        return False
    return True


def available(keys: Sequence[str] = DEFAULT_CODECS) -> list[CodecSpec]:
    """The allowed codecs whose packages import, in `keys` order."""
    out = [CODECS[k.lower()] for k in keys if k.lower() in CODECS and importable(k.lower())]
    return out


def choose(offer_audio: MediaDescription, allowed: Sequence[CodecSpec]) -> tuple[SdpCodec, CodecSpec] | None:
    """The first codec of the offer (the caller's preference) that we allow, or None."""
    for codec in offer_audio.codecs:
        for spec in allowed:
            if spec.matches(codec):
                return codec, spec
    return None


def fix_answer_media(answer_media: MediaDescription, chosen: SdpCodec, spec: CodecSpec) -> None:
    """aiosipua's answer writes `NAME/RATE` for the chosen codec: put the full rtpmap (Opus needs its `/2`)
    and the offer's fmtp for it."""
    rtpmaps = answer_media.attributes.get("rtpmap", [])
    pt = chosen.payload_type
    answer_media.attributes["rtpmap"] = [spec.rtpmap(pt)] + [r for r in rtpmaps if not r.startswith(f"{pt} ")]
    if spec is OPUS:
        fmtp = [f for f in answer_media.attributes.get("fmtp", []) if not f.startswith(f"{pt} ")]
        answer_media.attributes["fmtp"] = [f"{pt} useinbandfec=1;stereo=0;sprop-stereo=0", *fmtp]


def offer_media(allowed: Sequence[CodecSpec], port: int, dtmf_payload_type: int) -> MediaDescription:
    """Our audio m-line when dialling: the allowed codecs in order, then telephone-event."""
    formats: list[str] = []
    rtpmap: list[str] = []
    fmtp: list[str] = []
    for spec in allowed:
        pt = spec.payload_type if spec.payload_type is not None else OPUS_PAYLOAD
        formats.append(str(pt))
        rtpmap.append(spec.rtpmap(pt))
        if spec is OPUS:
            fmtp.append(f"{pt} useinbandfec=1;stereo=0;sprop-stereo=0")
    formats.append(str(dtmf_payload_type))
    rtpmap.append(f"{dtmf_payload_type} telephone-event/8000")
    fmtp.append(f"{dtmf_payload_type} 0-16")
    attributes: dict[str, list[str]] = {"rtpmap": rtpmap, "fmtp": fmtp, "ptime": ["20"], "sendrecv": []}
    return MediaDescription(media="audio", port=port, proto="RTP/AVP", formats=formats, attributes=attributes)


def spec_for(
    answer_audio: MediaDescription | None, allowed: Sequence[CodecSpec]
) -> tuple[int, CodecSpec] | None:
    """The codec the callee chose in its answer to our offer: (payload type, spec), or None."""
    for codec in answer_audio.codecs if answer_audio is not None else []:
        for spec in allowed:
            if spec.matches(codec):
                return codec.payload_type, spec
    return None


def tune_session(session: Any, spec: CodecSpec) -> None:
    """After `RTPSession.create`: step RTP timestamps by the codec's clock (G.722: 160 per 20 ms, not 320)."""
    sender = getattr(session, "_sender", None)
    if sender is not None:
        sender.timestamp_increment = spec.timestamp_step


__all__ = [
    "CODECS",
    "DEFAULT_CODECS",
    "G722",
    "OPUS",
    "PCMA",
    "PCMU",
    "CodecSpec",
    "available",
    "choose",
    "fix_answer_media",
    "importable",
    "offer_media",
    "spec_for",
    "tune_session",
]
