"""An engine process killed under a call: the call ends `failed`, `/metrics` counts the crash, shows no free
slot, and still shows the ticks the child reported before it died (an Agent with `engine_process=True` on the
tiny-random model, a call through the real pipeline on a loopback transport)."""

from __future__ import annotations

import asyncio
import os
import signal

import numpy as np
from pipecat.frames.frames import InputAudioRawFrame
from prometheus_client.parser import text_string_to_metric_families

from duetaspan.agent import Agent
from duetaspan.config import AgentConfig
from duetaspan.observability.metrics import ServeMetrics
from duetaspan.observability.observer import Observability
from duetaspan.pipeline.session import CallInfo
from tests.pipeline.loopback import LoopbackTransport


def samples(text: bytes) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


async def test_a_killed_engine_process_is_a_failed_call_and_a_counted_crash():
    no_restart = AgentConfig.from_toml("[engine]\nmax_restarts = 0\n")  # the crash's figures stay put
    agent = Agent(persona="Hi", model="tiny-random", device="cpu", max_calls=1, builtins=[], router=False,
                  engine_process=True, config=no_restart)  # fmt: skip
    metrics = ServeMetrics(engine=lambda: agent.runner, transports=["twilio"])
    agent.observability = Observability(metrics=metrics)
    async with agent:
        session = agent.create_session(CallInfo("CA-crash", transport="twilio"), LoopbackTransport())
        chunk = np.zeros(480, np.int16).tobytes()

        async def feed_then_kill() -> None:
            await asyncio.wait_for(session.service.started.wait(), 60)
            for _ in range(3000):  # until the child has reported some ticks, then kill it
                await session.worker.queue_frame(InputAudioRawFrame(chunk, 24000, 1))
                if samples(metrics.render())[("duetaspan_engine_tick_seconds_count", ())] >= 5:
                    break
                await asyncio.sleep(0.02)
            before = samples(metrics.render())
            os.kill(agent.runner.pid, signal.SIGKILL)
            return before

        before, _ = await asyncio.wait_for(asyncio.gather(feed_then_kill(), session.run()), 90)
        after = samples(metrics.render())
    assert session.outcome == "failed"
    assert before[("duetaspan_calls_active", ())] == 1 and before[("duetaspan_engine_crashes_total", ())] == 0
    assert after[("duetaspan_calls_total", (("outcome", "failed"), ("transport", "twilio")))] == 1
    assert after[("duetaspan_engine_crashes_total", ())] == 1
    assert after[("duetaspan_engine_free_slots", ())] == 0 and after[("duetaspan_calls_active", ())] == 0
    # the child's last report stays: counters never go back
    assert (
        after[("duetaspan_engine_tick_seconds_count", ())]
        >= before[("duetaspan_engine_tick_seconds_count", ())]
        >= 5
    )
