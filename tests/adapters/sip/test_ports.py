"""RTP port pairs (`duetaspan.adapters.sip.ports.RtpPorts`) against another process using the same range: a pair
is held from allocation to the media's bind, and a pair taken in the moment between them is skipped."""

from __future__ import annotations

import errno
import socket

import pytest

from duetaspan.adapters.sip.ports import RtpPorts
from tests.support import worker_rtp_range


def _bind(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", port))
    return sock


def _free_pair_base() -> int:
    low, high = worker_rtp_range()
    for port in range(low, high - 8, 10):
        socks = []
        try:
            socks = [_bind(p) for p in range(port, port + 8)]
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        return port
    pytest.fail(f"no 8 free ports in this worker's RTP range {low}-{high}")


async def test_a_pair_is_held_until_its_media_binds_so_another_allocator_skips_it() -> None:
    base = _free_pair_base()
    ours, theirs = RtpPorts((base, base + 7)), RtpPorts((base, base + 7))  # theirs: as another process would
    port, rtcp = await ours.allocate()
    assert base <= port <= base + 6 and port % 2 == 0 and rtcp == port + 1  # drawn at random in the range
    with pytest.raises(OSError):  # held on every interface: nothing else binds it, loopback included
        _bind(port)
    other, _ = await theirs.allocate()
    assert other != port, "a second allocator on the same range got the pair the first one holds"
    ours.hand_over(port)
    _bind(port).close()  # handed over: the media may bind it now
    await ours.release(port)
    await theirs.release(other)


async def test_a_pair_taken_between_hand_over_and_bind_is_skipped_and_other_errors_release() -> None:
    base = _free_pair_base()
    ports = RtpPorts((base, base + 7))
    intruder: list[socket.socket] = []
    bound: list[int] = []

    async def open_media(port: int) -> socket.socket:
        if not intruder:  # another process binds the port in the moment after the hand-over
            intruder.append(_bind(port))
        sock = _bind(port)  # EADDRINUSE on the first try
        bound.append(port)
        return sock

    port, media = await ports.bind(open_media)
    assert port != intruder[0].getsockname()[1] and bound == [port]
    media.close()
    intruder[0].close()
    await ports.release(port)

    async def fails(port: int) -> None:
        raise OSError(errno.EACCES, "denied")

    with pytest.raises(OSError):
        await ports.bind(fails)
    assert not ports._allocated and not ports._held  # a failure that is not EADDRINUSE gives the pair back


async def test_every_pair_in_use_is_a_clear_error() -> None:
    base = _free_pair_base()
    held = [_bind(base), _bind(base + 2)]
    try:
        with pytest.raises(RuntimeError, match=f"no free RTP port pair in {base}-{base + 3}"):
            await RtpPorts((base, base + 3)).allocate()
    finally:
        for sock in held:
            sock.close()
