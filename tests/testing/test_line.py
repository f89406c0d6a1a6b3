"""`PacedLine`, the scripted caller's 20 ms clock: what `play` queues goes out in order, keys go out between
the audio they were pressed in, silence fills every tick in between (a phone line never goes quiet), and after
`stop` nothing is sent and nobody waits for audio the closed line will not carry."""

from __future__ import annotations

import asyncio

from duetaspan.testing.line import PacedLine
from tests.support import wait_until

SILENCE = b"\x00"


async def test_the_line_carries_silence_between_what_is_played_and_keys_in_order():
    sent: list[bytes] = []

    async def send(chunk: bytes) -> bool:
        sent.append(chunk)
        return True

    line = PacedLine(send, SILENCE)
    line.start()
    await wait_until(lambda: len(sent) >= 3, what="silence before anything is played")
    assert set(sent) == {SILENCE}  # the line is live from the answer

    async def key() -> None:
        sent.append(b"#")

    await line.play([b"a", b"b"])
    await line.then(key)
    await line.play([b"c"])
    before = len(sent)
    await wait_until(lambda: len(sent) >= before + 3, what="silence after the last chunk")
    await line.stop()
    spoken = [c for c in sent if c != SILENCE]
    assert spoken == [b"a", b"b", b"#", b"c"]
    assert sent[sent.index(b"c") + 1 :] and set(sent[sent.index(b"c") + 1 :]) == {SILENCE}
    stopped = len(sent)
    await line.play([b"late"])  # returns at once: a hung-up line carries nothing
    await asyncio.sleep(0.1)
    assert len(sent) == stopped and line.done


async def test_a_line_closed_by_the_far_end_releases_whoever_waits_to_play():
    sent: list[bytes] = []

    async def send(chunk: bytes) -> bool:
        if len(sent) >= 2:
            return False  # the server closed the stream (a transfer, its hang-up)
        sent.append(chunk)
        return True

    line = PacedLine(send, SILENCE)
    await asyncio.wait_for(line.play([b"a", b"b", b"c", b"d"]), 30)
    assert sent == [b"a", b"b"] and line.done
    await asyncio.wait_for(line.play([b"e"]), 30)  # closed: nothing waits
    await line.stop()
