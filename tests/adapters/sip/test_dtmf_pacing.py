"""RFC 4733 digits as a phone sends them (`CallMedia.send_dtmf_paced`): the first packet of each event carries
the marker bit, progress packets leave 20 ms apart in real time (aiortp's own sender sends an event in one
burst, which IVRs miss), all share the event's RTP timestamp, and the end packet goes three times with the
full duration. The packets are parsed with aiortp's own RFC 4733 parser."""

from __future__ import annotations

import asyncio
import itertools
import struct
import time
from types import SimpleNamespace

import pytest
from aiortp.dtmf import DtmfEvent

from duetaspan.adapters.sip.media import DTMF_MIN_GAP_S, CallMedia
from duetaspan.adapters.sip.negotiate import DTMF_PAYLOAD


class Wire:
    """Stands in for aiortp's RtpSender at the seam: keeps what would go on the wire, and when."""

    current_timestamp = 123_456

    def __init__(self) -> None:
        self.sent: list[tuple[float, int, int, bytes, int]] = []

    def send_raw(self, payload_type: int, payload: bytes, timestamp: int, marker: int = 0, addr=None) -> None:
        self.sent.append((asyncio.get_running_loop().time(), payload_type, marker, payload, timestamp))


@pytest.mark.serial  # measures the 20 ms gaps between packets: CPU quiet
async def test_events_are_paced_with_the_marker_bit_first():
    wire = Wire()
    media = SimpleNamespace(session=SimpleNamespace(_sender=wire, _remote_addr=("127.0.0.1", 9)), _closed=False)
    await CallMedia.send_dtmf_paced(media, "5", 160)  # type: ignore[arg-type]
    events = [(t, pt, m, DtmfEvent.parse(p), ts) for t, pt, m, p, ts in wire.sent]
    assert all(pt == DTMF_PAYLOAD and ts == 123_456 and e.digit == "5" for _, pt, _, e, ts in events)
    progress = [e for e in events if not e[3].end]
    ends = [e for e in events if e[3].end]
    assert [m for _, _, m, _, _ in events] == [1] + [0] * (len(events) - 1)  # marker on the first packet only
    assert [e[3].duration for e in progress] == [160 * k for k in range(1, 8)]  # 20 ms steps at 8 kHz
    assert len(ends) == 3 and all(e[3].duration == 1280 for e in ends)
    # Real time, never one burst: packet k leaves no earlier than 20 ms * k after the first. The sender keeps
    # to that grid (a late wake-up is made up on the next packet, so one gap may be short; CI saw 23.7 ms then
    # 13.9 ms), so the offsets are checked, not each gap.
    offsets = [t - progress[0][0] for t, *_ in progress]
    assert all(off >= 0.02 * k - 0.002 for k, off in enumerate(offsets)), offsets
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert min(gaps) >= 0.005, gaps
    assert struct.unpack("!B", wire.sent[-1][3][1:2])[0] & 0x80  # the E bit


async def test_a_closed_stream_sends_nothing():
    wire = Wire()
    media = SimpleNamespace(session=SimpleNamespace(_sender=wire, _remote_addr=None), _closed=True)
    await CallMedia.send_dtmf_paced(media, "1")  # type: ignore[arg-type]
    assert wire.sent == []


class StallingWire(Wire):
    """A wire whose second send stalls the event loop for 45 ms, as a busy machine's late wake-up would."""

    def send_raw(self, payload_type: int, payload: bytes, timestamp: int, marker: int = 0, addr=None) -> None:
        super().send_raw(payload_type, payload, timestamp, marker, addr)
        if len(self.sent) == 2:
            time.sleep(0.045)


async def test_a_late_wake_up_is_made_up_without_sending_two_packets_at_once():
    """After a stall the sender is behind its 20 ms grid: it catches up with packets at least
    `DTMF_MIN_GAP_S` apart, never two in one burst (before, the packet after the stall left at once)."""
    wire = StallingWire()
    media = SimpleNamespace(session=SimpleNamespace(_sender=wire, _remote_addr=("127.0.0.1", 9)), _closed=False)
    await CallMedia.send_dtmf_paced(media, "5", 160)  # type: ignore[arg-type]
    progress = [t for t, _, _, p, _ in wire.sent if not DtmfEvent.parse(p).end]
    gaps = [b - a for a, b in itertools.pairwise(progress)]
    assert len(progress) == 7 and max(gaps) >= 0.045, gaps  # the stall happened
    assert min(gaps) >= DTMF_MIN_GAP_S - 0.001, gaps
