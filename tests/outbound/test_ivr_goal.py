"""Phone menus navigated toward a call's goal (`duetaspan.outbound.ivr`, `AnswerGate(navigator=...)`): the gate
hears the committed menu fixture in 20 ms chunks, a scripted transcript source is its ASR, the router's LLM is
the loopback scripted chat server behind the real `ChatClient`, and the keys go through the built-in
`send_dtmf` tool to a `CallContext` whose actions are the fake DTMF sink (what the SIP and Twilio adapters
act on). In-process, no server."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from duetaspan.adapters.llm import ChatClient
from duetaspan.adapters.sip.admin import parse_dial_request
from duetaspan.agent.answer import load_message, menu_navigator
from duetaspan.agent.dialing import place_call
from duetaspan.outbound.gate import RATE, AnswerGate
from duetaspan.outbound.ivr import MenuNavigator, dtmf_press
from duetaspan.registry import CallContext
from duetaspan.router.policy import SideEffectPolicy
from duetaspan.testing.llm import content, error, tool_call
from tests.fakes.llm_server import ScriptedLLMServer
from tests.support import REPO_ROOT

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "answers"
MENU_TEXT = "Thank you for calling. For billing, press one. For sales, press two."
CHUNK = RATE // 50  # 20 ms
LINE_NOISE = 10 ** (-44 / 20)  # the line's noise floor, above each fixture's own


@dataclass
class Result:
    pcm: np.ndarray
    silent: bool = False
    text: str = "agent words"


@dataclass
class Tick:
    t: float
    caller_pcm: np.ndarray
    result: Result


@dataclass
class ScriptedASR:
    """The transcript source: `texts` in order (the last one repeats); `hold` makes a transcription wait."""

    texts: list[str]
    heard_s: list[float] = field(default_factory=list)

    async def transcribe(self, pcm: np.ndarray, rate: int) -> str:
        self.heard_s.append(len(pcm) / rate)
        return self.texts[min(len(self.heard_s) - 1, len(self.texts) - 1)]


class Line:
    """The gate's call: audio pushed as it would arrive, spawned tasks awaited before the next chunk."""

    def __init__(self, asr: ScriptedASR, llm: Any, *, goal: str = "reach billing", max_presses: int = 6,
                 ivr_wait_s: float = 60.0) -> None:  # fmt: skip
        self.actions: list[Any] = []
        self.ended: list[tuple[str, str]] = []
        self.tasks: list[asyncio.Future[Any]] = []
        self.held: set[Any] = set()
        self.context = CallContext(on_action=self.actions.append)
        self.nav = MenuNavigator(goal, llm, dtmf_press(self.context), max_presses=max_presses)
        self.gate = AnswerGate(timeout_s=30.0, ivr_wait_s=ivr_wait_s, transcribe=asr.transcribe,
                               end=lambda reason, outcome: self.ended.append((outcome, reason)),
                               spawn=lambda aw: self.tasks.append(asyncio.ensure_future(aw)),
                               navigator=self.nav)  # fmt: skip
        self.t = 0.0
        self.noise = np.random.default_rng(33)

    async def play(self, pcm: np.ndarray, *, settle: bool = True) -> None:
        """`pcm` on the line's own noise (one floor for every fixture, as one call's line has)."""
        pcm = (pcm + self.noise.normal(0.0, LINE_NOISE, len(pcm))).astype(np.float32)
        for i in range(0, len(pcm), CHUNK):
            chunk = pcm[i : i + CHUNK]
            self.gate.hear(chunk)
            self.gate.tick(Tick(self.t, chunk, Result(np.full(len(chunk), 0.1, np.float32))))
            self.t += len(chunk) / RATE
            if settle:
                await self.settle()

    async def settle(self) -> None:
        """Wait for what the gate spawned (the ASR, the LLM, the press), but not for tasks in `held`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while pending := [t for t in self.tasks if not t.done() and t not in self.held]:
            assert loop.time() < deadline, pending
            await asyncio.wait(pending, timeout=0.2)

    def dtmf(self) -> list[str | None]:
        return [a.target for a in self.actions if a.kind == "send_dtmf"]


def fixture(name: str, quiet_s: float) -> np.ndarray:
    """A committed recording and `quiet_s` more of its own line noise (its last half second, repeated)."""
    pcm = load_message(FIXTURES / name)
    tail = pcm[-RATE // 2 :]
    return np.concatenate([pcm, np.tile(tail, int(np.ceil(quiet_s * 2)))[: int(quiet_s * RATE)]])


def menu() -> np.ndarray:
    return fixture("menu.wav", 0.5)


def client(url: str) -> ChatClient:
    return ChatClient(url, "scripted", api_key="k", timeout_s=10)


async def test_the_goal_and_the_menu_reach_the_llm_and_its_digit_reaches_the_line():
    server = ScriptedLLMServer(default=tool_call("send_dtmf", digits="1"))
    async with server.serve() as url:
        llm = client(url)
        line = Line(ScriptedASR([MENU_TEXT]), llm)
        await line.play(menu())
        await llm.aclose()
    gate = line.gate
    assert gate.verdict is not None and gate.verdict.verdict == "ivr" and gate.gated, gate.verdicts
    assert len(server.requests) == 1, server.requests
    request = server.requests[0]
    user = request["messages"][-1]["content"]
    assert '"reach billing"' in user and "For billing, press one" in user, user
    assert [t["function"]["name"] for t in request["tools"]] == ["send_dtmf"]
    assert line.dtmf() == ["1"]  # through the send_dtmf tool, as the adapters receive it
    (decision,) = gate.summary()["ivr"]["decisions"]
    assert decision["allowed"] and decision["how"] == "goal" and "'reach billing'" in decision["reason"]
    assert decision["digits"] == "1" and "press one" in decision["menu"]
    assert gate.outcome is None and gate._state == "ivr"  # still gated, listening for the next menu or a person


async def test_a_press_decided_after_a_person_answered_is_refused_and_the_person_keeps_the_line():
    """The policy reads the gate's state when the LLM answers: a person who picked up meanwhile un-gates the
    call, and the keys chosen for the menu are not pressed into their ear."""
    server = ScriptedLLMServer(default=tool_call("send_dtmf", digits="1"))
    async with server.serve() as url:
        inner, go = client(url), asyncio.Event()

        class HeldLLM:
            async def complete(self, *args: Any, **kwargs: Any) -> Any:
                line.held.add(asyncio.current_task())  # the menu is being decided on; the audio goes on
                await go.wait()
                return await inner.complete(*args, **kwargs)

        line = Line(ScriptedASR([MENU_TEXT]), HeldLLM())
        await line.play(menu())
        assert line.gate._asking, "the navigator did not ask about the menu"
        await line.play(fixture("hello.wav", 1.0))
        assert not line.gate.gated and line.gate._state == "open", line.gate.verdicts  # a person: un-gated as before
        go.set()
        line.held.clear()
        await line.settle()
        await inner.aclose()
    assert len(server.requests) == 1 and line.dtmf() == []
    (decision,) = line.nav.decisions
    assert not decision.allowed and "'open'" in decision.reason, decision


async def test_a_tool_other_than_send_dtmf_is_refused_and_nothing_happens():
    server = ScriptedLLMServer(default=tool_call("end_call", reason="menu"))
    async with server.serve() as url:
        llm = client(url)
        line = Line(ScriptedASR([MENU_TEXT]), llm)
        await line.play(menu())
        await llm.aclose()
    assert line.actions == [] and line.ended == [] and line.gate.gated
    (decision,) = line.nav.decisions
    assert not decision.allowed and decision.tool == "end_call" and "only send_dtmf" in decision.reason


def test_the_goal_press_path_allows_only_send_dtmf_keys_in_ivr_with_a_goal():
    policy = SideEffectPolicy()
    ok = policy.check_goal("send_dtmf", {"digits": "1"}, state="ivr", goal="reach billing")
    assert ok.allowed and ok.how == "goal" and "'reach billing'" in ok.reason
    assert policy.check_goal("send_dtmf", {"digits": "12#*"}, state="ivr", goal="reach billing").allowed
    refused = {
        "no goal": policy.check_goal("send_dtmf", {"digits": "1"}, state="ivr", goal=None),
        "empty goal": policy.check_goal("send_dtmf", {"digits": "1"}, state="ivr", goal="  "),
        "not ivr": policy.check_goal("send_dtmf", {"digits": "1"}, state="voicemail", goal="reach billing"),
        "open": policy.check_goal("send_dtmf", {"digits": "1"}, state="open", goal="reach billing"),
        "other tool": policy.check_goal("end_call", {"digits": "1"}, state="ivr", goal="reach billing"),
        "letters": policy.check_goal("send_dtmf", {"digits": "1A"}, state="ivr", goal="reach billing"),
        "words": policy.check_goal("send_dtmf", {"digits": "one"}, state="ivr", goal="reach billing"),
        "nothing": policy.check_goal("send_dtmf", {"digits": ""}, state="ivr", goal="reach billing"),
        "too many": policy.check_goal("send_dtmf", {"digits": "1" * 17}, state="ivr", goal="reach billing"),
        "extra argument": policy.check_goal("send_dtmf", {"digits": "1", "to": "x"}, state="ivr", goal="reach"),
    }
    assert not [why for why, v in refused.items() if v.allowed], refused
    assert all(v.how == "goal" for v in refused.values())


async def test_the_same_menu_three_times_after_pressing_ends_the_call_as_ivr_loop():
    server = ScriptedLLMServer(default=tool_call("send_dtmf", digits="1"))
    async with server.serve() as url:
        llm = client(url)
        asr = ScriptedASR([MENU_TEXT, MENU_TEXT, MENU_TEXT, "thank you for calling. for billing press one. "
                           "for sales press 2", MENU_TEXT])  # fmt: skip
        line = Line(asr, llm)
        for _ in range(4):  # pressing 1 brings the same menu back each time
            await line.play(menu())
            if line.ended:
                break
        await llm.aclose()
    assert line.dtmf() == ["1", "1", "1"], line.nav.decisions
    assert [o for o, _ in line.ended] == ["ivr_loop"] and line.gate.outcome == "ivr_loop", line.ended
    assert "3 times" in line.ended[0][1] and line.gate.call_outcome() == "ivr_loop"
    assert len(server.requests) == 3  # the looping menu was not asked about again
    assert line.gate.summary()["ivr"]["presses"] == 3
    after_presses = asr.heard_s[2:]  # after the second opinion's and the first menu's (from the call's start)
    # each menu after a press is transcribed from the press on (a menu's length), not from the call's start
    assert after_presses and all(s < len(menu()) / RATE + 0.5 for s in after_presses), asr.heard_s


async def test_a_key_past_max_presses_ends_the_call_as_ivr_loop():
    server = ScriptedLLMServer(default=tool_call("send_dtmf", digits="2"))
    async with server.serve() as url:
        llm = client(url)
        texts = [MENU_TEXT, "Main menu. For invoices press two.", "Billing. For card payments press two.",
                 "Card payments. For a person press two."]  # fmt: skip
        line = Line(ScriptedASR(texts), llm, max_presses=2)
        for _ in range(3):
            await line.play(menu())
        await llm.aclose()
    assert line.dtmf() == ["2", "2"]
    assert [o for o, _ in line.ended] == ["ivr_loop"] and "after 2 presses" in line.ended[0][1], line.ended


async def test_a_failing_llm_or_no_key_leaves_the_call_waiting_until_the_dead_end():
    server = ScriptedLLMServer({"steps": [error(500), content("WAIT"), tool_call("send_dtmf", digits="hello")]},
                               default=content("WAIT"))  # fmt: skip
    async with server.serve() as url:
        llm = client(url)
        line = Line(ScriptedASR([MENU_TEXT]), llm, ivr_wait_s=24.0)
        for _ in range(3):
            await line.play(menu())
            assert line.gate.gated and line.actions == []
        await llm.aclose()
    assert len(server.requests) >= 3  # asked again after the failure: it never stopped navigating
    assert [o for o, _ in line.ended] == ["ivr_dead_end"], line.ended  # no person: the dead end, as before
    (refused,) = line.nav.decisions  # the garbled keys went to the policy and were refused
    assert not refused.allowed and "only 0-9" in refused.reason


async def test_dial_goal_reaches_the_call_params_and_turns_detection_on():
    dialled: list[dict[str, Any]] = []

    async def dial(to: str, **kw: Any) -> str:
        dialled.append(kw)
        return "answered"

    agent = SimpleNamespace(sip_endpoint=SimpleNamespace(dial=dial))
    await place_call(agent, "sip:7002@pbx.example", goal="  reach   billing ", params={"campaign_id": "c1"})
    await place_call(agent, "sip:7002@pbx.example", goal="reach billing", detect=False)
    await place_call(agent, "sip:7002@pbx.example")
    assert dialled[0]["params"] == {"campaign_id": "c1", "ivr_goal": "reach billing"} and dialled[0]["detect"] is True
    assert dialled[1]["detect"] is False and dialled[1]["params"]["ivr_goal"] == "reach billing"
    assert dialled[2]["params"] is None and dialled[2]["detect"] is None

    body = json.dumps({"to": "sip:7002@pbx.example", "detect": True, "goal": "reach billing"}).encode()
    assert parse_dial_request(body)[0] == "sip:7002@pbx.example"
    for bad in (3, "", "a\nb", "x" * 301):
        with pytest.raises(ValueError, match="goal"):
            parse_dial_request(json.dumps({"to": "sip:7002@pbx.example", "goal": bad}).encode())


async def test_the_admin_dial_route_passes_the_goal_to_agent_dial():
    import aiohttp

    from duetaspan.access import ADMIN_TOKEN_ENV, BearerRole
    from duetaspan.adapters.sip.admin import ANY_DIAL_PATH, add_dial_route
    from duetaspan.server import create_app
    from tests.adapters.twilio.peer import run_uvicorn

    dialled: list[dict[str, Any]] = []

    async def dial(to: str, **kw: Any) -> Any:
        dialled.append({"to": to, **kw})
        return SimpleNamespace(outcome="busy", summary=lambda: {"outcome": "busy", "to": to})

    app = create_app()
    app.state.admin = BearerRole("admin", "ivr-admin-token", ADMIN_TOKEN_ENV)
    add_dial_route(app, dial, twilio=dial)
    auth = {"Authorization": "Bearer ivr-admin-token"}
    async with run_uvicorn(app) as base, aiohttp.ClientSession() as http:
        for body in ({"to": "sip:7002@127.0.0.1", "goal": "reach billing", "detect": True}, {"to": "+15551234567"},
                     {"to": "+15551234567", "goal": ""}):  # fmt: skip
            async with http.post(base + ANY_DIAL_PATH, json=body, headers=auth) as r:
                assert r.status == (400 if body.get("goal") == "" else 200), await r.text()
    assert dialled == [{"to": "sip:7002@127.0.0.1", "caller": None, "ring_timeout_s": None, "detect": True,
                        "goal": "reach billing"},
                       {"to": "+15551234567", "caller": None, "ring_timeout_s": None}]  # fmt: skip


def test_the_call_gets_a_navigator_only_with_a_goal_an_asr_and_the_routers_llm():
    llm, policy = object(), SideEffectPolicy()
    agent = SimpleNamespace(shared={"router": SimpleNamespace(llm=llm, policy=policy)})
    asr = ScriptedASR([MENU_TEXT]).transcribe
    nav = menu_navigator(agent, {"ivr_goal": "reach billing"}, CallContext(), asr)
    assert isinstance(nav, MenuNavigator) and nav.goal == "reach billing" and nav.llm is llm and nav.policy is policy
    assert menu_navigator(agent, {}, CallContext(), asr) is None
    assert menu_navigator(agent, {"ivr_goal": "reach billing"}, CallContext(), None) is None
    assert menu_navigator(SimpleNamespace(shared={}), {"ivr_goal": "reach billing"}, CallContext(), asr) is None


async def test_a_menu_waiting_quietly_for_a_key_is_not_a_person():
    # after the menu the line is quiet while the menu waits for a key (the LLM answers nothing useful): the
    # detector's `silence` (nothing said for 3.5 s) is no person answering, so the gate stays closed until the
    # dead end; a person who then says hello still opens it
    server = ScriptedLLMServer({"steps": []}, default=content("WAIT"))
    async with server.serve() as url:
        llm = client(url)
        line = Line(ScriptedASR([MENU_TEXT]), llm, ivr_wait_s=40.0)
        await line.play(fixture("menu.wav", 8.0))
        assert line.gate.gated and line.gate.verdict.verdict == "ivr", line.gate.verdicts
        assert "silence" not in [v.verdict for v in line.gate.verdicts], line.gate.verdicts
        await line.play(fixture("hello.wav", 1.5))
        await llm.aclose()
    assert not line.gate.gated and line.gate.verdicts[-1].verdict == "human", line.gate.verdicts
    assert line.ended == [], line.ended
