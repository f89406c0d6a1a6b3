"""A callee's media as a raw UDP socket: it streams a recording as paced 20 ms PCMU RTP (then the line's
silence, as a phone keeps sending) to the agent's RTP port, and records every packet the agent sends with its
arrival time on the callee's clock (0: its first packet), PCMU audio and RFC 4733 events apart.

SIPp does the call's signalling (`scenarios/callee_greets.xml`, its SDP naming this socket). It cannot be the
media too: SIPp 3.6 streams `rtp_stream` from its `-mp` socket, our RTP latches there (RFC 7362, `latch.py`),
and SIPp records nothing it receives; a socket that plays and listens from one port sees exactly what reached
the callee.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from dataclasses import dataclass, field

import numpy as np

from duetaspan.adapters.twilio.audio import int16_to_ulaw, ulaw_to_int16
from tests.adapters.sip.peer import udp_socket

FRAME = 160  # 20 ms of 8 kHz PCMU
SILENCE = 0xFF  # mu-law of 0


def to_ulaw(pcm: np.ndarray) -> bytes:
    """float32 8 kHz audio as mu-law bytes (the line's coding)."""
    return int16_to_ulaw((np.clip(pcm, -1.0, 1.0) * 32767).astype(np.int16))


@dataclass
class RtpPeer:
    sock: socket.socket = field(default_factory=udp_socket)
    audio: list[tuple[float, bytes]] = field(default_factory=list)  # (arrival s, PCMU payload)
    events: list[tuple[float, int, bool, bool]] = field(default_factory=list)  # (s, digit, marker, end)
    t0: float | None = None
    _task: asyncio.Task | None = None

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def start(self, dest: tuple[str, int], ulaw: bytes) -> None:
        """Play `ulaw` to `dest` from now on (the call was answered), then silence until `aclose()`."""
        self._task = asyncio.create_task(self._run(dest, ulaw))

    async def _run(self, dest: tuple[str, int], ulaw: bytes) -> None:
        loop = asyncio.get_running_loop()
        self.t0 = loop.time()
        ssrc, seq0, ts0 = random.getrandbits(32), random.getrandbits(16), random.getrandbits(32)
        reader = asyncio.ensure_future(self._listen())
        try:
            n = 0
            while True:
                chunk = ulaw[n * FRAME:(n + 1) * FRAME].ljust(FRAME, bytes([SILENCE]))
                header = struct.pack("!BBHII", 0x80, (0x80 if n == 0 else 0), (seq0 + n) & 0xFFFF,
                                     (ts0 + n * FRAME) & 0xFFFFFFFF, ssrc)  # fmt: skip
                with contextlib.suppress(BlockingIOError):
                    self.sock.sendto(header + chunk, dest)
                n += 1
                await asyncio.sleep(max(0.0, self.t0 + n * 0.02 - loop.time()))  # on the clock, not cumulative
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _listen(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            data = await loop.sock_recv(self.sock, 2048)
            at = loop.time() - (self.t0 or loop.time())
            if len(data) < 12 or data[0] >> 6 != 2:
                continue
            pt, marker = data[1] & 0x7F, bool(data[1] & 0x80)
            offset = 12 + 4 * (data[0] & 0x0F)
            if pt == 0:
                self.audio.append((at, data[offset:]))
            elif len(data) >= offset + 4:
                self.events.append((at, data[offset], marker, bool(data[offset + 1] & 0x80)))

    def first_sound_s(self, level: float = 0.01) -> float | None:
        """When the first of the agent's packets that is not silence (RMS above `level`) arrived."""
        for at, payload in self.audio:
            pcm = ulaw_to_int16(payload).astype(np.float32) / 32768
            if np.sqrt(np.mean(pcm**2)) > level:
                return at
        return None

    def heard(self, since_s: float = 0.0) -> np.ndarray:
        """The agent's audio that arrived from `since_s` on, as float32 8 kHz (in arrival order)."""
        kept = b"".join(p for at, p in self.audio if at >= since_s)
        return ulaw_to_int16(kept).astype(np.float32) / 32768

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.sock.close()
