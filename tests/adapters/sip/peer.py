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
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
