"""A detected call's agent held at silence inside the engine until the verdict (`duetaspan.agent.answer`
`hold_while_gated`, `DuplexEngine.hold_agent`): the REAL tiny-random engine under an `Agent`'s service in a
Pipecat pipeline, a person's "hello" (the committed phone-line fixture) as the caller. Every frame the model made
before the gate opened is pad text and `SILENCE_CODES` as the engine wrote them (not only silenced on the way
out); the release reaches the engine's next step, and from then on its frames are its own samples."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from duetaspan.agent import Agent
from duetaspan.agent.answer import load_message
from duetaspan.config import AgentConfig
from duetaspan.model.convention import SILENCE_CODES, TEXT_PAD_ID, UNGENERATED_TOKEN_ID
from duetaspan.model.engine import DuplexEngine
from duetaspan.pipeline.session import CallInfo
from tests.pipeline.harness import chunks_at, run_call
from tests.support import REPO_ROOT

HELLO = REPO_ROOT / "tests" / "fixtures" / "answers" / "hello.wav"


@dataclass
class Seen:
    """One engine tick as the service's filters see it, right after the answer gate's."""

    frame_index: int
    held: bool
    modelled: bool  # the model stepped and its codes are out (not waiting for its prompt, not warming up)
    text_token: int
    agent_codes: tuple[int, ...]
    gated: bool  # the gate, after this tick went through it


async def test_a_gated_call_holds_the_models_agent_at_silence_until_a_person_answers(tmp_path):
    engine = DuplexEngine.load("tiny-random", device="cpu", max_slots=1, seed=0)
    releases: list[tuple[bool, int]] = []  # (on, the slot's next frame index) per hold switch the engine got
    real_hold = engine.hold_agent

    def hold_agent(slot, on=True):
        releases.append((on, engine._slots[int(slot)].frame_index))
        real_hold(slot, on)

    engine.hold_agent = hold_agent
    config = AgentConfig.from_dict({"outbound": {"detect": True}}, base_dir=tmp_path)
    pcm = np.concatenate([load_message(HELLO), np.zeros(24000 * 3, np.float32)])  # "Hello, Priya here." + quiet
    persona = "You are Ava from Harbor Dental."  # a short prompt: the model runs (gated) for most of the hello
    agent = Agent(persona=persona, engine=engine, router=False, record_dir=tmp_path / "rec", seed=0, config=config)
    async with agent:
        service = agent.service(CallInfo("CA-held", transport="test", params={"direction": "outbound-api"}))
        gate = service.answer
        assert gate is not None and gate.gated and service.agent_held  # the slot opens held
        seen: list[Seen] = []

        def watch(out):
            r = out.result
            modelled = not r.waiting and r.text_token != UNGENERATED_TOKEN_ID
            seen.append(Seen(r.frame_index, r.held, modelled, r.text_token, r.agent_codes, gate.gated))
            return out

        service.tick_filters.append(watch)  # after the gate's own filter
        await run_call(service, chunks_at(pcm, 8000), 8000, tail_s=0.3)
    assert gate.verdict is not None and gate.verdict.verdict == "human" and not gate.gated, gate.verdict
    opened = next(i for i, s in enumerate(seen) if not s.gated)
    before = [s for s in seen[:opened] if s.modelled]
    assert len(before) >= 3, len(before)  # the model ran, gated, while the callee said hello
    assert all(s.held and s.text_token == TEXT_PAD_ID and s.agent_codes == SILENCE_CODES for s in before), before
    # one release, in the tick the gate opened; the engine applies it from its next step
    assert len(releases) == 1 and releases[0][0] is False, releases
    after = [s for s in seen[opened:] if s.modelled]
    spoke = next(i for i, s in enumerate(after) if not s.held)
    assert after[spoke].frame_index <= releases[0][1] + 1, (after[spoke], releases)
    assert not any(s.held for s in after[spoke:])
    # the first released frame was read while held (pad text, silent codebook 0); after it, the model's own
    assert after[spoke].text_token == TEXT_PAD_ID and after[spoke].agent_codes[0] == SILENCE_CODES[0]
    rest = after[spoke + 1 :]
    assert len(rest) >= 10 and not any(s.agent_codes == SILENCE_CODES for s in rest)
    print(f"{gate.verdict.verdict} ({gate.verdict.source}) at {gate.verdict.decided_at_s:.2f} s: {len(before)} "
          f"frames held, released before frame {releases[0][1]}, the model's own from frame {after[spoke].frame_index}")
