"""`AfterCall`'s lifecycle events from what a call's recorder writes, on both stores: `call.transferred` from a
`transfer_call` that succeeded, with where the call went; `call.answered` with the answer gate's verdict where
detection ran (sent once it came), at once with a null verdict where it did not."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from duetaspan.adapters.sip.records import call_meta
from duetaspan.config import WebhooksConfig
from duetaspan.outbound.gate import AnswerGate
from duetaspan.outbound.verdicts import Verdict
from duetaspan.pipeline.artifacts import CallRecorder
from duetaspan.pipeline.retrieval_events import event_dict
from duetaspan.registry import CallContext, ToolRegistry
from duetaspan.router.events import ToolCalled
from duetaspan.tools.call_control import make_transfer_call
from duetaspan.webhooks.lifecycle import AfterCall

HOOKS = WebhooksConfig(urls=["http://127.0.0.1:9/hook"])  # events are written; nothing is delivered (not started)


async def _events(store, type_: str) -> list[Any]:
    async with store.transaction() as tx:
        return await tx.events(type=type_)


async def _tool_call(recorder: CallRecorder, registry: ToolRegistry, ctx: CallContext, arguments: dict) -> None:
    """What a call's service records for one `transfer_call` the router ran: the `retrieval` event of kind
    `tool` (`duetaspan.pipeline.retrieval_events`), then the span its reference became."""
    result = await registry.call("transfer_call", arguments, ctx)
    called = ToolCalled(call_id=ctx.call_id, retrieval_id=len(ctx.actions), frame_index=10, at_ms=5.0,
                        tool="transfer_call", arguments=result.redacted_arguments(), ok=result.ok,
                        tool_ms=result.elapsed_ms, error=result.error)  # fmt: skip
    recorder.event("retrieval", **{k: v for k, v in event_dict(called).items() if k != "type"})
    recorder.event("span", reference=result.reference, t=2.5, tool="transfer_call", arguments=result.arguments)


async def test_call_transferred_carries_the_destination_and_only_for_a_transfer_that_succeeded(store, tmp_path):
    targets = {"sales": "+15550001111"}
    after_call = AfterCall(store, webhooks=HOOKS, secrets=["s"], transfer_targets=targets)
    recorder = CallRecorder(tmp_path / "calls", "CA-transfer", audio=False)
    after_call.attach(recorder, caller="+15550002222", called="+15550003333", transport="sip")
    registry, ctx = ToolRegistry([make_transfer_call(targets)]), CallContext(call_id="CA-transfer")
    try:
        await _tool_call(recorder, registry, ctx, {"destination": "billing"})  # unknown: the tool refuses
        await _tool_call(recorder, registry, ctx, {"destination": "Sales", "reason": "a quote"})
        recorder.close()
    finally:
        await after_call.stop()  # the spawned store writes finished
    assert [a.target for a in ctx.actions] == ["+15550001111"]  # one transfer asked of the transport
    (event,) = await _events(store, "call.transferred")
    assert event.call_id == "CA-transfer"
    assert event.data["to"] == "+15550001111" and event.data["destination"] == "Sales"
    assert isinstance(event.data["t"], float) and event.data["t"] >= 0


async def test_call_transferred_to_a_number_when_no_destinations_are_named(store, tmp_path):
    after_call = AfterCall(store, webhooks=HOOKS, secrets=["s"])
    recorder = CallRecorder(tmp_path / "calls", "CA-number", audio=False)
    after_call.attach(recorder, caller=None, called=None, transport="twilio")
    registry, ctx = ToolRegistry([make_transfer_call()]), CallContext(call_id="CA-number")
    try:
        await _tool_call(recorder, registry, ctx, {"destination": "+1 (555) 000-4444"})
        recorder.close()
    finally:
        await after_call.stop()
    (event,) = await _events(store, "call.transferred")
    assert event.data["to"] == "+15550004444" == ctx.actions[0].target


ANSWERED = call_meta(SimpleNamespace(dial=None))  # what the SIP adapter writes when a call is answered


@pytest.mark.parametrize("case", ["no_detection", "verdict", "ended_before_a_verdict"])
async def test_call_answered_carries_the_verdict_where_detection_ran(store, tmp_path, case):
    after_call = AfterCall(store, webhooks=HOOKS, secrets=["s"])
    recorder = CallRecorder(tmp_path / "calls", f"CA-{case}", audio=False)
    detect = case != "no_detection"
    after_call.attach(recorder, caller="+15550002222", called=None, transport="sip", detect=detect)
    try:
        recorder.event("meta", **ANSWERED)  # at answer time: no verdict exists yet
        if case == "verdict":  # the gate's listener (duetaspan.agent.answer): each verdict an `answer` event
            recorder.event("answer", **Verdict("voicemail", 0.9, 1.2, reason="a long greeting").as_json())
            recorder.event("answer", **Verdict("beep", 0.8, 6.0, beep_at_s=6.0).as_json())  # not a second event
        if detect:  # the gate's summary as the call closes (`meta.answer`): no verdict when none came
            gate = AnswerGate(timeout_s=4.0)
            if case == "verdict":
                gate.verdict = Verdict("voicemail", 0.9, 1.2)
            recorder.event("meta", answer=gate.summary())
        recorder.close()
    finally:
        await after_call.stop()
    (event,) = await _events(store, "call.answered")
    assert event.call_id == f"CA-{case}" and event.data["direction"] == "inbound"
    assert event.data["verdict"] == ("voicemail" if case == "verdict" else None)
    assert event.data["detected"] is detect
    assert isinstance(event.data["answered_at"], float)


async def test_without_webhook_urls_a_call_writes_no_call_event_but_its_index_row(store, tmp_path):
    """What docs/privacy.md says: `call.*` events only with `[webhooks] urls` (nobody else reads them)."""
    after_call = AfterCall(store, webhooks=WebhooksConfig())
    recorder = CallRecorder(tmp_path / "calls", "CA-quiet", audio=False)
    after_call.attach(recorder, caller="+15550002222", called=None, transport="sip")
    try:
        recorder.event("meta", **ANSWERED)
        recorder.close()
    finally:
        await after_call.stop()
    async with store.transaction() as tx:
        assert [c.id for c in await tx.calls()] == ["CA-quiet"] and await tx.events() == []
