"""The SIP leak checker (tests/adapters/sip/leaks.py) sees what it promises: a transaction still running when
a test's body is done (a BYE nobody answered) fails the test, naming the request, long before it would give
up by itself; once its final answer came, the checker is satisfied."""

from __future__ import annotations

import types

import pytest
from aiosipua.message import SipRequest, SipResponse

from duetaspan.adapters.sip.transactions import Transactions
from tests.adapters.sip import leaks

BRANCH = "z9hG4bK-leak-check-1"


def _idle_endpoint(txns: Transactions) -> types.SimpleNamespace:
    """An endpoint that holds nothing else (no ports, calls, slots, dialogs): only its transactions."""
    return types.SimpleNamespace(ports=types.SimpleNamespace(allocated=set()), calls={}, answering={},
                                 _reserved={}, _tasks=set(), uas=None, shared=None, txns=txns)  # fmt: skip


def _headers(message, method: str) -> None:
    message.headers.set_single("Via", f"SIP/2.0/UDP 127.0.0.1:5060;branch={BRANCH}")
    message.headers.set_single("From", "<sip:agent@127.0.0.1>;tag=ours")
    message.headers.set_single("To", "<sip:caller@127.0.0.1>;tag=theirs")
    message.headers.set_single("Call-ID", "leak-check-1@127.0.0.1")
    message.headers.set_single("CSeq", f"2 {method}")


async def test_a_bye_still_retransmitted_at_the_end_fails_the_check_and_its_answer_clears_it(monkeypatch):
    sent: list = []
    txns = Transactions(lambda message, addr: sent.append(message), reliable=False, t1=0.05)  # gives up in 3.2 s
    ep = _idle_endpoint(txns)
    monkeypatch.setattr(leaks, "TRANSACTIONS_GRACE_S", 0.5)
    bye = SipRequest(method="BYE", uri="sip:caller@127.0.0.1:5999")
    _headers(bye, "BYE")
    txns.outgoing(bye, ("127.0.0.1", 5999))
    assert leaks.endpoint_leaks(ep) == []  # nothing else is held: only the transaction check can see it
    assert leaks.running_transactions(ep) == [f"BYE (branch {BRANCH})"]
    with pytest.raises(AssertionError, match=r"SIP transactions still running after the test: \['BYE"):
        await leaks.assert_idle(ep)
    assert len(sent) >= 3  # retransmitted all along (timer E)
    ok = SipResponse(status_code=200, reason_phrase="OK")
    _headers(ok, "BYE")
    assert txns.response(ok) is False  # the first final answer: goes on to the call logic
    await leaks.assert_idle(ep)
    assert leaks.running_transactions(ep) == []
