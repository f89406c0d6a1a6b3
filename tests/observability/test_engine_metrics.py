"""The engine's figures in `/metrics`: the runner's per-tick histograms and counters (step time, lateness,
skipped ticks, concealed frames, failed steps) read at scrape time, on the deterministic scripted engine; and
the server-side counters fed by the Twilio routes and the call observer."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from duetaspan import tool
from duetaspan.adapters.twilio.errors import TokenExpired
from duetaspan.agent import Agent
from duetaspan.observability.metrics import ServeMetrics, refusal_reason
from duetaspan.observability.observer import Observability
from duetaspan.observability.timing import BucketCounts
from duetaspan.pipeline.runner import EngineFull, EngineRunner
from duetaspan.pipeline.session import CallInfo
from duetaspan.registry import ToolRegistry
from tests.pipeline.loopback import LoopbackTransport
from tests.pipeline.scripted_engine import ScriptedEngine


def samples(text: bytes) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


async def test_runner_tick_figures_reach_the_scrape():
    # step 5 takes 600 ms: beyond 3 ticks of catch-up the rest are skipped; step 12 raises
    engine = ScriptedEngine(slow_steps={5: 0.6}, fail_at=12)
    holder: dict[str, EngineRunner] = {}
    metrics = ServeMetrics(engine=lambda: holder.get("runner"))
    before = samples(metrics.render())
    assert before[("duetaspan_engine_tick_seconds_count", ())] == 0
    assert before[("duetaspan_engine_free_slots", ())] == 0  # no engine yet
    async with EngineRunner(engine, max_calls=2, max_catchup_ticks=3) as runner:
        holder["runner"] = runner
        call = await runner.attach("CA1", lambda out: None)  # no caller audio: every frame is concealed
        during = samples(metrics.render())
        for _ in range(600):  # until the slow step, the skips and the failed step are behind us
            if engine.steps >= 14:
                break
            await asyncio.sleep(0.05)
        await call.close()
    clock = runner.clock
    figures = samples(metrics.render())
    assert during[("duetaspan_calls_active", ())] == 1 and during[("duetaspan_engine_free_slots", ())] == 1
    stepped = clock.ticks - 1  # every tick stepped the engine but the failed one
    assert figures[("duetaspan_engine_tick_seconds_count", ())] == stepped
    assert figures[("duetaspan_engine_tick_seconds_bucket", (("le", "+Inf"),))] == stepped
    # the 600 ms step is above every bucket but +Inf; the others are fast
    assert figures[("duetaspan_engine_tick_seconds_bucket", (("le", "0.5"),))] == stepped - 1
    assert figures[("duetaspan_engine_tick_seconds_sum", ())] >= 0.6
    assert figures[("duetaspan_clock_lateness_seconds_count", ())] == stepped
    assert figures[("duetaspan_ticks_skipped_total", ())] == clock.skipped_ticks >= 3
    assert figures[("duetaspan_frames_concealed_total", ())] == stepped
    assert figures[("duetaspan_engine_step_errors_total", ())] == 1
    assert figures[("duetaspan_engine_crashes_total", ())] == 0  # one failed step: the engine stayed up
    assert figures[("duetaspan_calls_active", ())] == 0


def test_buckets_follow_prometheus_le_semantics():
    counts = BucketCounts((0.01, 0.02))
    for value in (0.005, 0.01, 0.015, 0.02, 0.5):
        counts.observe(value)
    assert counts.snapshot()["counts"] == [2, 2, 1]  # a value equal to a bound counts in that bucket


def test_refusals_and_call_outcomes_are_counted():
    metrics = ServeMetrics(engine=lambda: None, transports=["twilio"])
    metrics.webhook_refused("busy")
    metrics.webhook_refused(refusal_reason(TokenExpired("expired")))
    metrics.call_ended("twilio", "completed")
    for event in (
        {"kind": "question", "at_ms": 120.0, "asr_ms": 80.0},
        {"kind": "router", "llm_ms": 300.0},
        {"kind": "tool", "tool": "get_time", "ok": False, "tool_ms": 5.0},  # timed here, counted below
        {"kind": "late"},
        {"kind": "no_span"},
        {"kind": "error"},
    ):
        metrics.retrieval_event(event)
    figures = samples(metrics.render())
    assert figures[("duetaspan_webhook_refusals_total", (("reason", "busy"),))] == 1
    assert figures[("duetaspan_webhook_refusals_total", (("reason", "token_expired"),))] == 1
    assert figures[("duetaspan_webhook_refusals_total", (("reason", "signature_invalid"),))] == 0
    # a call refused at the webhook is a refused call too
    assert figures[("duetaspan_calls_total", (("outcome", "refused"), ("transport", "twilio")))] == 1
    assert figures[("duetaspan_calls_total", (("outcome", "completed"), ("transport", "twilio")))] == 1
    assert ("duetaspan_tool_calls_total", (("outcome", "error"), ("tool", "get_time"))) not in figures
    assert figures[("duetaspan_retrieval_seconds_sum", (("stage", "tool"),))] == 0.005
    assert figures[("duetaspan_spans_total", (("outcome", "late"),))] == 1
    assert figures[("duetaspan_spans_total", (("outcome", "none"),))] == 2
    assert figures[("duetaspan_retrieval_seconds_sum", (("stage", "capture"),))] == 0.12
    assert figures[("duetaspan_retrieval_seconds_sum", (("stage", "asr"),))] == 0.08
    assert figures[("duetaspan_retrieval_seconds_sum", (("stage", "router"),))] == 0.3


def test_each_server_owns_its_registry():
    a, b = ServeMetrics(engine=lambda: None), ServeMetrics(engine=lambda: None)  # no "Duplicated timeseries"
    a.ret()
    assert samples(a.render())[("duetaspan_ret_total", ())] == 1
    assert samples(b.render())[("duetaspan_ret_total", ())] == 0


async def test_call_outcomes_come_from_the_session():
    agent = Agent(persona="Hi", engine=ScriptedEngine(max_slots=2), max_calls=1, builtins=[], router=False)
    metrics = ServeMetrics(engine=lambda: agent.runner, transports=["webrtc"])
    agent.observability = Observability(metrics=metrics)
    async with agent:
        first = agent.create_session(CallInfo("A", transport="webrtc"), LoopbackTransport())
        run = asyncio.ensure_future(first.run())
        await asyncio.wait_for(first.service.started.wait(), 30)
        second = agent.create_session(CallInfo("B", transport="webrtc"), LoopbackTransport())
        with pytest.raises(EngineFull):
            await second.run()
        assert second.outcome == "refused"
        during = samples(metrics.render())
        await first.end()
        await asyncio.wait_for(run, 30)
    assert first.outcome == "completed"
    assert during[("duetaspan_calls_active", ())] == 1
    figures = samples(metrics.render())
    assert figures[("duetaspan_calls_total", (("outcome", "refused"), ("transport", "webrtc")))] == 1
    assert figures[("duetaspan_calls_total", (("outcome", "completed"), ("transport", "webrtc")))] == 1
    assert figures[("duetaspan_calls_active", ())] == 0


async def test_tool_calls_are_counted_from_the_registry():
    @tool
    def add(a: int, b: int) -> str:
        """Add two numbers.

        Args:
            a: first.
            b: second.
        """
        return str(a + b)

    registry = ToolRegistry([add])
    metrics = ServeMetrics(engine=None)
    unwatch = metrics.watch_registry(registry)
    assert (await registry.call("add", {"a": 1, "b": 2})).ok
    assert not (await registry.call("add", {"a": "x"})).ok  # invalid arguments
    assert not (await registry.call("book_flight_to_mars", {})).ok  # a name the LLM made up
    unwatch()
    await registry.call("add", {"a": 1, "b": 2})  # no longer counted
    figures = samples(metrics.render())
    assert figures[("duetaspan_tool_calls_total", (("outcome", "ok"), ("tool", "add")))] == 1
    assert figures[("duetaspan_tool_calls_total", (("outcome", "error"), ("tool", "add")))] == 1
    assert figures[("duetaspan_tool_calls_total", (("outcome", "error"), ("tool", "unknown")))] == 1
    assert not [k for k in figures if "book_flight_to_mars" in str(k)]
