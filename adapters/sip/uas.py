"""aiosipua's `SipUAS` behind our gate: every request that belongs to no known call passes `SipGate.check`
before the stack sees it (a refused source never gets even `100 Trying`), and in-dialog `INFO` carries DTMF
(`application/dtmf-relay` / `application/dtmf`).

Requests for a known Call-ID go straight to aiosipua, which checks the dialog (tags, CSeq) and answers
`481` when they match none. `ACK` is never answered, whatever its source.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from aiosipua import SipUAS
from aiosipua.message import SipRequest, SipResponse

from duetaspan.adapters.sip.gate import SipGate

logger = logging.getLogger("duetaspan.sip")

_DTMF_SIGNAL = re.compile(r"(?im)^\s*signal\s*=\s*([0-9A-D*#])\s*$")
_DTMF_PLAIN = re.compile(r"^\s*([0-9A-D*#])\s*$", re.I)


class GatedUAS(SipUAS):
    """`SipUAS` with `gate` in front of out-of-dialog requests; refusals go to `on_refused(reason, addr)`."""

    def __init__(
        self,
        transport: Any,
        gate: SipGate,
        *,
        silent: bool,
        on_refused: Callable[[str, tuple[str, int]], object],
        on_dtmf: Callable[[str, str], object],
        on_response: Callable[[Any], bool] = lambda response: False,
        **kwargs: Any,
    ) -> None:
        super().__init__(transport, **kwargs)
        self.gate = gate
        self.silent = silent
        self.on_refused = on_refused
        self.on_info_dtmf = on_dtmf
        self.on_response = on_response  # answers to our own in-dialog requests (REFER)
        self._handlers["INFO"] = self._handle_info

    def _on_message(self, msg: Any, addr: tuple[str, int]) -> None:
        if isinstance(msg, SipResponse) and self.on_response(msg):
            return
        super()._on_message(msg, addr)

    def _known(self, call_id: str) -> bool:
        return call_id in self._calls or (self.uac is not None and call_id in self.uac._calls)

    def _handle_request(self, request: SipRequest, addr: tuple[str, int]) -> None:
        method = request.method.upper()
        if method == "ACK" or self._known(request.call_id or ""):
            super()._handle_request(request, addr)
            return
        verdict = self.gate.check(request, addr[0])
        if verdict == "allow":
            super()._handle_request(request, addr)
        elif verdict == "challenge":
            self._send_error(
                request, 401, "Unauthorized", extra_headers={"WWW-Authenticate": self.gate.challenge_header()}
            )
        else:
            reason = "rate_limited" if verdict == "rate_limited" else "forbidden"
            self.on_refused(reason, addr)
            if reason == "forbidden" and not self.silent and request.headers.get("via"):
                self._send_error(request, 403, "Forbidden")

    def _handle_info(self, request: SipRequest, addr: tuple[str, int]) -> None:
        call = self._calls.get(request.call_id or "")
        if call is None:
            self._send_error(request, 481, "Call/Transaction Does Not Exist")
            return
        if not self._validate_in_dialog(call.dialog, request):
            return
        resp = call.dialog.create_response(request, 200, "OK")
        self.transport.send_reply(resp)
        ctype = (request.content_type or "").lower()
        text = request.text if request.body else ""
        match = _DTMF_SIGNAL.search(text) if ctype == "application/dtmf-relay" else None
        if match is None and ctype == "application/dtmf":
            match = _DTMF_PLAIN.match(text)
        if match is not None:
            self.on_info_dtmf(call.call_id, match.group(1).upper())


__all__ = ["GatedUAS"]
