"""The router's LLM as the answer gate's second opinion (`[outbound] second_opinion = "llm"`,
`duetaspan.outbound.judge`): the gate is built by the agent's own wiring (`attach_answer_gate`) from a real
`AgentConfig`, hears the committed fixtures in 20 ms chunks, a scripted transcript source is its ASR, and the
router's LLM is the loopback scripted chat server behind the real `ChatClient`. In-process, no server."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from duetaspan.adapters.llm import ChatClient
from duetaspan.agent.answer import attach_answer_gate, load_message
from duetaspan.config import AgentConfig
from duetaspan.errors import ConfigError
from duetaspan.outbound.gate import RATE
from duetaspan.outbound.judge import TOOL, AnswerJudge
from duetaspan.outbound.phrases import phrase_verdict
from duetaspan.outbound.verdicts import Verdict
from duetaspan.testing.llm import ScriptedLLM, content, error, hang, tool_call
from tests.outbound.test_ivr_goal import Result, Tick
from tests.support import REPO_ROOT

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "answers"
CHUNK = RATE // 50  # 20 ms
LINE_NOISE = 10 ** (-44 / 20)
DANA = "Hi, Dana's phone, I'm out, talk soon"  # a greeting in words no phrase rule knows


class ScriptedASR:
    """The agent's ASR: always `text`."""

    def __init__(self, text: str) -> None:
        self.text, self.calls = text, 0

    async def transcribe(self, pcm: np.ndarray, rate: int) -> str:
        self.calls += 1
        return self.text


class Call:
    """One detected call as the agent wires it: `attach_answer_gate` on a service whose taps and filters are
    driven here; what the gate spawns is awaited before the next chunk."""

    def __init__(self, text: str, llm: Any, toml: str) -> None:
        config = AgentConfig.from_toml(toml)
        self.asr = ScriptedASR(text)
        router = SimpleNamespace(llm=llm, mode=config.router.mode)
        agent = SimpleNamespace(config=config, shared={"asr": self.asr, "router": router})
        self.tasks: list[asyncio.Future[Any]] = []
        self.ended: list[str] = []

        async def on_answer(name: str, verdict: Any) -> None:
            return None

        self.service = SimpleNamespace(caller_taps=[], tick_filters=[], agent_held=None, slot=None, answer=None,
                                       spawn=lambda aw: self.tasks.append(asyncio.ensure_future(aw)),
                                       call_handler=on_answer)  # fmt: skip
        self.context = SimpleNamespace(request_action=lambda kind, **kw: self.ended.append(kw.get("reason", "")))
        self.gate = attach_answer_gate(agent, SimpleNamespace(params={"answer_detect": "1"}), self.service,
                                       self.context, None)  # fmt: skip
        assert self.gate is not None
        self.t = 0.0
        self.noise = np.random.default_rng(33)
        self.passed: list[bool] = []  # per tick: whether the agent's own audio went through

    async def play(self, pcm: np.ndarray) -> None:
        pcm = (pcm + self.noise.normal(0.0, LINE_NOISE, len(pcm))).astype(np.float32)
        for i in range(0, len(pcm), CHUNK):
            chunk = pcm[i : i + CHUNK]
            self.service.caller_taps[0](chunk)
            out = self.service.tick_filters[0](Tick(self.t, chunk, Result(np.full(len(chunk), 0.1, np.float32))))
            self.passed.append(bool(np.any(out.result.pcm == np.float32(0.1))))
            self.t += len(chunk) / RATE
            await self.settle()

    async def settle(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while pending := [t for t in self.tasks if not t.done()]:
            assert loop.time() < deadline, pending
            await asyncio.wait(pending, timeout=0.2)


def fixture(name: str, quiet_s: float = 1.0) -> np.ndarray:
    pcm = load_message(FIXTURES / name)
    tail = pcm[-RATE // 2 :]
    return np.concatenate([pcm, np.tile(tail, int(np.ceil(quiet_s * 2)))[: int(quiet_s * RATE)]])


LLM = '[outbound]\nsecond_opinion = "llm"\nsecond_opinion_timeout_s = 0.8\n'


def client(url: str) -> ChatClient:
    return ChatClient(url, "scripted", api_key="k", timeout_s=10)


ASSISTANT = "Hi, this is Dana's assistant, tell me what it's about and I'll see if she can pick up"


@pytest.mark.parametrize(
    ("wav", "text", "says", "audio"),
    [("hello.wav", DANA, "voicemail", "human"), ("greeting_beep.wav", ASSISTANT, "screening", "voicemail")],
)
async def test_the_llm_overturns_or_refines_the_audio_when_no_phrase_matched(wav, text, says, audio):
    assert phrase_verdict(text) is None  # the phrase rules alone would keep the audio's verdict
    server = ScriptedLLM(default=tool_call(TOOL, answered_by=says))
    async with server.serve() as url:
        llm = client(url)
        call = Call(text, llm, LLM)
        await call.play(fixture(wav))
        await llm.aclose()
    gate = call.gate
    assert [v.verdict for v in gate.verdicts][:2] == [audio, says], gate.verdicts
    assert gate.verdict is not None and gate.verdict.verdict == says and gate.verdict.source == "llm"
    how = "overturns" if audio == "human" else "refines"
    assert gate.verdict.transcript == text and f"{how} the audio's {audio}" in gate.verdict.reason, gate.verdict
    assert gate.gated and call.service.agent_held is True  # a machine: the agent is held again
    assert len(server.requests) == 1, server.requests
    request = server.requests[0]
    user = request["messages"][-1]["content"]
    assert text in user and f"AUDIO CLASSIFIER: {audio}" in user, user
    (tool,) = request["tools"]
    assert tool["function"]["name"] == TOOL
    assert tool["function"]["parameters"]["properties"]["answered_by"]["enum"] == [
        "human", "voicemail", "ivr", "screening", "unknown"]  # fmt: skip
    assert gate.summary()["source"] == "llm"


@pytest.mark.parametrize("toml", ["", '[outbound]\nsecond_opinion = "phrases"\n'])
async def test_with_phrases_the_llm_is_never_asked(toml):
    server = ScriptedLLM(default=tool_call(TOOL, answered_by="voicemail"))
    async with server.serve() as url:
        llm = client(url)
        call = Call(DANA, llm, toml)
        assert call.gate.judge is None
        await call.play(fixture("hello.wav"))
        await llm.aclose()
    assert server.requests == [] and call.asr.calls == 1  # transcribed for the phrases, never sent to the LLM
    assert call.gate.verdict is not None and call.gate.verdict.verdict == "human" and not call.gate.gated


async def test_a_phrase_match_never_asks_the_llm():
    server = ScriptedLLM(default=tool_call(TOOL, answered_by="human"))
    async with server.serve() as url:
        llm = client(url)
        call = Call("This is Dana. Leave a message.", llm, LLM)
        await call.play(fixture("hello.wav"))
        await llm.aclose()
    assert server.requests == []
    v = call.gate.verdict
    assert v is not None and v.verdict == "voicemail" and v.source == "asr" and call.gate.gated, call.gate.verdicts


@pytest.mark.parametrize(
    "reply",
    [error(500), hang(), content("It is probably a voicemail."), tool_call(TOOL, answered_by="robot"),
     tool_call("send_dtmf", digits="1")],
    ids=["http-500", "hang", "prose", "not-in-enum", "other-tool"],
)  # fmt: skip
async def test_a_failing_or_garbled_llm_leaves_the_audio_verdict_and_the_call_goes_on(reply, caplog):
    server = ScriptedLLM(default=reply)
    caplog.set_level(logging.WARNING, "duetaspan.outbound")
    async with server.serve() as url:
        llm = client(url)
        call = Call(DANA, llm, LLM)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await call.play(fixture("hello.wav"))
        took = loop.time() - t0
        await llm.aclose()
    gate = call.gate
    assert len(server.requests) == 1
    assert [v.verdict for v in gate.verdicts] == ["human"] and gate.verdict is gate.verdicts[0], gate.verdicts
    assert not gate.gated and gate._state == "open" and call.ended == [] and gate.outcome is None
    assert call.passed[-1] and call.service.agent_held is False  # the agent speaks: the call goes on
    warnings = [r.getMessage() for r in caplog.records if "second opinion" in r.getMessage()
                or "outside the format" in r.getMessage()]  # fmt: skip
    assert len(warnings) == 1 and "keeping human" in warnings[0], warnings
    if reply.get("hang"):
        assert "within 0.8 s" in warnings[0] and took < 30, took


def test_the_second_opinion_setting_is_validated():
    assert AgentConfig.from_toml("").outbound.second_opinion == "phrases"
    assert AgentConfig.from_toml(LLM).outbound.second_opinion == "llm"
    with pytest.raises(ConfigError, match=r"outbound\.second_opinion: .*'phrases' or 'llm'"):
        AgentConfig.from_toml('[outbound]\nsecond_opinion = "LLM "\n')
    with pytest.raises(ConfigError, match=r"outbound\.second_opinion_timeout_s"):
        AgentConfig.from_toml("[outbound]\nsecond_opinion_timeout_s = 0\n")


def test_json_mode_asks_for_the_object_and_parses_it_strictly():
    judge = AnswerJudge(llm=None, mode="json")
    system = judge.messages(Verdict("human", 0.7, 1.9), DANA)[0]["content"]
    assert '{"answered_by"' in system and TOOL not in system
    assert judge.parse('```json\n{"answered_by": "ivr"}\n```') == "ivr"
    for bad in ('{"answered_by": "Voicemail"}', '["voicemail"]', "voicemail", '{"who": "voicemail"}'):
        assert judge.parse(bad) is None, bad
