"""SDP offer/answer for one call's media: the codec (`duetaspan.adapters.sip.codecs`) and SRTP
(`duetaspan.adapters.sip.srtp`) on top of aiosipua's RFC 3264 negotiation, which builds the answer (mirrored
m-lines, direction, ptime, telephone-event) for the one payload type chosen here.

Example:
    >>> # media = answer_offer(offer, MediaOptions(), local_ip="127.0.0.1", port=20000)
    >>> # media.spec.name, media.payload_type, media.srtp      # ('G722', 9, SrtpContext(...)) or (..., None)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from aiosipua.sdp import SdpMessage, SdpNegotiationError, build_sdp, negotiate_sdp, serialize_sdp

from duetaspan.adapters.sip.codecs import (
    DEFAULT_CODECS,
    CodecSpec,
    available,
    choose,
    fix_answer_media,
    spec_for,
)
from duetaspan.adapters.sip.codecs import offer_media as codec_offer_media
from duetaspan.adapters.sip.srtp import (
    CryptoLine,
    SrtpContext,
    answer_srtp,
    answered_srtp,
    offer_lines,
    offer_profile,
)

DTMF_PAYLOAD = 101


@dataclass(frozen=True)
class MediaOptions:
    """What the endpoint will negotiate: the allowed codecs (in our order of preference) and the SRTP mode
    in force (`srtp.effective_mode`)."""

    codecs: Sequence[str] = DEFAULT_CODECS
    srtp: str = "off"

    @property
    def specs(self) -> list[CodecSpec]:
        return available(self.codecs)


@dataclass
class Negotiated:
    """The outcome: our SDP (the answer, or our offer for a placed call), the payload type and codec on the
    wire, and the SRTP context (None: plain RTP)."""

    sdp: SdpMessage
    payload_type: int
    spec: CodecSpec
    srtp: SrtpContext | None = field(default=None, repr=False)


def answer_offer(
    offer: SdpMessage,
    options: MediaOptions,
    *,
    local_ip: str,
    port: int,
    advertised_ip: str | None = None,
    keep: tuple[int, CodecSpec] | None = None,
    srtp: SrtpContext | None = None,
) -> Negotiated:
    """Our answer to `offer` (raises `SdpNegotiationError`, or its `SrtpRequired` / `SrtpRefused`, for 488).
    A re-INVITE passes the call's codec (`keep`) and SRTP context (`srtp`): the answer keeps them, and a
    re-offer without crypto on an SRTP call is refused rather than falling back to plain RTP."""
    audio = offer.audio
    if audio is None:
        raise SdpNegotiationError("Offer contains no audio media")
    specs = [keep[1]] if keep is not None else options.specs
    picked = choose(audio, specs)
    if picked is None:
        offered = [c.encoding_name or str(c.payload_type) for c in audio.codecs]
        raise SdpNegotiationError(f"no common codec: offered {offered}, we accept {[s.name for s in specs]}")
    chosen, spec = picked
    keys = answer_srtp(audio, "required" if srtp is not None else options.srtp)
    answer, pt = negotiate_sdp(
        offer,
        local_ip=local_ip,
        rtp_port=port,
        supported_codecs=[chosen.payload_type],
        dtmf_payload_type=DTMF_PAYLOAD,
        advertised_ip=advertised_ip,
    )
    answer_audio = answer.audio
    assert answer_audio is not None
    fix_answer_media(answer_audio, chosen, spec)
    context = srtp
    if keys is not None:
        local, remote = keys
        if context is None:
            context = SrtpContext(local, remote)
        else:  # a re-INVITE: our key stays, the peer's may be new (RFC 4568 section 7.1.4)
            context.update_remote(remote)
            local = CryptoLine(remote.tag, context.suite, context.local.key)
        answer_audio.attributes["crypto"] = [str(local)]
    return Negotiated(answer, pt, spec, context)


def same_origin(previous: SdpMessage, answer: SdpMessage) -> SdpMessage:
    """`answer` (to a re-INVITE) under `previous`'s `o=` line: the same session id always, and its version
    one higher only when the SDP changed (RFC 3264 section 8: a peer compares them to see if anything did)."""
    before = previous.origin
    answer.origin = dataclasses.replace(answer.origin, session_id=before.session_id,
                                        session_version=before.session_version)  # fmt: skip
    if serialize_sdp(answer) != serialize_sdp(previous):
        answer.origin = dataclasses.replace(answer.origin, session_version=str(int(before.session_version) + 1))
    return answer


def build_offer(
    options: MediaOptions, *, local_ip: str, port: int, advertised_ip: str | None = None
) -> tuple[SdpMessage, list[CryptoLine]]:
    """Our offer when dialling: the allowed codecs, telephone-event, and our `a=crypto` lines unless SRTP is
    off (`RTP/SAVP` when required)."""
    sdp = build_sdp(
        local_ip=local_ip, rtp_port=port, payload_type=0, codec_name="PCMU", advertised_ip=advertised_ip
    )
    media = codec_offer_media(options.specs, port, DTMF_PAYLOAD)
    lines = offer_lines(options.srtp)
    media.proto = offer_profile(options.srtp)
    if lines:
        media.attributes["crypto"] = [str(line) for line in lines]
    sdp.media = [media]
    return sdp, lines


def answered(
    offer: SdpMessage, ours: list[CryptoLine], answer: SdpMessage, options: MediaOptions
) -> Negotiated:
    """The media of a call we placed, from the callee's answer (raises `SdpNegotiationError`)."""
    found = spec_for(answer.audio, options.specs)
    if found is None:
        raise SdpNegotiationError("the callee's SDP answer has none of the codecs we offered")
    context = answered_srtp(ours, answer.audio, options.srtp)
    return Negotiated(offer, found[0], found[1], context)


__all__ = ["DTMF_PAYLOAD", "MediaOptions", "Negotiated", "answer_offer", "answered", "build_offer", "same_origin"]
