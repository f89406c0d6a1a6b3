"""Answer detection end to end over SIP: the endpoint dials (`ep.dial(..., detect=True)`) SIPp as the callee
(`callee_greets.xml`: real SIP, 180, 200 with retransmissions, ACK, BYE), whose SDP names the test's RTP peer
(`tests/adapters/sip/rtp_peer.py`: it plays the committed phone-line fixture as paced PCMU and records what
the agent sends, with the callee's arrival times). A voicemail greeting with a beep: the verdict is a machine,
nothing audible reaches the callee before the beep, the configured message (a repo wav) is what arrives
after it, the agent hangs up (BYE) and the record says `voicemail_left`. A person's "hello?" then silence:
the verdict is `human` and the agent's audio reaches the callee within a second of the end of the words. A
phone menu (the transcript's second opinion, a scripted loopback ASR, hears "press one"): the verdict is
`ivr`, the agent stays gated, and the built-in `send_dtmf` tool's digit reaches the callee as RFC 4733
events paced in real time, the marker bit on the first packet only."""

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
from tests.adapters.sip.peer import (
    endpoint_on_loopback,
    free_udp_port,
    needs_sipp,
    run_sipp,
    scenario,
    sip_e2e,
    udp_bound,
    wait_for,
)
from tests.adapters.sip.rtp_peer import RtpPeer, to_ulaw
from tests.support import REPO_ROOT

pytestmark = [needs_sipp, sip_e2e, pytest.mark.slow]

ANSWERS = REPO_ROOT / "tests" / "fixtures" / "answers"
LABELS = json.loads((ANSWERS / "labels.json").read_text())


@contextlib.asynccontextmanager
async def callee(tmp_path, fixture: str, talk_ms: int, asr: dict | None = None, **outbound):
    """A detecting agent on a loopback endpoint, SIPp answering on a port of its own, the RTP peer playing
    `fixture` from the answer on; yields (endpoint, agent's sessions, peer, SIPp's task, SIPp's URI)."""
    config = AgentConfig.from_dict({"outbound": {"detect": False, **outbound}, **({"asr": asr} if asr else {})},
                                   base_dir=tmp_path)  # fmt: skip
    agent = Agent(model="tiny-random", device="cpu", router=False, record_dir=tmp_path / "rec", seed=0,
                  max_calls=1, config=config)  # fmt: skip
    sessions = capture_sessions(agent)
    peer = RtpPeer()
    pcm, rate = read_wav(str(ANSWERS / fixture))
    assert rate == 8000
    inner = agent_call_handler(agent)

    async def answered(call) -> None:  # the callee's greeting starts as the call is answered
        peer.start(("127.0.0.1", call.media.port), to_ulaw(pcm))
        await inner(call)

    port = free_udp_port()
    path = scenario("callee_greets", tmp_path, MEDIA_PORT=peer.port, TALK_MS=talk_ms)
    try:
        async with agent, endpoint_on_loopback(answered, max_calls=1) as ep:
            sipp = asyncio.create_task(run_sipp("", tmp_path, "-sf", str(path), "-m", "1", port=port,
                                                timeout_s=60, name="callee"))  # fmt: skip
            bound = asyncio.ensure_future(udp_bound(port))
            await asyncio.wait([sipp, bound], return_when=asyncio.FIRST_COMPLETED)
            if sipp.done():  # SIPp gave up before listening (a port taken): say why, not "nothing bound"
                bound.cancel()
                got = sipp.result()
                raise AssertionError(f"SIPp exited {got.rc} before answering: {got.errors[-800:]}{got.output[-800:]}")
            await bound
            yield ep, sessions, peer, sipp, f"sip:+15551234567@127.0.0.1:{port}"
    finally:
        await peer.aclose()


def _match(heard: np.ndarray, message: np.ndarray, chunk: int = 1600) -> float:
    """How well the message's voiced 0.2 s pieces are found in `heard`, in order: the median of each piece's
    best normalised cross-correlation (1.0: the very waveform). Piece by piece, so a late or lost packet
    under load shifts nothing after it."""
    scores, last = [], -1
    for start in range(0, len(message) - chunk + 1, chunk):
        piece = message[start : start + chunk]
        if len(heard) < chunk or np.sqrt(np.mean(piece**2)) < 0.02:
            continue
        xc = np.correlate(heard, piece, mode="valid")
        energy = np.sqrt(np.convolve(heard**2, np.ones(chunk), mode="valid"))
        norm = float(np.linalg.norm(piece))
        score = np.where(energy > 0.1 * norm, np.abs(xc) / np.maximum(energy, 1e-9) / norm, 0.0)
        at = int(np.argmax(score))
        scores.append(float(score[at]) if at > last else 0.0)  # out of order: not the message as left
        last = at
    return float(np.median(scores)) if scores else 0.0


def _record(tmp_path, call_id: str) -> dict:
    return json.loads((tmp_path / "rec" / f"{call_id.replace('@', '_')}.json").read_text())


async def test_a_voicemail_gets_the_message_after_the_beep_over_sip(tmp_path):
    message_pcm, _ = read_wav(str(ANSWERS / "hello.wav"))  # the message left after the tone: a repo wav
    async with callee(tmp_path, "greeting_beep.wav", talk_ms=30000, voicemail_wav=str(ANSWERS / "hello.wav")) as (
            ep, sessions, peer, sipp, uri):  # fmt: skip
        result = await ep.dial(uri, ring_timeout_s=20, detect=True)
        assert result.outcome == "answered", result
        got = await sipp  # SIPp got the agent's BYE (or hung up itself after 30 s: the gate never ended it)
        assert got.rc == 0, got.output + got.errors
        await wait_for(lambda: ep.finished and sessions and sessions[0].record is not None, timeout_s=60,
                       what="the call to finish and its record")  # fmt: skip
        call = next(iter(ep.finished.values()))
    gate = sessions[0].service.answer
    assert [v.verdict for v in gate.verdicts][:2] == ["voicemail", "beep"], gate.verdicts
    assert gate.outcome == "voicemail_left" and call.end_reason != "caller hung up (BYE)", call.end_reason
    beep = LABELS["greeting_beep.wav"]["beep_at_s"]
    beep_end = beep + LABELS["greeting_beep.wav"]["extra"]["beep_s"]
    # what reached the callee: silence while the greeting played, the message only once the beep was over
    first = peer.first_sound_s()
    assert first is not None and first > beep_end - 0.05, (first, beep_end)
    assert len(peer.audio) > beep_end / 0.02 * 0.8  # RTP flowed (held at silence) all through the greeting
    heard = peer.heard(beep)  # all that came after the beep began
    assert len(heard) >= len(message_pcm) * 0.9, (len(heard), len(message_pcm))
    score = _match(heard, message_pcm)
    assert score > 0.7, score  # the message itself, coded twice as mu-law: not the model's own audio
    print(f"voicemail over SIP: message reached the callee {first - beep_end:.2f} s after the beep ended, "
          f"verdict at {gate.verdicts[0].decided_at_s:.2f} s, beep found at {gate.verdicts[1].beep_at_s:.2f} s "
          f"(true {beep:.2f} s), message match {score:.2f}")
    record = _record(tmp_path, call.call_sid)
    answer = record["meta"]["answer"]
    assert answer["verdict"] in ("voicemail", "beep") and answer["outcome"] == "voicemail_left"
    assert abs(answer["beep_at_s"] - beep) < 0.25
    assert record["meta"]["outcome"] == "voicemail_left" and record["meta"]["direction"] == "outbound"
    assert record["meta"]["transport"] == "sip" and record["complete"] is True


async def test_a_person_answering_over_sip_ungates_the_agent(tmp_path):
    async with callee(tmp_path, "hello.wav", talk_ms=6000) as (ep, sessions, peer, sipp, uri):
        result = await ep.dial(uri, ring_timeout_s=20, detect=True)
        assert result.outcome == "answered", result
        got = await sipp  # SIPp hangs up after 6 s
        assert got.rc == 0, got.output + got.errors
        await wait_for(lambda: ep.finished and sessions and sessions[0].record is not None, timeout_s=60,
                       what="the call to finish and its record")  # fmt: skip
        call = next(iter(ep.finished.values()))
    gate = sessions[0].service.answer
    assert gate.verdict.verdict == "human" and not gate.gated and gate.outcome is None
    words_end = LABELS["hello.wav"]["speech_end_s"]
    assert words_end < gate.verdict.decided_at_s < words_end + 1.0, gate.verdict
    first = peer.first_sound_s()  # the agent talks: its audio reached the callee, and only after the verdict
    decided = gate.verdict.decided_at_s  # wall-clock margin on arrival: the figure is printed, not timed here
    assert first is not None and decided - 0.05 <= first < decided + 1.0, (first, gate.verdict)
    print(f"person over SIP: verdict {gate.verdict.decided_at_s - words_end:.2f} s after the end of hello, "
          f"the agent's audio at the callee {first - words_end:.2f} s after it")
    record = _record(tmp_path, call.call_sid)
    assert record["meta"]["answer"]["verdict"] == "human" and record["meta"]["direction"] == "outbound"
    assert call.end_reason == "caller hung up (BYE)"


async def test_a_phone_menu_gets_the_agents_digit_as_rfc4733_events(tmp_path):
    from duetaspan.testing.asr import ScriptedASR
    from duetaspan.tools.call_control import send_dtmf

    asr = ScriptedASR({"default": "Thank you for calling. For sales, press one."})
    async with asr, callee(tmp_path, "menu.wav", talk_ms=30000,
                           asr={"kind": "transcribe", "url": asr.transcribe_url}) as (ep, sessions, peer, sipp, uri):  # fmt: skip
        result = await ep.dial(uri, ring_timeout_s=20, detect=True)
        assert result.outcome == "answered", result
        await wait_for(lambda: sessions and sessions[0].service.answer is not None, what="the call's gate")
        gate = sessions[0].service.answer
        await wait_for(lambda: gate.verdict is not None and gate.verdict.verdict == "ivr", timeout_s=60,
                       what="the ivr verdict")  # fmt: skip
        context = sessions[0].context
        pressed = await send_dtmf(digits="1", ctx=context)  # the built-in tool, as the router calls it
        assert pressed["digits"] == "1"
        await wait_for(lambda: sum(end for *_, end in peer.events) >= 3, timeout_s=30, what="the digit's end")
        context.request_action("end_call", reason="menu done")
        got = await sipp  # SIPp answered our BYE
        assert got.rc == 0, got.output + got.errors
        await wait_for(lambda: sessions[0].record is not None, timeout_s=60, what="the record")
    assert [(v.verdict, v.source) for v in gate.verdicts][:2] == [("voicemail", "audio"), ("ivr", "asr")]
    assert gate.gated and "press one" in gate.verdict.reason  # still listening for a person
    assert asr.requests
    events = peer.events
    assert {digit for _, digit, _, _ in events} == {1}  # RFC 4733 event code 1
    assert [marker for _, _, marker, _ in events] == [True] + [False] * (len(events) - 1)
    progress = [at for at, _, _, end in events if not end]
    assert len(progress) >= 6 and progress[-1] - progress[0] >= 0.1, progress  # paced, not one burst
    assert sum(end for *_, end in events) == 3  # the end packet three times
    print(f"menu over SIP: ivr at {gate.verdict.decided_at_s:.2f} s; digit 1 as {len(events)} RFC 4733 packets "
          f"over {events[-1][0] - events[0][0]:.2f} s")
