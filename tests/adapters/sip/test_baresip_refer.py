"""baresip, a real softphone, follows the REFER of our `transfer_call`: the agent's tool asks for a transfer to
reception, the endpoint sends REFER, baresip (its `menu` module handles the REFER: `menu: transferring call
... to ...`) dials the target, a SIPp UAS, and reports the transfer's outcome in NOTIFYs; on the final
NOTIFY our leg is hung up, and the caller talks to reception."""

from __future__ import annotations

import asyncio

import pytest

from duetaspan.registry import CallContext, ToolRegistry
from duetaspan.tools.call_control import make_transfer_call
from tests.adapters.sip.leaks import checked_endpoint
from tests.adapters.sip.peer import (
    free_udp_port,
    needs_baresip,
    needs_sipp,
    run_sipp,
    sip_e2e,
    udp_bound,
    wait_for,
)
from tests.adapters.sip.softphone import dial, softphone

# serial: its calls mostly wait on SIP timers and SIPp (about 1 s of CPU in a minute of calls): in the serial
# lane beside the niced workers they fill that lane's idle time instead of holding a worker (CONTRIBUTING)
pytestmark = [needs_baresip, needs_sipp, sip_e2e, pytest.mark.serial]


async def test_baresip_follows_the_refer_of_transfer_call(tmp_path):
    from duetaspan.adapters.sip.bridge import bind_actions

    reception = free_udp_port()
    target = f"sip:desk@127.0.0.1:{reception}"
    uas = asyncio.ensure_future(
        run_sipp("", tmp_path, "-sn", "uas", "-m", "1", port=reception, timeout_s=60, name="reception")
    )
    await udp_bound(reception)
    registry = ToolRegistry([make_transfer_call({"reception": target})])
    results = []

    async def transfers(call) -> None:
        context = CallContext(call_id=call.call_sid)
        bind_actions(call, context, grace_s=0.5)  # as the agent's session binds them
        await asyncio.sleep(0.5)
        results.append(await registry.call("transfer_call", {"destination": "reception"}, context))
        await call.ended.wait()

    phone = softphone(tmp_path, "greeting", pad_s=8.0)
    async with checked_endpoint(transfers) as ep:
        log = await dial(phone, ep.port, tmp_path, seconds=25, calls=2)  # ours, then the one to reception
        await wait_for(lambda: len(ep.finished) == 1, timeout_s=30, what="our leg to end")
        call = next(iter(ep.finished.values()))
    reception_calls = await uas
    assert results and results[0].ok, results
    assert call.end_reason == f"transferred to {target}", call.end_reason
    assert f"transferring call {call.call_sid} to '<{target}>'" in log, log[-3000:]
    assert f"Call established: {target}" in log, log[-3000:]  # baresip's new call, to reception
    assert reception_calls.count("Successful call") == 1, reception_calls.screen[-2000:]
