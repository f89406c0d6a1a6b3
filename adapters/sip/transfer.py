"""Blind transfer by REFER (RFC 3515) for `transfer_call`: we ask the caller's side to call the target,
wait for its answer to the REFER (202 Accepted, else a clear `SipActionFailed` naming the refusal) and for the
final NOTIFY of the transfer's progress (message/sipfrag), then hang up our leg with BYE. aiosipua builds and
sends the REFER and parses the NOTIFYs; this module only matches their answers to the waiting transfer.

Example:
    >>> # await transfers.refer(call, "sip:desk@pbx.example")   # raises SipActionFailed when refused
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiosipua import SipUAC
from aiosipua.message import SipResponse

from duetaspan.adapters.sip.call import SipActionFailed, SipCall

logger = logging.getLogger("duetaspan.sip")

REFER_ANSWER_TIMEOUT_S = 40.0  # past 64*T1: the REFER's transaction gives up first (`no_answer`)
TRANSFER_TIMEOUT_S = 30.0  # the target rings: how long the caller's side may take to report the outcome


@dataclass
class Transfers:
    """Pending REFERs by Call-ID: the REFER's answer and the transfer's final NOTIFY."""

    uac: SipUAC
    hop: Callable[[SipCall], tuple[str, int]] = lambda call: call.dialog.source_addr  # where the REFER goes
    _answers: dict[str, asyncio.Future[tuple[int, str]]] = field(default_factory=dict)
    _outcomes: dict[str, asyncio.Future[tuple[int, str]]] = field(default_factory=dict)

    def response(self, response: SipResponse) -> bool:
        """A response from the wire; True when it answered one of our REFERs."""
        cseq = response.cseq
        if cseq is None or cseq.method.upper() != "REFER" or response.status_code < 200:
            return False
        future = self._answers.get(response.call_id or "")
        if future is not None and not future.done():
            future.set_result((response.status_code, response.reason_phrase))
        return True

    def no_answer(self, call_id: str) -> None:
        """The REFER's transaction gave up (64*T1 without a final answer)."""
        future = self._answers.get(call_id)
        if future is not None and not future.done():
            future.set_result((0, "no answer"))

    def progress(self, call_id: str, status: int, reason: str) -> None:
        """A NOTIFY's sipfrag status (aiosipua's `on_transfer_progress`)."""
        logger.info("call %s: transfer progress %d %s", call_id, status, reason)
        future = self._outcomes.get(call_id)
        if status >= 200 and future is not None and not future.done():
            future.set_result((status, reason))

    async def refer(self, call: SipCall, target: str) -> None:
        """Transfer `call` to `target` (a SIP URI, or a number: `sip:NUMBER@<the caller's host>`)."""
        uri = (
            target
            if target.startswith(("sip:", "sips:", "tel:"))
            else f"sip:{target}@{call.dialog.source_addr[0]}"
        )
        loop = asyncio.get_running_loop()
        call_id = call.call_sid
        answer: asyncio.Future[Any] = loop.create_future()
        outcome: asyncio.Future[Any] = loop.create_future()
        self._answers[call_id], self._outcomes[call_id] = answer, outcome
        try:
            try:
                self.uac.send_refer(getattr(call.dialog, "dialog", call.dialog), uri, self.hop(call))
            except ValueError as exc:
                raise SipActionFailed(f"transfer_call to {uri}: {exc}") from None
            logger.info("call %s: REFER to %s", call_id, uri)
            try:
                status, reason = await asyncio.wait_for(answer, REFER_ANSWER_TIMEOUT_S)
            except TimeoutError:
                raise SipActionFailed(f"transfer_call to {uri}: no answer to the REFER") from None
            if status == 0:
                raise SipActionFailed(f"transfer_call to {uri}: no answer to the REFER")
            if status >= 300:
                raise SipActionFailed(
                    f"transfer_call to {uri}: the caller's side refused the REFER ({status} {reason})"
                )
            try:
                status, reason = await asyncio.wait_for(outcome, TRANSFER_TIMEOUT_S)
            except TimeoutError:
                raise SipActionFailed(
                    f"transfer_call to {uri}: no final NOTIFY in {TRANSFER_TIMEOUT_S:.0f} s"
                ) from None
            if status >= 300:
                raise SipActionFailed(f"transfer_call to {uri}: the transfer failed ({status} {reason})")
            logger.info("call %s: transferred to %s (%d %s)", call_id, uri, status, reason)
        finally:
            self._answers.pop(call_id, None)
            self._outcomes.pop(call_id, None)


__all__ = ["REFER_ANSWER_TIMEOUT_S", "TRANSFER_TIMEOUT_S", "Transfers"]
