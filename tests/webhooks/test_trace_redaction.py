"""`[privacy] redact` covers traces: `serve`'s after-call wiring (`open_after_call`) gives the server's tracer
the redactor, so with `[tracing] include_text` a card number the caller said reaches the exported spans only
as `[card]`: the question's transcript (`stt`) and the arguments of the tool the router called with it
(`tool`), while the tool itself gets the real number. A real call on the tiny-random engine, real question
capture (voice detection and the scripted ASR over HTTP), the real router against the scripted LLM; the spans
in OpenTelemetry's in-memory exporter."""

from __future__ import annotations

import json

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from duetaspan import Agent, tool
from duetaspan.config import AgentConfig
from duetaspan.observability.observer import Observability
from duetaspan.observability.tracing import Tracing
from duetaspan.testing import scripted_call, tool_call
from duetaspan.webhooks.served import open_after_call
from tests.support import has_card

CARD = "4111 1111 1111 1111"
looked_up: list[str] = []


@tool
def gift_card_balance(card: str) -> str:
    """What is left on a gift card.

    Args:
        card: the gift card's number
    """
    looked_up.append(card)
    return "12 dollars are left on the card."


async def test_a_card_number_the_caller_said_is_redacted_in_the_exported_spans(
    tiny_engine, scripted_llm, scripted_asr, tmp_path
):
    scripted_llm.on("gift card", tool_call("gift_card_balance", card=CARD))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agent = Agent(tools=[gift_card_balance], engine=tiny_engine, seed=0, record_dir=tmp_path,
                  config=AgentConfig(privacy={"redact": ["card"]}))  # fmt: skip
    observability = Observability(tracing=Tracing(provider, include_text=True))
    agent.observability = observability  # as `serve` sets it
    served = await open_after_call(agent, observability, env={})  # as `serve` does: sets the trace redactor
    try:
        async with scripted_call(agent, llm=scripted_llm, asr=scripted_asr) as call:
            await call.say(f"How much is left on my gift card {CARD}?")
            (await call.ask()).expect_tool("gift_card_balance")
    finally:
        if served is not None:
            await served.aclose()
    assert looked_up == [CARD]  # the tool got the real number
    spans = exporter.get_finished_spans()
    [stt] = [s for s in spans if s.name == "stt"]
    assert stt.attributes["transcript"] == "How much is left on my gift card [card]?"  # the text is there
    [tool_span] = [s for s in spans if s.name == "tool"]
    assert json.loads(tool_span.attributes["tool.arguments"]) == {"card": "[card]"}
    events = [[dict(e.attributes or {}) for e in s.events] for s in spans]
    dumped = json.dumps([dict(s.attributes or {}) for s in spans] + events)
    assert not has_card(dumped), dumped  # (not "4111" alone: a float such as asr_ms 1.754111... holds it)
