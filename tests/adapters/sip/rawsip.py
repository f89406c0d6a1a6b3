"""A bare UDP peer for the tests that play the network's worst (a caller whose answers never come, a registrar
that never answers, a replaying attacker): send a datagram, read datagrams, answer a request."""

from __future__ import annotations

import asyncio
from types import TracebackType

from tests.adapters.sip.peer import udp_socket


def header(message: bytes, name: str) -> str:
    """The first value of header `name` ('' when absent)."""
    for line in message.decode(errors="replace").split("\r\n\r\n", 1)[0].split("\r\n")[1:]:
        key, _, value = line.partition(":")
        if key.strip().lower() == name.lower():
            return value.strip()
    return ""


def reply(request: bytes, status: str, to_tag: str = "peer1", extra: str = "") -> bytes:
    """A response to `request`: its Via, From, To (with `to_tag` when it has none), Call-ID and CSeq."""
    lines = request.decode().split("\r\n\r\n", 1)[0].split("\r\n")[1:]
    keep = [ln for ln in lines if ln.split(":", 1)[0].strip().lower() in ("via", "from", "call-id", "cseq")]
    to = header(request, "to")
    to = to if "tag=" in to else f"{to};tag={to_tag}"
    return (f"SIP/2.0 {status}\r\n" + "\r\n".join(keep) + f"\r\nTo: {to}\r\n{extra}Content-Length: 0\r\n\r\n").encode()


class Peer:
    """A UDP socket on 127.0.0.1 (a free port)."""

    def __init__(self) -> None:
        self.sock = udp_socket()
        self.port = int(self.sock.getsockname()[1])

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.sock.close()

    async def send(self, data: bytes, port: int) -> None:
        await asyncio.get_running_loop().sock_sendto(self.sock, data, ("127.0.0.1", port))

    async def recv(self, timeout_s: float = 20.0) -> tuple[bytes, tuple[str, int]]:
        return await asyncio.wait_for(asyncio.get_running_loop().sock_recvfrom(self.sock, 65536), timeout_s)

    async def until(self, start: bytes, timeout_s: float = 20.0) -> list[bytes]:
        """Every datagram up to (and with) the first that starts with `start`."""
        got = []
        while True:
            data, _ = await self.recv(timeout_s)
            got.append(data)
            if data.startswith(start):
                return got

    async def collect(self, seconds: float) -> list[bytes]:
        """Whatever arrives in `seconds`."""
        got: list[bytes] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while (left := deadline - loop.time()) > 0:
            try:
                got.append((await self.recv(left))[0])
            except TimeoutError:
                break
        return got


SDP = "v=0\r\no=t 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 40000 RTP/AVP 0\r\n"


def invite(port: int, local: int, *, branch: str, call_id: str, cseq: int = 1, extra: str = "") -> bytes:
    """An INVITE to `agent` at 127.0.0.1:`port` from a caller on `local`, with a PCMU offer."""
    return (
        f"INVITE sip:agent@127.0.0.1:{port} SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:{local};branch={branch};rport\r\n"
        f"From: <sip:t@127.0.0.1>;tag=caller1\r\nTo: <sip:agent@127.0.0.1:{port}>\r\nCall-ID: {call_id}\r\n"
        f"CSeq: {cseq} INVITE\r\nContact: <sip:t@127.0.0.1:{local}>\r\nMax-Forwards: 70\r\n{extra}"
        f"Content-Type: application/sdp\r\nContent-Length: {len(SDP)}\r\n\r\n{SDP}"
    ).encode()


def ack_error(request: bytes, answer: bytes) -> bytes:
    """The ACK of a non-2xx final `answer` to INVITE `request`, as every UA sends it (RFC 3261 17.1.1.3): the
    INVITE's Request-URI and top Via (its branch: the same transaction), From, Call-ID and CSeq number, the
    answer's To (with its tag)."""
    uri = request.decode(errors="replace").split("\r\n", 1)[0].split()[1]
    seq = header(request, "cseq").split()[0]
    return (
        f"ACK {uri} SIP/2.0\r\nVia: {header(request, 'via')}\r\nFrom: {header(request, 'from')}\r\n"
        f"To: {header(answer, 'to')}\r\nCall-ID: {header(request, 'call-id')}\r\nCSeq: {seq} ACK\r\n"
        f"Max-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
    ).encode()


def is_error_answer_to_invite(answer: bytes) -> bool:
    """A final answer of 300 or more to an INVITE (what its sender retransmits until ACKed)."""
    status = answer.split(b" ", 2)[1] if answer.startswith(b"SIP/2.0 ") else b""
    return status.isdigit() and int(status) >= 300 and header(answer, "cseq").upper().endswith("INVITE")


def ack(port: int, local: int, answer: bytes, *, cseq: int = 1) -> bytes:
    """The ACK of a 2xx `answer` (a new branch; its To tag)."""
    return (
        f"ACK sip:agent@127.0.0.1:{port} SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:{local};branch=z9hG4bKack{cseq}\r\n"
        f"From: <sip:t@127.0.0.1>;tag=caller1\r\nTo: {header(answer, 'to')}\r\nCall-ID: {header(answer, 'call-id')}\r\n"
        f"CSeq: {cseq} ACK\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
    ).encode()
