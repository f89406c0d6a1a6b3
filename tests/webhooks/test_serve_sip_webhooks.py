"""Lifecycle webhooks of a SIP call end to end: a real `duetaspan serve --sip` process, a SIPp call (its
SipStone `uac` scenario: INVITE, RTP, BYE), a real HTTP receiver: `call.started`, `call.answered` and `call.ended`
arrive, in order, for the same call, signed as the contract says (checked here with hashlib/hmac, not our `verify`)."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from tests.adapters.sip.peer import needs_sipp, run_sipp, sip_e2e, wait_for
from tests.adapters.sip.test_serve_sip import serve_sip
from tests.support import worker_sip_toml
from tests.webhooks.conftest import SECRET, Receiver

pytestmark = [needs_sipp, sip_e2e, pytest.mark.slow]


def _signed(body: bytes, header: str) -> bool:
    parts = [p.split("=", 1) for p in header.split(",")]
    t = next(v for k, v in parts if k == "t")
    want = hmac.new(SECRET.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return any(k == "v1" and hmac.compare_digest(v, want) for k, v in parts)


async def test_a_sip_call_sends_signed_lifecycle_events(tmp_path):
    receiver = Receiver()
    headers: list[tuple[bytes, str]] = []
    handle = receiver._handle

    async def keep(request):  # the raw body and header as they came over the wire
        headers.append((await request.read(), request.headers.get("Duetaspan-Signature", "")))
        return await handle(request)

    receiver._handle = keep  # type: ignore[method-assign]
    hook = await receiver.start()
    (tmp_path / "agent.toml").write_text(
        f'[sip]\n{worker_sip_toml()}[webhooks]\nurls = ["{hook}"]\ntimeout_s = 3\nmax_backoff_s = 1\n'
        '[server]\ndata_dir = "data"\n'
    )
    env = {"DUETASPAN_WEBHOOK_SECRET": SECRET}
    try:
        async with serve_sip(tmp_path, "--max-calls", "1", "--config", str(tmp_path / "agent.toml"), env=env) as (
            _base, sip_port, proc,
        ):  # fmt: skip
            got = await run_sipp(f"127.0.0.1:{sip_port}", tmp_path, "-sn", "uac", "-m", "1", "-d", "1500")
            assert got.rc == 0, got.output + got.errors
            types = lambda: [g["event"]["type"] for g in receiver.got]  # noqa: E731
            await wait_for(lambda: "call.ended" in types(), timeout_s=60, what="call.ended at the receiver")
            assert proc.poll() is None
    finally:
        await receiver.stop()
    events = [g["event"] for g in receiver.got]
    assert [e["type"] for e in events] == ["call.started", "call.answered", "call.ended"], events
    assert receiver.bad_signatures == 0 and len({e["call_id"] for e in events}) == 1
    assert len({e["id"] for e in events}) == 3 and [e["created"] for e in events] == sorted(e["created"] for e in events)
    started, ended = events[0]["data"], events[2]["data"]
    assert started["transport"] == "sip" and ended["transport"] == "sip" and ended["recorded"] is True
    assert headers and all(_signed(body, header) for body, header in headers)
