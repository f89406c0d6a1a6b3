"""Answer detection with baresip as the callee: a real softphone answers our `ep.dial(..., detect=True)`,
plays a committed phone-line fixture as its microphone (`aufile`) and records what it hears (`sndfile`: the
measure; SIPp records nothing). Its recording starts with the first RTP packet that reached it, so it is put on
the call's (the microphone's) timeline by `dec_offset_s`. A voicemail greeting with a beep: baresip's recording
holds nothing audible until the beep is over, then the configured message; the agent hangs up and the record
says `voicemail_left`. A person's "Hello?" then quiet: the agent's audio is in baresip's recording after the
`human` verdict and soon after it (the time from the end of the word is printed: the goal is 1 s)."""

from __future__ import annotations

import asyncio
import contextlib
import json

import numpy as np
import pytest

from duetaspan.adapters.sip.bridge import agent_call_handler
from duetaspan.agent import Agent
from duetaspan.config import AgentConfig
from duetaspan.outbound import read_wav
from duetaspan.testing.sessions import capture_sessions
from tests.adapters.sip.peer import endpoint_on_loopback, needs_baresip, sip_e2e, udp_bound, wait_for
from tests.adapters.sip.softphone import dec_offset_s, dial, heard, softphone
from tests.outbound.test_answer_sip import _match
from tests.support import REPO_ROOT

pytestmark = [needs_baresip, sip_e2e, pytest.mark.slow, pytest.mark.serial]

ANSWERS = REPO_ROOT / "tests" / "fixtures" / "answers"
LABELS = json.loads((ANSWERS / "labels.json").read_text())


@contextlib.asynccontextmanager
async def baresip_callee(tmp_path, fixture: str, pad_s: float, **outbound):
    """A detecting agent on a loopback endpoint and baresip (auto-answer) whose microphone is `fixture` then
    `pad_s` of silence (it hangs up when that ends); yields (endpoint, sessions, baresip's task, its URI).
    baresip's jitter buffer starts decoding after one frame, not its default five (100 ms on loopback): the
    measure is when the agent's audio reached the callee, not how long the softphone chose to buffer it."""
    config = AgentConfig.from_dict({"outbound": {"detect": False, **outbound}}, base_dir=tmp_path)
    agent = Agent(model="tiny-random", device="cpu", router=False, record_dir=tmp_path / "rec", seed=0,
                  max_calls=1, config=config)  # fmt: skip
    sessions = capture_sessions(agent)
    phone = softphone(tmp_path, str(ANSWERS / fixture), pad_s=pad_s, answer=True, jitter_frames="1-10")
    async with agent, endpoint_on_loopback(agent_call_handler(agent), max_calls=1) as ep:
        task = asyncio.ensure_future(dial(phone, None, tmp_path, seconds=60))
        try:
            await udp_bound(phone.sip_port)
            yield ep, sessions, phone, task, f"sip:tester@127.0.0.1:{phone.sip_port}"
        finally:
            if not task.done():
                await asyncio.wait_for(task, 120)


def _first_audible_s(pcm: np.ndarray, rate: int, level: float = 0.01) -> float | None:
    step = rate // 50
    windows = pcm[: len(pcm) // step * step].reshape(-1, step)
    loud = np.flatnonzero(np.sqrt(np.mean(windows**2, axis=1)) > level)
    return float(loud[0]) * 0.02 if len(loud) else None


async def _finished(ep, sessions, task) -> tuple[object, str]:
    log = await asyncio.wait_for(task, 120)
    await wait_for(lambda: ep.finished and sessions and sessions[0].record is not None, timeout_s=60,
                   what="the call to finish and its record")  # fmt: skip
    return next(iter(ep.finished.values())), log


async def test_baresip_records_the_voicemail_message_after_the_beep_and_nothing_before(tmp_path):
    message, _ = read_wav(str(ANSWERS / "hello.wav"))  # the message left after the tone: a repo wav
    async with baresip_callee(tmp_path, "greeting_beep.wav", pad_s=14.0,
                              voicemail_wav=str(ANSWERS / "hello.wav")) as (ep, sessions, phone, task, uri):  # fmt: skip
        result = await ep.dial(uri, ring_timeout_s=20, detect=True)
        assert result.outcome == "answered", result
        call, log = await _finished(ep, sessions, task)
    assert "Call established" in log, log[-3000:]
    gate = sessions[0].service.answer
    assert [v.verdict for v in gate.verdicts][:2] == ["voicemail", "beep"], gate.verdicts
    assert gate.outcome == "voicemail_left", gate.outcome
    assert "terminated" in log and call.end_reason != "caller hung up (BYE)", call.end_reason  # we hung up
    pcm, rate = heard(phone)
    assert rate == 8000
    beep_end = LABELS["greeting_beep.wav"]["beep_at_s"] + LABELS["greeting_beep.wav"]["extra"]["beep_s"]
    offset = dec_offset_s(phone)
    # nothing but silence until the message: nothing leaked before the beep
    first = _first_audible_s(pcm, rate)
    assert first is not None and first + offset > beep_end - 0.1, (first, offset, beep_end)
    assert len(pcm) / rate + offset > beep_end + len(message) / 8000 * 0.9  # the whole message was heard
    score = _match(pcm[int(max(beep_end - 0.1 - offset, 0.0) * rate) :], message)
    assert score > 0.7, score  # the message's own waveform in baresip's decoded recording
    record = json.loads((tmp_path / "rec" / f"{call.call_sid.replace('@', '_')}.json").read_text())
    assert record["meta"]["outcome"] == "voicemail_left" and record["complete"] is True
    print(
        f"voicemail to baresip: message heard from {first + offset:.2f} s (beep ended {beep_end:.2f} s), "
        f"match {score:.2f}"
    )


async def test_baresip_hears_the_agent_right_after_hello(tmp_path):
    async with baresip_callee(tmp_path, "hello_short.wav", pad_s=3.0) as (ep, sessions, phone, task, uri):
        result = await ep.dial(uri, ring_timeout_s=20, detect=True)
        assert result.outcome == "answered", result
        call, log = await _finished(ep, sessions, task)
    assert "Call established" in log, log[-3000:]
    gate = sessions[0].service.answer
    words_end = LABELS["hello_short.wav"]["speech_end_s"]
    assert gate.verdict.verdict == "human" and not gate.gated, gate.verdicts
    assert words_end < gate.verdict.decided_at_s < words_end + 1.0, gate.verdict
    pcm, rate = heard(phone)
    first = _first_audible_s(pcm, rate)  # the agent (the tiny model's audio) in baresip's recording
    assert first is not None, "baresip heard nothing"
    first += dec_offset_s(phone)
    # heard only after the verdict (nothing leaked while gated), and soon after it; the figure against the
    # goal (within 1 s of the end of the word) is printed and in docs/outbound.md, not timed here
    assert gate.verdict.decided_at_s - 0.05 <= first < gate.verdict.decided_at_s + 1.0, (first, gate.verdict)
    assert call.end_reason == "caller hung up (BYE)", call.end_reason  # baresip's file ended: its BYE
    print(
        f"person to baresip: verdict {gate.verdict.decided_at_s - words_end:.2f} s and the agent heard "
        f"{first - words_end:.2f} s after the end of hello"
    )
