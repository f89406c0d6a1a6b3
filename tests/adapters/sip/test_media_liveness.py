"""What a call holds and for how long: a call hung up while it rings gives its RTP port pair back (it leaked
on every such hang-up), and each test here leaves nothing behind (`leaks.checked_endpoint`). SIPp is the
caller."""

from __future__ import annotations

import numpy as np

from tests.adapters.sip.leaks import checked_endpoint
from tests.adapters.sip.peer import needs_sipp, run_sipp, scenario, sip_e2e, wait_for

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


async def test_a_caller_that_goes_silent_is_ended_by_the_media_timeout(tmp_path):
    """SIPp answers, ACKs, sends no RTP and never hangs up (a dropped mobile): our BYE comes at the timeout."""
    async with checked_endpoint(echo, media_timeout_s=1.0) as ep:
        path = scenario("bye_from_agent", tmp_path, USER="agent", BYE_TIMEOUT_MS=20000)
        got = await run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf", str(path), "-m", "1")
        await wait_for(lambda: len(ep.finished) == 1, what="the call's end")
    call = next(iter(ep.finished.values()))
    assert got.rc == 0, got.output + got.errors  # it got our BYE and answered it
    assert call.end_reason == "media_timeout"
    assert call.ended_at is not None and 1.0 <= call.ended_at - call.media.started_at < 10.0


async def test_a_hold_longer_than_the_media_timeout_is_not_ended(tmp_path):
    """On hold (a=sendonly) for 2.5 s with a 1 s timeout, sending nothing: the call goes on, and ends with
    the caller's BYE after it resumes."""
    async with checked_endpoint(echo, media_timeout_s=1.0) as ep:
        path = scenario("hold_long", tmp_path, USER="agent", TALK_MS=300, HOLD_MS=2500)
        got = await run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf", str(path), "-m", "1")
        await wait_for(lambda: len(ep.finished) == 1, what="the call's end")
    call = next(iter(ep.finished.values()))
    assert got.rc == 0, got.output + got.errors
    assert call.end_reason == "caller hung up (BYE)" and call.media.holds == 1
