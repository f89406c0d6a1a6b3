"""Phone menus navigated toward a call's goal, end to end (`agent.dial(..., goal="reach billing")`): the callee
plays the committed menu recording (`tests/fixtures/answers/menu.wav`), the agent's ASR is the scripted loopback
transcription server (it hears "For sales, press 1. For billing, press 2."), and the router's LLM is the
scripted loopback OpenAI-compatible chat server, which answers the navigator's question with a `send_dtmf` call
of "2". The request it got must carry the goal and the menu; the digit must reach the callee as the line
carries keys, while the agent stays gated (nothing it says is sent).

- Over SIP (SIPp as the callee's signalling, `callee_greets.xml`; `tests/adapters/sip/rtp_peer.py` as its media,
  as in `test_answer_sip.py`): the digit arrives as RFC 4733 events (code 2, the marker bit on the first packet
  only, progress packets paced in real time, the end packet three times). Then the callee's person says hello
  (`hello.wav`, played once the digit has arrived) and the gate opens: the agent's audio reaches the callee.
- Over the Twilio fake (a real WebSocket speaking Twilio's protocol, real mu-law, as in `test_answer_calls.py`):
  the digit arrives in the stream's audio as in-band DTMF tones, decoded as "2" at the callee with
  `test_dtmf_inband`'s FFT reader, and nothing else audible is sent while the call is gated."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Iterator

import numpy as np
import pytest
from scipy.signal import resample_poly

from duetaspan.adapters.sip.bridge import agent_call_handler
from duetaspan.adapters.twilio.audio import ulaw_to_int16
from duetaspan.agent import Agent
from duetaspan.config import AgentConfig
from duetaspan.model.engine import SamplingParams
from duetaspan.outbound import read_wav
from duetaspan.outbound.gate import RATE, AnswerGate
from duetaspan.outbound.verdicts import Verdict
from duetaspan.serving import twilio_dial_outcome
from duetaspan.testing.asr import ScriptedASR
from duetaspan.testing.llm import ScriptedLLM, content, tool_call
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
from tests.adapters.sip.rtp_peer import FRAME, SILENCE, RtpPeer, to_ulaw
from tests.adapters.twilio.peer import FakeTwilioRest, Received, serve_agent_on_twilio
from tests.adapters.twilio.test_dtmf_inband import read_keys
from tests.outbound.test_answer_calls import FROM, TO, callee_stream
from tests.outbound.test_answer_sip import ANSWERS, _record
from tests.outbound.test_detector import LABELS

pytestmark = pytest.mark.slow  # real-time calls: the menu alone is 8.7 s

GOAL = "reach billing"
MENU_TEXT = "For sales, press 1. For billing, press 2."
HELLO_TEXT = "Hello, Priya here."
LINE_NOISE = 10 ** (-44 / 20)  # the callee's line noise floor (as test_ivr_goal's), above each fixture's own
LOUD = 0.01  # RMS of a 20 ms frame that is not silence (as `RtpPeer.first_sound_s`)


def scripted_llm() -> ScriptedLLM:
    """The router's LLM: the navigator's question about the billing menu (its GOAL and MENU lines) gets
    `send_dtmf("2")`; anything else (a person's words; nothing else is expected, the model's own <ret> is off) an
    answer that calls no tool, as the navigator's rules ask."""
    return ScriptedLLM({"rules": [{"match": ["GOAL:", "MENU:", "billing, press 2"],
                                   "reply": tool_call("send_dtmf", digits="2")}],
                        "default": content("WAIT")})  # fmt: skip


def navigating_agent(tmp_path, llm_url: str, asr_url: str) -> Agent:
    """A tiny-random agent whose router's LLM and ASR are the scripted servers; detection off by default
    (`agent.dial(goal=...)` turns it on for the call), the model's own retrieval requests off."""
    config = AgentConfig.from_dict({"outbound": {"detect": False}, "asr": {"kind": "transcribe", "url": asr_url}},
                                   base_dir=tmp_path)  # fmt: skip
    return Agent(model="tiny-random", device="cpu", router={"base_url": llm_url, "model": "scripted", "api_key_env": None},
                 sampling=SamplingParams(allow_ret=False), record_dir=tmp_path / "rec", seed=0, max_calls=1,
                 config=config)  # fmt: skip


def menu_end_s() -> float:
    """Where the menu recording's last word ends (its last sample above 0.05 full scale), in seconds."""
    pcm, rate = read_wav(str(ANSWERS / "menu.wav"))
    return float(np.flatnonzero(np.abs(pcm) > 0.05)[-1]) / rate


def assert_asked_about_the_menu(llm: ScriptedLLM) -> None:
    """The navigator asked once about the menu (its user message: the GOAL and MENU lines), with the goal and
    the transcribed menu, offering send_dtmf alone."""
    asked = [r for r, q in zip(llm.requests, llm.questions, strict=True) if q.startswith("GOAL:") and MENU_TEXT in q]
    assert len(asked) == 1, llm.questions
    question = asked[0]["messages"][-1]["content"]
    assert f'GOAL: "{GOAL}"' in question and f'MENU: "{MENU_TEXT}"' in question, question
    assert [t["function"]["name"] for t in asked[0]["tools"]] == ["send_dtmf"]


# --- SIP ------------------------------------------------------------------------------------------------------
def on_the_line(pcm: np.ndarray, seed: int) -> bytes:
    """`pcm` as the callee's line carries it, as mu-law: on the line's own noise floor, one floor under every
    recording as one call's line has (above each fixture's own). Without it the menu's tail is digital silence
    and the hello follows it on a floor of its own (the case `test_detector.py`'s digital-silence test covers);
    here the menu's navigation is under test, on one line."""
    return to_ulaw(pcm + np.random.default_rng(seed).normal(0.0, LINE_NOISE, len(pcm)).astype(np.float32))


def play_after(peer: RtpPeer, line: bytearray, pcm: np.ndarray, *, after: int, lead_s: float = 0.1) -> float:
    """Have the RTP peer, which is playing `line`, play `pcm` next: over the line's quiet from `lead_s` from now
    on (its clock), and not before byte `after` (the end of what it played first). Returns when `pcm` starts,
    in the peer's time (0: its first packet)."""
    assert peer.t0 is not None
    at = max(after, int(np.ceil((asyncio.get_running_loop().time() - peer.t0 + lead_s) / 0.02)) * FRAME)
    line[at : at + len(pcm)] = on_the_line(pcm, seed=2)
    return at / FRAME * 0.02


class GateWatch:
    """What the gate heard and did, for a failure to explain itself: every restart of its detector (call time,
    the gate's state then, the old detector's verdict and floor) and, per chunk of the caller's audio, the call
    time, its level, the detector's floor after it and whether a sound is open (`*`)."""

    def __init__(self, gate) -> None:
        self.gate = gate
        self.restarts: list[tuple] = []
        self.track: list[tuple] = []
        hear, fresh = gate.hear, gate._fresh_detector

        def watched_hear(pcm: np.ndarray) -> None:
            hear(pcm)
            d = gate.detector
            level = 10 * np.log10(float(np.mean(np.square(pcm, dtype=np.float64))) + 1e-12) if len(pcm) else -120.0
            self.track.append((gate._offset + d.t, level, d._floor_db, d._seg_start is not None))

        def watched_fresh(at: float) -> None:
            d = gate.detector
            self.restarts.append((round(gate.t, 2), round(at, 2), gate._state, d.verdict and d.verdict.verdict,
                                  None if d._floor_db is None else round(d._floor_db, 1)))
            fresh(at)

        gate.hear, gate._fresh_detector = watched_hear, watched_fresh

    def heard(self, start: float, end: float) -> str:
        """The track from `start` to `end` (call time): `t:level/floor`, `*` while a sound is open."""
        return " ".join(f"{t:.2f}:{lvl:.0f}/{'-' if fl is None else f'{fl:.0f}'}{'*' if open_ else ''}"
                        for t, lvl, fl, open_ in self.track if start <= t <= end)

    def explain(self, since: float) -> str:
        """The gate's state, its verdicts and detector, its restarts, and what it heard from the restart before
        `since` (call time) for 4 s, and in the last 2 s."""
        g, d = self.gate, self.gate.detector
        before = [at for _, at, *_ in self.restarts if at <= since]
        start, now = (before[-1] if before else since) - 0.1, (self.track[-1][0] if self.track else 0.0)
        return (f"gate: state={g._state!r} gated={g.gated} t={g.t:.2f} offset={g._offset:.2f} "
                f"relisten_at={g._relisten_at} menu_mark={g._menu_mark:.2f} menu_done={g._menu_done:.2f} "
                f"asking={g._asking} outcome={g.outcome}\nverdicts={[v.as_json() for v in g.verdicts]}\n"
                f"detector: t={d.t:.2f} verdict={d.verdict} floor_db={d._floor_db} seg_start={d._seg_start} "
                f"utterances={d.utterances}\n"
                f"detector restarts (gate t, at, state, old verdict, old floor)={self.restarts}\n"
                f"heard from {start:.2f} s: {self.heard(start, start + 4.0)}\nheard last: {self.heard(now - 2.0, now)}")


@contextlib.asynccontextmanager
async def sip_menu_callee(tmp_path, agent: Agent, line: bytearray):
    """`agent` serving SIP on a loopback endpoint (`agent.sip_endpoint`, as `serve(sip=True)` sets it), SIPp
    answering on a port of its own (`callee_greets.xml`, up to 60 s for the agent's BYE), the RTP peer playing
    `line` from the answer on; yields (endpoint, agent's sessions, peer, SIPp's task, SIPp's URI)."""
    sessions = capture_sessions(agent)
    peer = RtpPeer()
    inner = agent_call_handler(agent)

    async def answered(call) -> None:
        peer.start(("127.0.0.1", call.media.port), line)  # a bytearray: `play_after` writes into it mid-call
        await inner(call)

    port = free_udp_port()
    path = scenario("callee_greets", tmp_path, MEDIA_PORT=peer.port, TALK_MS=60000)
    try:
        async with agent, endpoint_on_loopback(answered, max_calls=1) as ep:
            agent.sip_endpoint = ep
            sipp = asyncio.create_task(run_sipp("", tmp_path, "-sf", str(path), "-m", "1", port=port,
                                                timeout_s=120, name="callee"))  # fmt: skip
            bound = asyncio.ensure_future(udp_bound(port))
            await asyncio.wait([sipp, bound], return_when=asyncio.FIRST_COMPLETED)
            if sipp.done():  # SIPp gave up before listening: say why
                bound.cancel()
                got = sipp.result()
                raise AssertionError(f"SIPp exited {got.rc} before answering: {got.errors[-800:]}{got.output[-800:]}")
            await bound
            yield ep, sessions, peer, sipp, f"sip:+15551234567@127.0.0.1:{port}"
    finally:
        await peer.aclose()


@needs_sipp
@sip_e2e
async def test_a_menu_over_sip_is_navigated_to_billing_by_an_rfc4733_digit(tmp_path):
    menu, _ = read_wav(str(ANSWERS / "menu.wav"))
    hello, _ = read_wav(str(ANSWERS / "hello.wav"))
    llm, asr = scripted_llm(), ScriptedASR({"default": MENU_TEXT})
    line = bytearray(on_the_line(np.concatenate([menu, np.zeros(90 * 8000, np.float32)]), seed=1))  # then quiet
    async with llm as llm_url, asr:
        agent = navigating_agent(tmp_path, llm_url, asr.transcribe_url)
        async with sip_menu_callee(tmp_path, agent, line) as (ep, sessions, peer, sipp, uri):
            result = await agent.dial(uri, ring_timeout_s=20, goal=GOAL)
            assert result.outcome == "answered", result
            await wait_for(lambda: sessions and sessions[0].service.answer is not None, timeout_s=60,
                           what="the call's gate")  # fmt: skip
            gate = sessions[0].service.answer
            watch = GateWatch(gate)
            await wait_for(lambda: sum(end for *_, end in peer.events) >= 3, timeout_s=90,
                           what="the navigator's digit (its RFC 4733 end packets)")  # fmt: skip
            assert gate.gated and gate._state == "ivr", watch.explain(gate.t)  # still waiting for a person
            assert peer.first_sound_s() is None  # nothing audible from the agent while gated
            events = list(peer.events)
            asr.hears(HELLO_TEXT)
            hello_at = play_after(peer, line, hello, after=len(menu))  # the billing department's person picks up
            try:
                await wait_for(lambda: not gate.gated, timeout_s=60, what="the gate to open for the person")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; the hello at {hello_at:.2f} s (the peer's time)\n"
                                     f"{watch.explain(hello_at)}\n"
                                     f"ASR requests={[(r['seconds'], r['sample_rate']) for r in asr.requests]}") from None
            await wait_for(lambda: peer.first_sound_s() is not None, timeout_s=30, what="the agent's audio")
            sessions[0].context.request_action("end_call", reason="reached billing")
            got = await sipp  # SIPp answered our BYE
            assert got.rc == 0, got.output + got.errors
            # the session writes its record, then the endpoint counts the call finished: wait for both
            await wait_for(lambda: sessions[0].record is not None and ep.finished, timeout_s=60,
                           what="the record and the call's end")  # fmt: skip
            call_sid = next(iter(ep.finished.values())).call_sid
    # a menu (by the audio, or the transcript's "press 1"), then the person: the gate's course stays `ivr`
    assert gate.verdict.verdict == "ivr" and gate.verdicts[-1].verdict == "human", gate.verdicts
    assert_asked_about_the_menu(llm)
    # the gate transcribed the whole menu (at the pipeline's rate; the router's capture sends 16 kHz turns)
    assert any(r["seconds"] > menu_end_s() for r in asr.requests if r["sample_rate"] == RATE), asr.requests
    (decision,) = gate.navigator.decisions
    assert decision.allowed and decision.digits == "2" and decision.how == "goal" and decision.menu == MENU_TEXT
    # the digit: event code 2, the marker bit on the first packet only, paced in real time, then three ends
    assert {digit for _, digit, _, _ in events} == {2}, events
    assert [marker for _, _, marker, _ in events] == [True] + [False] * (len(events) - 1)
    progress = [at for at, _, _, end in events if not end]
    assert len(progress) >= 6 and progress[-1] - progress[0] >= 0.02 * (len(progress) - 1) - 0.02, progress
    assert [end for *_, end in events] == [False] * len(progress) + [True] * 3
    # gated all through the menu and the digit: the agent's first audible packet came after the person's hello
    first = peer.first_sound_s()
    assert first is not None and first > hello_at, (first, hello_at)
    words_end = menu_end_s()
    assert events[0][0] > words_end, (events[0][0], words_end)  # pressed once the menu was over, not mid-menu
    print(f"menu over SIP: the menu's last word at {words_end:.2f} s; the navigator decided at "
          f"{decision.at_s:.2f} s (call time), digit 2's first RFC 4733 packet reached the callee at "
          f"{events[0][0]:.2f} s ({events[0][0] - words_end:.2f} s after the menu), {len(events)} packets over "
          f"{events[-1][0] - events[0][0]:.2f} s; hello at {hello_at:.2f} s, gate open at {gate.ungated_at:.2f} s, "
          f"the agent's audio at the callee at {first:.2f} s; the person's verdict: {gate.verdicts[-1].reason}")
    record = _record(tmp_path, call_sid)
    ivr = record["meta"]["answer"]["ivr"]
    assert ivr["goal"] == GOAL and ivr["presses"] == 1 and ivr["decisions"][0]["digits"] == "2", ivr
    assert record["meta"]["direction"] == "outbound" and record["meta"]["transport"] == "sip"


def test_a_concealed_frame_as_the_gate_listens_afresh_does_not_hide_the_person():
    """Waiting in `ivr`, the gate listens afresh after each `silence` (3.5 s of quiet). Under load the RTP
    playout conceals late packets with digital silence; a detector new to the line took such a frame, among its
    first ones, for the line's floor, and the line's own noise for speech for up to 1.7 s: a hello within it ran on
    into the noise, a 2.3 s sound (`voicemail`: the menu again, the person never heard; the SIP test's flake),
    or the noise alone was a person. Listening afresh keeps the line's floor: the hello is the person."""
    hello, _ = read_wav(str(ANSWERS / "hello.wav"))
    for zeros in (1, 2, 3):
        for lead_s in (0.0, 0.6, 1.0):
            rng = np.random.default_rng(zeros)

            def line(pcm: np.ndarray, rng=rng) -> np.ndarray:  # 8 kHz on the line's noise, at the gate's rate
                return resample_poly(pcm + rng.normal(0, LINE_NOISE, len(pcm)), 3, 1).astype(np.float32)

            gate = AnswerGate()
            gate._heard(Verdict("ivr", 0.9, 0.0, source="asr"))  # a menu (the transcript): wait for a person
            heard = np.concatenate([line(np.zeros(int(3.5 * 8000))), np.zeros(480 * zeros, np.float32),
                                    line(np.zeros(int(lead_s * 8000))), line(hello), line(np.zeros(3 * 8000))])  # fmt: skip
            for i in range(0, len(heard), 480):  # 20 ms at a time, as the line brings it
                gate.hear(heard[i : i + 480])
            words_end = 3.5 + zeros * 0.02 + lead_s + LABELS["hello.wav"]["speech_end_s"]
            person = [v for v in gate.verdicts if v.verdict != "ivr"]
            assert not gate.gated and [v.verdict for v in person] == ["human"], (zeros, lead_s, gate.verdicts)
            assert words_end < person[0].decided_at_s < words_end + 1.0, (zeros, lead_s, person[0])


# --- Twilio ---------------------------------------------------------------------------------------------------
def _rms(payload: bytes) -> float:
    pcm = ulaw_to_int16(payload).astype(np.float32) / 32768
    return float(np.sqrt(np.mean(pcm**2))) if len(pcm) else 0.0


def menu_then_quiet(messages: list[dict], got: Received, after_s: float = 1.0, most_s: float = 90.0) -> Iterator[dict]:
    """The callee's stream: the menu's messages (without their `stop`), then the line's silence until the
    agent's audio has carried something audible and `after_s` of quiet followed it (or `most_s` passed), then
    `stop`. A generator that `TwilioPeer.play` paces: before each frame it looks at what arrived (`got`)."""
    *head, stop = messages
    last = head[-1]
    yield from head
    chunk, stamp = int(last["media"]["chunk"]), int(last["media"]["timestamp"])
    quiet = base64.b64encode(bytes([SILENCE]) * FRAME).decode()
    seen, loud_at = 0, None
    for n in range(1, int(most_s / 0.02)):
        media = got.of("media")
        if any(_rms(base64.b64decode(m["media"]["payload"])) > LOUD for m in media[seen:]):
            loud_at = n
        seen = len(media)
        if loud_at is not None and n - loud_at >= after_s / 0.02:
            break
        yield {**last, "media": {**last["media"], "chunk": str(chunk + n), "timestamp": str(stamp + 20 * n),
                                 "payload": quiet}}  # fmt: skip
    yield stop


async def test_a_menu_over_twilio_is_navigated_to_billing_by_in_band_tones(tmp_path):
    llm, asr = scripted_llm(), ScriptedASR({"default": MENU_TEXT})
    played: dict = {}
    box: list = []
    got = Received()

    async def callee(sid: str, form: dict) -> None:
        url, messages = callee_stream("menu.wav", 0.5, sid, form)
        async with box[0].open_stream(url) as ws:
            played["t0"] = time.monotonic()  # the callee's stream time 0
            played["got"] = await box[0].play(ws, menu_then_quiet(messages, got), got=got)

    fake = FakeTwilioRest(on_create=callee)
    async with llm as llm_url, asr:
        agent = navigating_agent(tmp_path, llm_url, asr.transcribe_url)
        sessions = capture_sessions(agent)
        async with fake.running() as rest_url, agent, serve_agent_on_twilio(agent, rest_url) as (peer, service):
            box.append(peer)
            agent.twilio_service = service
            service.dialer.on_dial = twilio_dial_outcome(agent, None)
            result = await agent.dial(TO, caller=FROM, ring_timeout_s=20, goal=GOAL)
            assert result.outcome == "answered", result
            await wait_for(lambda: "got" in played and sessions and sessions[0].record is not None, timeout_s=150,
                           what="the callee's stream to end and the call's record")  # fmt: skip
    gate = sessions[0].service.answer
    assert gate.verdict is not None and gate.verdict.verdict == "ivr", gate.verdicts
    assert gate.gated and gate.outcome is None  # gated all through: no person answered
    assert_asked_about_the_menu(llm)
    (decision,) = gate.navigator.decisions
    assert decision.allowed and decision.digits == "2" and decision.how == "goal"
    frames = got.media_bytes()
    audio = ulaw_to_int16(b"".join(frames)).astype(np.float32) / 32768
    assert read_keys(audio) == "2", read_keys(audio)  # the key, in band
    # nothing else audible while gated: the loud frames are one run the length of a key's tone (160 ms)
    loud = [i for i, f in enumerate(frames) if _rms(f) > LOUD]
    assert loud and loud == list(range(loud[0], loud[-1] + 1)) and 7 <= len(loud) <= 10, loud
    tones = ulaw_to_int16(b"".join(frames[loud[0] : loud[-1] + 1])).astype(np.float32) / 32768
    assert read_keys(tones) == "2"
    arrived = got.media_times()[loud[0]] - played["t0"]
    words_end = menu_end_s()
    assert arrived > words_end, (arrived, words_end)
    print(f"menu over Twilio: the menu's last word at {words_end:.2f} s; the navigator decided at "
          f"{decision.at_s:.2f} s (call time), digit 2's tones reached the callee at {arrived:.2f} s "
          f"({arrived - words_end:.2f} s after the menu), {len(loud)} audible frames, all of them the key")
    record = _record(tmp_path, result.call_id)
    assert record["meta"]["answer"]["ivr"]["decisions"][0]["digits"] == "2"
