"""SIPp and baresip driven from tests: where they are, how to run them on loopback, and the scenarios.

SIPp (Debian `sip-tester`) and baresip (`baresip-core`) are installed by scripts/test.sh where apt works;
without them their tests skip, naming the package. The SIP end-to-end tests run on Python 3.11 only (CI runs
the suite on 3.11 and 3.13; SIP media does not differ between them).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import peer_rtp_ports, worker_sip_settings

SIPP = shutil.which("sipp")
BARESIP = shutil.which("baresip")
SIPP_SHARE = Path("/usr/share/sip-tester")  # the pcaps Debian's sip-tester ships (RFC 2833 digits, G.711a)
SCENARIOS = Path(__file__).parent / "scenarios"

needs_sipp = pytest.mark.skipif(
    SIPP is None, reason="SIPp not installed: apt-get install sip-tester (scripts/test.sh installs it)"
)
needs_baresip = pytest.mark.skipif(
    BARESIP is None,
    reason="baresip not installed: apt-get install baresip-core (scripts/test.sh installs it)",
)
sip_e2e = pytest.mark.skipif(
    sys.version_info[:2] != (3, 11), reason="SIP end-to-end tests run on Python 3.11 only (one Python in CI)"
)


def udp_socket() -> socket.socket:
    """A non-blocking UDP socket on a free loopback port (a peer, a forger, a reflection target)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    return sock


def drain(sock: socket.socket) -> int:
    """How many datagrams wait on `sock` (read and dropped)."""
    n = 0
    while True:
        try:
            sock.recv(4096)
        except BlockingIOError:
            return n
        n += 1


def free_udp_port() -> int:
    """A loopback port free for UDP, and for TCP both on it and on the next one: a SIP peer given it may
    listen on every transport. baresip's `sip_listen` takes UDP and TCP on the port and TLS on the next, and
    exits at once when one is taken ("ua: SIP Transport failed: Address already in use", "ua: init failed"),
    never dialing. The OS's free UDP port is often some TCP connection's local port: the suite's HTTP clients
    draw theirs from the same ephemeral range, and each holds it in TIME_WAIT for a minute after it closed."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port < 65535 and _tcp_free(port) and _tcp_free(port + 1):
            return port
    raise AssertionError("no loopback port free for UDP and TCP (and TCP on the next) in 100 tries")


def _tcp_free(port: int) -> bool:
    """Whether TCP `port` on loopback can be bound (no SO_REUSEADDR: a TIME_WAIT connection's port is taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_tcp_port() -> int:
    """A port the OS found free for TCP (a free UDP port may be some TCP connection's local port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def udp_bound(port: int, timeout_s: float = 30.0) -> None:
    """Wait until some process (SIPp as a UAS) holds UDP `port` on loopback."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return
        await asyncio.sleep(0.05)
    raise AssertionError(f"nothing bound UDP port {port} in {timeout_s} s")


@dataclass
class SippResult:
    rc: int
    screen: str
    errors: str
    output: str

    def count(self, label: str) -> int:
        """The cumulative figure of a statistics row (`Successful call`, `Failed call`, ...)."""
        rows = re.findall(rf"{re.escape(label)}\s*\|[^|]*\|\s*(\d+)", self.screen)
        return int(rows[-1]) if rows else -1

    def received(self, method: str) -> int:
        """How many `method` requests a scenario step took (the first figure of its row on the scenario
        screen: retransmissions, unexpected and `-lost` messages are counted apart)."""
        rows = re.findall(rf"^\s*-+>\s+{re.escape(method)}\s+(\d+)", self.screen, flags=re.MULTILINE)
        return int(rows[-1]) if rows else -1


async def run_sipp(
    target: str,
    tmp: Path,
    *args: str,
    timeout_s: float = 120.0,
    name: str = "sipp",
    port: int = 0,
    local_ip: str = "127.0.0.1",
) -> SippResult:
    """Run SIPp against `target` (`127.0.0.1:PORT`; empty for a UAS scenario listening on `port`) until it
    exits; its final statistics come back."""
    assert SIPP is not None
    screen, errors = tmp / f"{name}-screen.txt", tmp / f"{name}-errors.txt"
    proc = await asyncio.create_subprocess_exec(
        SIPP, *([target] if target else []), "-i", local_ip, "-p", str(port or free_udp_port()), "-mi", local_ip,
        "-mp", str(peer_rtp_ports()[0]), "-nostdin", "-trace_screen", "-screen_file", str(screen),
        "-trace_err", "-error_file", str(errors), "-timeout", f"{int(timeout_s)}s", *args,
        cwd=tmp, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s + 30)
    except TimeoutError:
        proc.kill()
        out, _ = await proc.communicate()
    finally:  # cancelled (the test failed elsewhere): never leave SIPp running
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    read = lambda p: p.read_text(errors="replace") if p.is_file() else ""  # noqa: E731
    return SippResult(proc.returncode or 0, read(screen), read(errors), out.decode(errors="replace"))


def caller_stream(tmp: Path, audio: bytes, pt: int, digit: str = "1", gap_ms: int = 500) -> tuple[Path, int]:
    """A pcap of one caller's RTP as a phone sends it, for SIPp's `play_pcap_audio`: `audio` (G.711, payload
    type `pt`) in 20 ms packets, `gap_ms` of silence, the RFC 4733 event of `digit` (marker on its first
    packet, its end sent three times), then a second of silence: one SSRC, one sequence, as RFC 4733 has it.
    (SIPp's own `rtp_stream` plus a digit pcap are two SSRCs from two threads: under load the stream ran late
    into the digit, and the latch rightly drops a second live SSRC.) Returns the file and its length in ms."""
    silence = b"\xff" if pt == 0 else b"\xd5"
    audio += silence * (-len(audio) % 160)
    chunks = [audio[i : i + 160] for i in range(0, len(audio), 160)] + [silence * 160] * (gap_ms // 20)
    event = "0123456789*#".index(digit)
    packets: list[tuple[int, int, bytes, bool]] = [
        (pt, i * 160, chunk, i == 0) for i, chunk in enumerate(chunks)
    ]
    ts = len(chunks) * 160
    for k in range(1, 9):  # 8 x 20 ms of the event, growing duration; the end (E bit) three times
        end = k == 8
        payload = bytes([event, (0x80 if end else 0) | 10]) + (160 * k).to_bytes(2, "big")
        packets += [(101, ts, payload, k == 1)] * (3 if end else 1)
    ts += 8 * 160
    packets += [(pt, ts + i * 160, silence * 160, i == 0) for i in range(50)]
    out = bytearray((0xA1B2C3D4).to_bytes(4, "little") + bytes([2, 0, 4, 0]) + bytes(8))
    out += (65535).to_bytes(4, "little") + (1).to_bytes(4, "little")  # snaplen; Ethernet
    t_us = 0
    for seq, (ptype, stamp, payload, marker) in enumerate(packets):
        rtp = bytes([0x80, (0x80 if marker else 0) | ptype]) + (1000 + seq).to_bytes(2, "big")
        rtp += stamp.to_bytes(4, "big") + (0x5EED1234).to_bytes(4, "big") + payload
        udp = (6000).to_bytes(2, "big") * 2 + (8 + len(rtp)).to_bytes(2, "big") + bytes(2) + rtp
        ip = bytearray([0x45, 0]) + (20 + len(udp)).to_bytes(2, "big") + bytes([0, 0, 0, 0, 64, 17, 0, 0])
        ip += bytes([127, 0, 0, 1]) * 2
        total = sum(int.from_bytes(ip[i : i + 2], "big") for i in range(0, 20, 2))
        total = (total & 0xFFFF) + (total >> 16)
        ip[10:12] = (~total & 0xFFFF).to_bytes(2, "big")
        frame = bytes(12) + b"\x08\x00" + bytes(ip) + udp
        out += (t_us // 1_000_000).to_bytes(4, "little") + (t_us % 1_000_000).to_bytes(4, "little")
        out += len(frame).to_bytes(4, "little") * 2 + frame
        if not (ptype == 101 and payload[1] & 0x80 and packets[seq + 1][0] == 101):
            t_us += 20_000  # the end's repeats go out together
    path = tmp / "caller.pcap"
    path.write_bytes(bytes(out))
    return path, t_us // 1000


def scenario(name: str, tmp: Path, **values: Any) -> Path:
    """A scenario from `scenarios/`, with `{{KEY}}` placeholders filled in, written under `tmp`."""
    text = (SCENARIOS / f"{name}.xml").read_text()
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", str(value))
    path = tmp / f"{name}.xml"
    path.write_text(text)
    return path


@contextlib.asynccontextmanager
async def endpoint_on_loopback(handler: Any, **settings: Any) -> AsyncIterator[Any]:
    """A started `SipEndpoint` on 127.0.0.1 (a free port unless given) running `handler` on each call."""
    from duetaspan.adapters.sip.endpoint import SipEndpoint, SipSettings

    max_calls = settings.pop("max_calls", 4)
    # a TCP/TLS endpoint listens on TCP only: its port must be free for TCP (a free UDP port was found taken by
    # another worker's connection: EADDRINUSE)
    tcp = settings.get("transport") in ("tcp", "tls")
    settings.setdefault("port", free_tcp_port() if tcp else free_udp_port())
    for key, value in worker_sip_settings().items():  # this xdist worker's own RTP ports
        settings.setdefault(key, value)
    endpoint = SipEndpoint(SipSettings(host="127.0.0.1", **settings), handler, max_calls=max_calls)
    await endpoint.start()
    try:
        yield endpoint
    finally:
        await endpoint.aclose()


async def wait_for(predicate: Any, timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)
