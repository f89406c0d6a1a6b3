"""What a SIP call leaves on disk and in `/metrics` beside what every call does: its direction and dial
outcome, its RTP/RTCP quality, and a record of its own for a placed call that was never answered.

Every SIP call's record (`<call id>.json`, the same folder and format as other calls) says in `meta`:
`transport: "sip"`, `direction` (`inbound` or `outbound`), `outcome` (`answered`, `busy`, `no-answer`,
`failed`) and `sip_status` (the final SIP answer: 200, 486, ...; None when none came); a placed call also
has `meta.dial` (`to`, `from`, `reason`, `ring_s`, `outbound_proxy`). A placed call that was not answered has
no audio: its record has no frames and `summary.ended_by` is its outcome.

`meta.bye` says how the call's dialog ended (`bye_meta`): `{"by": "caller"}` (their BYE, answered 200), or
our BYE's outcome `{"by": "us", "outcome": "200" | "481" | ... | "no response", "after_s": ..., "detail":
"no answer in 32 s"}`. The record closes when the call ends (the agent's slot is free at once), often before
our BYE is answered: it then says `"outcome": "pending"`, and the outcome, when it lands (at most 64*T1 later),
is appended to the `.jsonl` and written into the `.json` (`amend_meta`).

An answered call's record has `rtp` (`rtp_figures`): what aiortp counted on the stream we received, summed
over the peer's sources (`packets_received`, `packets_lost`, `loss_fraction` = lost / expected, `sources`),
RFC 3550 interarrival `jitter_ms` (of the source that sent the most),
what we sent (`packets_sent`), concealment (`concealed_frames`), frames that came too late to be played
(`late`, dropped by aiortp's playout), packets refused before it (`dropped`, by reason), the peer's view of our stream from its RTCP
receiver reports (`remote`: `packets_lost`, `loss_fraction`, `jitter_ms`), and the round-trip time from those
reports (`rtt_ms`, RFC 3550 6.4.1: arrival - LSR - DLSR) when the peer sent any that answer our sender
reports (SIPp's RTP streaming sends no RTCP; softphones such as baresip do).

Example:
    >>> dial_meta_fields("answered", 200)
    {'transport': 'sip', 'outcome': 'answered', 'sip_status': 200}
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

from aiortp.clock import current_ntp_time
from aiosipua.headers import parse_uri

from duetaspan.adapters.sip.call import PENDING
from duetaspan.adapters.sip.media import RTP_RATE
from duetaspan.pipeline.artifacts import CallRecorder, load_call_record, update_record

logger = logging.getLogger("duetaspan.sip")

RTT_CEILING_S = 30.0  # an RTT past this is a clock or report error, not a network


class RtpQuality:
    """One call's RTP figures across every source the peer sent from, and the round-trip times from its RTCP
    receiver reports. aiortp keeps receive statistics per SSRC and starts them afresh when the SSRC changes
    (SIPp's DTMF pcap, a PBX re-anchoring media); each finished source's figures are kept here first."""

    def __init__(self, media: Any) -> None:
        self.media = media
        self.rtt_ms: list[float] = []
        self.sources: list[dict[str, int]] = []  # finished sources: received, lost, jitter (RTP units)
        session = getattr(media, "session", None)
        if session is None:
            return
        previous = session.on_receiver_report
        changed = session._remote_ssrc_changed  # aiortp's own; wrapped on this session only

        def heard(report: Any) -> None:
            self.receiver_report(report)
            if previous is not None:
                previous(report)

        def new_source(ssrc: int) -> None:
            stats = session._stream_stats
            if stats is not None and stats.packets_received:
                self.sources.append(_source(stats.packets_received, stats.packets_lost, stats.jitter))
            changed(ssrc)

        session.on_receiver_report = heard
        session._remote_ssrc_changed = new_source

    def receiver_report(self, report: Any) -> None:
        """One report block about our stream: RTT = now - LSR - DLSR (units of 1/65536 s), once it names an SR."""
        if not report.lsr:
            return
        now = (current_ntp_time() >> 16) & 0xFFFFFFFF
        rtt_s = ((now - report.lsr - report.dlsr) & 0xFFFFFFFF) / 65536.0
        if rtt_s < RTT_CEILING_S:
            self.rtt_ms.append(round(rtt_s * 1000.0, 3))

    def figures(self) -> dict[str, Any]:
        return rtp_figures(self.media, self.rtt_ms, self.sources)


def _source(received: int, lost: int, jitter: int) -> dict[str, int]:
    return {"received": int(received), "lost": max(0, int(lost)), "jitter": int(jitter)}


def rtp_figures(
    media: Any, rtt_ms: list[float] | None = None, sources: list[dict[str, int]] | None = None
) -> dict[str, Any]:
    """The call's RTP/RTCP figures for its record and `/metrics` (see the module docstring): packet counts
    summed over the sources, the jitter of the source that sent the most."""
    raw = media.stats()
    rate = int(getattr(getattr(media, "session", None), "_clock_rate", 0) or RTP_RATE)
    every = list(sources or [])
    if "packets_received" in raw:
        every.append(_source(raw["packets_received"], raw.get("packets_lost", 0), raw.get("jitter", 0)))
    received = sum(src["received"] for src in every)
    lost = sum(src["lost"] for src in every)
    expected = received + lost
    main = max(every, key=lambda src: src["received"], default=None)
    out: dict[str, Any] = {
        "codec": raw.get("codec"),
        "packets_sent": int(raw.get("packets_sent", 0)),
        "packets_received": received,
        "packets_lost": lost,
        "loss_fraction": round(lost / expected, 4) if expected else 0.0,
        "jitter_ms": round(main["jitter"] * 1000.0 / rate, 3) if main else 0.0,
        "sources": len(every),
        "concealed_frames": int(raw.get("concealed_frames", 0)),
        "late": int(raw.get("late_dropped", 0)),  # frames that came after their playout time (dropped)
        "frames_in": raw.get("frames_in", 0),
        "frames_out": raw.get("frames_out", 0),
        "dropped_in": raw.get("dropped_in", 0),
        # RTP refused before the jitter buffer: latching (`latch.py`) and SRTP authentication
        "dropped": {reason: int(raw.get(f"rtp_dropped_{reason}", 0)) for reason in ("foreign", "ssrc", "early", "malformed")}
        | {"srtp_auth": int(raw.get("srtp_auth_failures", 0))},
    }
    if "remote_fraction_lost" in raw:
        out["remote"] = {
            "packets_lost": max(0, int(raw.get("remote_packets_lost", 0))),
            "loss_fraction": round(int(raw["remote_fraction_lost"]) / 256.0, 4),
            "jitter_ms": round(float(raw.get("remote_jitter", 0)) * 1000.0 / rate, 3),
        }
    if rtt_ms:
        out["rtt_ms"] = rtt_ms[-1]
        out["rtt_ms_mean"] = round(sum(rtt_ms) / len(rtt_ms), 3)
        out["rtt_samples"] = len(rtt_ms)
    return out


def dial_meta_fields(outcome: str, status: int | None) -> dict[str, Any]:
    return {"transport": "sip", "outcome": outcome, "sip_status": status}


def call_meta(call: Any) -> dict[str, Any]:
    """The `meta` fields of an answered SIP call: direction, outcome and SIP status (and how it was placed)."""
    dial = getattr(call, "dial", None)
    if dial is None:
        return {"direction": "inbound", **dial_meta_fields("answered", 200)}
    return {"direction": "outbound", **dial_meta_fields(dial.outcome, dial.status), "dial": dial.summary()}


def bye_meta(call: Any) -> dict[str, Any] | None:
    """The record's `meta.bye` (see the module docstring); None when no BYE ended the dialog (yet)."""
    outcome = call.signalling.get("BYE")
    if outcome is None:
        return {"by": "caller"} if call.end_reason == "caller hung up (BYE)" else None
    out: dict[str, Any] = {"by": "us", "outcome": outcome}
    if outcome != PENDING and call.bye_after_s is not None:
        out["after_s"] = call.bye_after_s
    if call.details.get("BYE"):
        out["detail"] = call.details["BYE"]
    return out


def amend_meta(recorder: Any, **fields: Any) -> None:
    """Merge `fields` into the `meta` of a call whose record already closed: one more `meta` line in its
    `.jsonl` (a rebuild from it agrees) and its `.json` rewritten atomically."""
    line = json.dumps({"type": "meta", **fields}, ensure_ascii=False) + "\n"
    fd = os.open(recorder.jsonl_path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    meta = load_call_record(recorder.dir, recorder.call_id).get("meta") or {}
    update_record(recorder.dir, recorder.call_id, meta={**meta, **fields})


def write_dial_record(record_dir: str | Path, result: Any) -> dict[str, Any]:
    """The record of a placed call that was never answered (busy, no-answer, failed): no audio, no frames."""
    call_id = result.call_id or f"dial-{uuid.uuid4().hex}"  # refused before an INVITE went out
    try:
        target = parse_uri(result.uri)
        called = target.user or target.host
    except Exception:
        called = result.uri
    meta = {"caller": result.caller, "called": called, "direction": "outbound",
            **dial_meta_fields(result.outcome, result.status), "dial": result.summary()}  # fmt: skip
    recorder = CallRecorder(record_dir, call_id, meta=meta, audio=False)
    return recorder.close(ended_by=result.outcome)


__all__ = ["RtpQuality", "amend_meta", "bye_meta", "call_meta", "rtp_figures", "write_dial_record"]
