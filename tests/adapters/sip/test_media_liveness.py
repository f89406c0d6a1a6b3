"""What a call holds and for how long: a call hung up while it rings gives its RTP port pair back (it leaked
on every such hang-up), and each test here leaves nothing behind (`leaks.checked_endpoint`). SIPp is the
caller."""

from __future__ import annotations

import numpy as np

from tests.adapters.sip.leaks import checked_endpoint
from tests.adapters.sip.peer import needs_sipp, run_sipp, scenario, sip_e2e

pytestmark = [needs_sipp, sip_e2e]


async def echo(call) -> None:
    call.media.set_output_rate(8000)
    async for pcm in call.media.audio():
        call.media.send_audio(pcm.astype(np.float32) / 32768)


async def test_a_call_cancelled_while_ringing_leaves_no_port(tmp_path):
    async with checked_endpoint(echo, answer_after_ms=1200) as ep:
        for _ in range(2):
            got = await run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf",
                                 str(scenario("cancel", tmp_path, USER="agent")), "-m", "1")  # fmt: skip
            assert got.rc == 0, got.output + got.errors
        assert not ep.calls and not ep.finished
