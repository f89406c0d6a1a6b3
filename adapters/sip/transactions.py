"""RFC 3261 section 17 transactions over UDP, on top of aiosipua (which builds, parses and matches messages
but never retransmits a request, never ACKs a non-2xx final answer to our INVITE, never resends a response to
a retransmitted request and retransmits no error answer; docs/sip.md says why no library gives this in a form
we can use).

`Transactions` sees every message the transport sends (`outgoing`) and receives (`response`, `request`):
- client side: an INVITE is retransmitted (timer A: T1, 2*T1, ...) until any answer; BYE, CANCEL, REFER,
  REGISTER, UPDATE, OPTIONS (timer E, doubling up to T2, then T2) until a final one; each gives up at 64*T1
  (timers B and F) and `on_timeout(request)` says so; an INVITE that rang waits for its final answer
  `PROCEEDING_MAX_S` at most, and once we CANCEL it 64*T1 at most (9.1: then `on_timeout` too). A non-2xx
  final answer to our INVITE is ACKed on the INVITE's branch (17.1.1.3), its retransmissions are ACKed
  again and never reach the call logic; a retransmitted 2xx is answered with the very ACK the dialog sent
  for the first one (13.2.2.4: the UAC core
  retransmits its ACK; a fresh ACK with a new branch is a new request to the callee, and SIPp, for one, aborts
  the call on it) and goes no further; a retransmitted final answer to a non-INVITE request is absorbed too. `on_final(request, response)` hears
  each first final answer.
- server side: a request whose (branch, method, Call-ID) was seen within 64*T1 is a retransmission: the last
  response we sent to it is sent again (nothing, while we have not answered yet) and the request goes no
  further; an error answer (>= 300) to an INVITE is retransmitted (timer G) until its ACK (same branch) or
  64*T1 (timer H); that ACK is absorbed. Record-Route of an INVITE is copied into our 18x/2xx (12.1.1).

Over TCP/TLS (`reliable`) nothing is retransmitted, but the timeouts still hold. At most `MAX_ENTRIES`
server entries are kept (oldest dropped first): a flood of distinct requests costs bounded memory.

Example:
    >>> txns = Transactions(lambda message, addr: None, reliable=False)
    >>> txns.t1, txns.timeout_s
    (0.5, 32.0)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiosipua.message import SipRequest, SipResponse

logger = logging.getLogger("duetaspan.sip")

T1 = 0.5
T2 = 4.0
MAX_ENTRIES = 4096
PROCEEDING_MAX_S = 300.0  # how long a ringing INVITE's transaction waits for its final answer
Send = Callable[[Any, tuple[str, int]], None]


def top_branch(message: Any) -> str:
    vias = message.headers.get("via")
    if not vias:
        return ""
    for part in vias[0].split(";")[1:]:
        name, _, value = part.strip().partition("=")
        if name.lower() == "branch":
            return value.strip()
    return ""


def cseq_method(message: Any) -> str:
    raw = message.headers.get_first("cseq") or ""
    parts = raw.split()
    return parts[1].upper() if len(parts) >= 2 else ""


def split_header_values(values: list[str]) -> list[str]:
    """`Record-Route`/`Route` values one per entry (a header may carry several, comma-separated)."""
    out: list[str] = []
    for value in values:
        depth, start = 0, 0
        for i, ch in enumerate(value):
            if ch == "<":
                depth += 1
            elif ch == ">":
                depth -= 1
            elif ch == "," and depth == 0:
                out.append(value[start:i].strip())
                start = i + 1
        if value[start:].strip():
            out.append(value[start:].strip())
    return out


def _dialog_key(message: Any) -> tuple[str, str, str]:
    """(Call-ID, CSeq number, To tag): which 2xx an ACK answers (the ACK carries the 2xx's To)."""
    seq = (message.headers.get_first("cseq") or "").split()
    to = message.headers.get_first("to") or ""
    tag = next((p.strip()[4:] for p in to.split(";")[1:] if p.strip().lower().startswith("tag=")), "")
    return (message.call_id or "", seq[0] if seq else "", tag)


@dataclass
class _Client:
    request: SipRequest
    addr: tuple[str, int]
    method: str
    task: asyncio.Task[None] | None = None
    answered: bool = False  # any response (INVITE: stops timer A; others: retransmit at T2)
    final: int = 0
    ack: SipRequest | None = None  # our ACK of a non-2xx final (INVITE)
    cancelled_at: float | None = None  # (INVITE) when we sent its CANCEL (loop time)
    nudged: asyncio.Event = field(default_factory=asyncio.Event)  # a final answer, or our CANCEL


@dataclass
class _Server:
    request: SipRequest
    at: float
    response: Any = None
    dest: tuple[str, int] | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class Transactions:
    """The client and server transactions of one endpoint (see the module docstring)."""

    def __init__(
        self,
        send: Send,
        *,
        reliable: bool,
        t1: float = T1,
        on_timeout: Callable[[SipRequest], object] = lambda request: None,
        on_final: Callable[[SipRequest, SipResponse], object] = lambda request, response: None,
    ) -> None:
        self.send = send  # the raw send: not seen by `outgoing` again
        self.reliable = reliable
        self.t1 = t1
        self.t2 = T2 * t1 / T1
        self.on_timeout = on_timeout
        self.on_final = on_final
        self._client: dict[tuple[str, str], _Client] = {}
        self._server: OrderedDict[tuple[str, str, str], _Server] = OrderedDict()
        # the ACK we sent for each 2xx, by (Call-ID, CSeq number, To tag): resent on the 2xx's retransmission
        self._acks: OrderedDict[tuple[str, str, str], tuple[SipRequest, tuple[str, int], float]] = (
            OrderedDict()
        )
        self.retransmissions_absorbed = 0

    @property
    def timeout_s(self) -> float:
        return 64 * self.t1

    # --- what we send ----------------------------------------------------------------------------------
    def outgoing(self, message: Any, addr: tuple[str, int]) -> None:
        """Called before the transport sends `message` (ours, never a retransmission of it)."""
        if isinstance(message, SipRequest):
            method = message.method.upper()
            branch = top_branch(message)
            if method == "ACK":
                self._remember_ack(message, addr)
                return
            if method == "CANCEL":
                self._cancelling((branch, "INVITE"))
            if not branch or (branch, method) in self._client:
                return
            txn = _Client(message, addr, method)
            self._client[(branch, method)] = txn
            txn.task = asyncio.get_running_loop().create_task(self._run_client((branch, method), txn))
            return
        key = (top_branch(message), cseq_method(message), message.call_id or "")
        entry = self._server.get(key)
        if entry is None:
            return
        status = message.status_code
        if key[1] == "INVITE" and 100 < status < 300:
            self._copy_record_route(entry.request, message)
        entry.response, entry.dest = message, addr
        if key[1] == "INVITE" and status >= 300 and not self.reliable and entry.task is None:
            entry.task = asyncio.get_running_loop().create_task(self._retransmit_error(key, entry))

    @staticmethod
    def _copy_record_route(request: SipRequest, response: SipResponse) -> None:
        routes = request.headers.get("record-route")
        if routes and not response.headers.get("record-route"):
            for route in routes:
                response.headers.append("Record-Route", route)

    async def _run_client(self, key: tuple[str, str], txn: _Client) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        interval = self.t1
        done = lambda: txn.final != 0 or (txn.method == "INVITE" and txn.answered)  # noqa: E731
        try:
            while not done() and loop.time() < deadline:
                await asyncio.sleep(min(interval, max(0.0, deadline - loop.time())))
                if done() or loop.time() >= deadline:
                    break
                if not self.reliable:
                    self.send(txn.request, txn.addr)
                if txn.answered:  # a provisional answer to a non-INVITE: T2 from now on (17.1.2.2)
                    interval = self.t2
                else:
                    interval = interval * 2 if txn.method == "INVITE" else min(interval * 2, self.t2)
            if not done():
                logger.warning(
                    "SIP %s to %s:%d: no response in %.0f s (given up)", txn.method, *txn.addr, self.timeout_s
                )
                self.on_timeout(txn.request)
                return
            if not txn.final:  # an INVITE that rings: its final answer (or our CANCEL's 487) is still to come
                await self._proceeding(txn)
            if txn.ack is not None:  # a non-2xx final: ACK its retransmissions for a while (timer D)
                await asyncio.sleep(self.timeout_s)
        finally:
            self._client.pop(key, None)

    def _cancelling(self, key: tuple[str, str]) -> None:
        """Our CANCEL of the INVITE `key` goes out: its transaction now waits 64*T1 at most (RFC 3261 9.1)."""
        txn = self._client.get(key)
        if txn is not None and txn.cancelled_at is None and not txn.final:
            txn.cancelled_at = asyncio.get_running_loop().time()
            txn.nudged.set()

    async def _proceeding(self, txn: _Client) -> None:
        """Wait for a ringing INVITE's final answer: `PROCEEDING_MAX_S` at most, and 64*T1 after our CANCEL (RFC
        3261 9.1: a callee that answers the CANCEL but never sends its 487, or whose answers are all lost); then
        the transaction is over and `on_timeout(request)` says so."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + PROCEEDING_MAX_S
        while not txn.final:
            cancelled = txn.cancelled_at
            deadline = give_up if cancelled is None else min(give_up, cancelled + self.timeout_s)
            if loop.time() >= deadline:
                break
            txn.nudged.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(txn.nudged.wait(), deadline - loop.time())
        if not txn.final and txn.cancelled_at is not None:
            logger.warning("SIP INVITE %s to %s:%d: no final answer %.0f s after our CANCEL (transaction ended)",
                           txn.request.call_id, *txn.addr, self.timeout_s)  # fmt: skip
            self.on_timeout(txn.request)

    # --- what we receive -------------------------------------------------------------------------------
    def _remember_ack(self, ack: SipRequest, addr: tuple[str, int]) -> None:
        """The dialog's ACK of a 2xx (our ACKs of error answers go out raw, never through `outgoing`)."""
        now = time.monotonic()
        self._acks[_dialog_key(ack)] = (ack, addr, now)
        horizon = now - self.timeout_s  # a 2xx is retransmitted for 64*T1 at most (timer L/H)
        while self._acks and (len(self._acks) > MAX_ENTRIES or next(iter(self._acks.values()))[2] < horizon):
            self._acks.popitem(last=False)

    def response(self, response: SipResponse) -> bool:
        """True when `response` is a retransmission already handled here (the caller drops it)."""
        status = response.status_code
        if 200 <= status < 300 and cseq_method(response) == "INVITE":
            sent = self._acks.get(_dialog_key(response))
            if sent is not None:  # a retransmitted 2xx: our ACK again, the same message (13.2.2.4)
                self.send(sent[0], sent[1])
                self.retransmissions_absorbed += 1
                return True
        key = (top_branch(response), cseq_method(response))
        txn = self._client.get(key)
        if txn is None:
            return False
        if status < 200:
            txn.answered = True
            return txn.final != 0
        if txn.final:
            if txn.ack is not None:
                self.send(txn.ack, txn.addr)  # the callee did not hear our ACK: again
            if txn.method == "INVITE" and 200 <= status < 300:
                return False  # a 2xx the dialog has not ACKed yet (another fork's): the dialog ACKs it
            self.retransmissions_absorbed += 1
            return True
        txn.answered, txn.final = True, status
        txn.nudged.set()
        if txn.method == "INVITE" and status >= 300:
            txn.ack = self._ack_for(txn, response)
            self.send(txn.ack, txn.addr)
        self.on_final(txn.request, response)
        return False

    @staticmethod
    def _ack_for(txn: _Client, response: SipResponse) -> SipRequest:
        """The ACK of a non-2xx final answer: the INVITE's Request-URI, top Via, From, Call-ID, Route and
        CSeq number, the answer's To (with its tag) (RFC 3261 17.1.1.3)."""
        invite = txn.request
        ack = SipRequest(method="ACK", uri=invite.uri)
        ack.headers.append("Via", invite.headers.get("via")[0])
        for name in ("From", "Call-ID"):
            value = invite.headers.get_first(name)
            if value:
                ack.headers.set_single(name, value)
        to = response.headers.get_first("to") or invite.headers.get_first("to")
        if to:
            ack.headers.set_single("To", to)
        seq = (invite.headers.get_first("cseq") or "1").split()[0]
        ack.headers.set_single("CSeq", f"{seq} ACK")
        ack.headers.set_single("Max-Forwards", "70")
        for route in invite.headers.get("route"):
            ack.headers.append("Route", route)
        ack.headers.set_single("Content-Length", "0")
        return ack

    def request(self, request: SipRequest) -> bool:
        """True when `request` is a retransmission (answered again here) or the ACK of our error answer."""
        method = request.method.upper()
        branch = top_branch(request)
        if not branch:
            return False
        call_id = request.call_id or ""
        if method == "ACK":
            entry = self._server.get((branch, "INVITE", call_id))
            if entry is None or entry.response is None or entry.response.status_code < 300:
                return False  # the ACK of a 2xx: a transaction of its own, for the dialog
            if entry.task is not None:
                entry.task.cancel()
                entry.task = None
            return True
        key = (branch, method, call_id)
        self._prune()
        entry = self._server.get(key)
        if entry is not None:
            self.retransmissions_absorbed += 1
            if entry.response is not None and entry.dest is not None:
                self.send(entry.response, entry.dest)
            return True
        self._server[key] = _Server(request, time.monotonic())
        while len(self._server) > MAX_ENTRIES:
            _, old = self._server.popitem(last=False)
            if old.task is not None:
                old.task.cancel()
        return False

    def _prune(self) -> None:
        horizon = time.monotonic() - self.timeout_s
        while self._server:
            key, entry = next(iter(self._server.items()))
            if entry.at > horizon or entry.task is not None:
                return
            del self._server[key]

    async def _retransmit_error(self, key: tuple[str, str, str], entry: _Server) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        interval = self.t1
        try:
            while loop.time() + interval < deadline:
                await asyncio.sleep(interval)
                if entry.dest is not None:
                    self.send(entry.response, entry.dest)
                interval = min(interval * 2, self.t2)
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            logger.info(
                "SIP %d to INVITE %s: no ACK in %.0f s", entry.response.status_code, key[2], self.timeout_s
            )
        finally:
            entry.task = None

    def when_over(self, request: SipRequest, callback: Callable[[], object]) -> bool:
        """Call `callback()` once the client transaction of our `request` is over (its final answer handled, its
        timers run out, or `close`); False, and no call, when none is running."""
        txn = self._client.get((top_branch(request), request.method.upper()))
        if txn is None or txn.task is None or txn.task.done():
            return False
        txn.task.add_done_callback(lambda task: callback())
        return True

    def pending(self) -> int:
        """Client transactions still running (and timers of error answers): 0 once all is quiet."""
        return len(self._client) + sum(1 for e in self._server.values() if e.task is not None)

    def close(self) -> None:
        for txn in self._client.values():
            if txn.task is not None:
                txn.task.cancel()
        for entry in self._server.values():
            if entry.task is not None:
                entry.task.cancel()
        self._client.clear()
        self._server.clear()
        self._acks.clear()


__all__ = ["MAX_ENTRIES", "T1", "T2", "Transactions", "cseq_method", "split_header_values", "top_branch"]
