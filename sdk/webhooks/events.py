"""The webhook events: their bodies (contract: `id`, `type`, `created`, `call_id`, `data`) and what each type's
`data` holds, as pydantic models whose JSON Schema docs/webhooks.md shows.

`id` is the outbox event's id, the same on every retry (receivers de-duplicate on it); `created` is unix
seconds, when the state change happened; the body is compact JSON, byte-for-byte the same on every retry.

Example:
    >>> body = webhook_body("evt_1", "call.ended", 1700000000.5, "CA1", {"outcome": "completed"})
    >>> body
    b'{"id":"evt_1","type":"call.ended","created":1700000000,"call_id":"CA1","data":{"outcome":"completed"}}'
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from duetaspan.config.after_call import EVENT_TYPES


class _Data(BaseModel):
    model_config = ConfigDict(extra="allow")


class CallStarted(_Data):
    """`call.started`: a call was admitted (inbound ringing in, or an outbound call placed)."""

    caller: str | None = Field(None, description="the caller's number or URI (E.164 for phone numbers)")
    called: str | None = Field(None, description="the number or URI called")
    transport: str = Field(description="twilio, sip, webrtc, ...")
    direction: str | None = Field(None, description="inbound or outbound, where the transport knows")
    started_at: float = Field(description="unix seconds")


class CallAnswered(_Data):
    """`call.answered`: the call was answered; with answer detection on, sent once its first verdict came."""

    verdict: str | None = Field(
        None, description="who answered: human, voicemail, ivr, fax, ... (null: no detection, or no verdict yet)"
    )
    detected: bool | None = Field(None, description="whether answer detection ran on the call")
    direction: str | None = Field(None, description="inbound or outbound, where the transport knows")
    answered_at: float = Field(description="unix seconds: when the transport reported the answer")


class CallTransferred(_Data):
    """`call.transferred`: the agent handed the call on (a `transfer_call` tool call that succeeded)."""

    to: str = Field(description="where the call went: the number or SIP URI (a named destination's number)")
    destination: str | None = Field(None, description="what the agent asked for: a number or a destination's name")
    t: float | None = Field(None, description="seconds since the call started")


class ToolCall(BaseModel):
    tool: str | None = None
    arguments: Any = Field(None, description="as the tool got them, redacted under [privacy] redact")
    t: float | None = None


class Turn(BaseModel):
    who: str = Field(description="agent or caller")
    text: str
    start: float
    end: float


class CallEnded(_Data):
    """`call.ended`: the record's summary: numbers, times, outcome, tool calls, who ended it, the turns."""

    caller: str | None = None
    called: str | None = None
    transport: str | None = None
    direction: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    duration_s: float | None = None
    outcome: str | None = Field(None, description="how the call went (completed, failed, ...)")
    ended_by: str | None = Field(None, description="caller, end, shutdown, engine_error, refused, ...")
    recorded: bool = Field(description="whether audio was kept (false: recording off or consent refused)")
    tool_calls: list[ToolCall] = Field(default_factory=list)
    turns: list[Turn] = Field(default_factory=list, description="the two-sided transcript, redacted")


class CallAnalyzed(_Data):
    """`call.analyzed`: the end-of-call analysis (see docs/analysis.md); `error` instead when it failed."""

    summary: str | None = None
    success: bool | None = None
    fields: Any = None
    error: str | None = None
    attempts: int


class CampaignEvent(_Data):
    """`campaign.started`, `.paused`, `.running` (resumed), `.cancelled`: a campaign changed state."""

    campaign_id: str
    name: str | None = Field(None, description="the campaign's name")
    contacts: int | None = Field(None, description="campaign.started: how many numbers it holds")


class CampaignDone(_Data):
    """`campaign.done`: no number of the campaign is left to dial (sent once, when its state becomes `done`)."""

    campaign_id: str
    name: str | None = Field(None, description="the campaign's name")
    contacts: int = Field(description="how many numbers it held")
    attempts: int = Field(description="how many calls were attempted, over all its numbers")
    counts: dict[str, int] = Field(description="numbers by final outcome: answered, busy, dnc, ...")


class CampaignAttempt(_Data):
    """`campaign.attempt`: one number's attempt finished (`call_id` its call, when one was placed)."""

    campaign_id: str
    to: str = Field(description="the number called")
    outcome: str = Field(description="answered, busy, no-answer, failed, voicemail_left, dnc, interrupted, ...")
    attempts: int


_OWN_MODELS = ("campaign.done", "campaign.attempt")
DATA: dict[str, type[_Data]] = {
    "call.started": CallStarted,
    "call.answered": CallAnswered,
    "call.transferred": CallTransferred,
    "call.ended": CallEnded,
    "call.analyzed": CallAnalyzed,
    **{t: CampaignEvent for t in EVENT_TYPES if t.startswith("campaign.") and t not in _OWN_MODELS},
    "campaign.done": CampaignDone,
    "campaign.attempt": CampaignAttempt,
}


class WebhookBody(BaseModel):
    """Every delivery's body."""

    id: str = Field(description="the event's id, stable across retries: de-duplicate on it")
    type: str = Field(description="one of " + ", ".join(EVENT_TYPES))
    created: int = Field(description="unix seconds: when it happened")
    call_id: str | None = Field(description="the call (null for campaign events)")
    data: dict[str, Any]


def webhook_body(
    event_id: str, type_: str, created: float, call_id: str | None, data: Mapping[str, Any]
) -> bytes:
    """The exact bytes POSTed (and signed) for one event."""
    body = {"id": event_id, "type": type_, "created": int(created), "call_id": call_id, "data": dict(data)}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def body_schema() -> dict[str, Any]:
    """The JSON Schema of a body, with `data` per type (docs/webhooks.md prints it)."""
    schema = WebhookBody.model_json_schema()
    schema["$defs"] = {**schema.get("$defs", {})}
    by_type = []
    for type_, model in DATA.items():
        sub = model.model_json_schema(ref_template="#/$defs/{model}")
        schema["$defs"].update(sub.pop("$defs", {}))
        schema["$defs"][model.__name__] = sub
        by_type.append({"if": {"properties": {"type": {"const": type_}}},
                        "then": {"properties": {"data": {"$ref": f"#/$defs/{model.__name__}"}}}})  # fmt: skip
    schema["allOf"] = by_type
    return schema


def call_ended_data(record: Mapping[str, Any]) -> dict[str, Any]:
    """`call.ended`'s data from a closed call's record (already redacted when redaction is on)."""
    meta = record.get("meta") or {}
    summary = record.get("summary") or {}
    started, ended = record.get("started_at"), record.get("ended_at")
    recording = record.get("recording") or {}
    data = CallEnded(
        caller=meta.get("caller"),
        called=meta.get("called"),
        transport=meta.get("transport"),
        direction=meta.get("direction"),
        started_at=started,
        ended_at=ended,
        duration_s=round(ended - started, 3) if started is not None and ended is not None else None,
        outcome=summary.get("outcome") or ("completed" if record.get("complete") else "incomplete"),
        ended_by=summary.get("ended_by"),
        recorded=bool(recording.get("recorded")),
        tool_calls=[
            ToolCall(tool=s.get("tool"), arguments=s.get("arguments"), t=s.get("t"))
            for s in record.get("spans") or []
            if s.get("tool")
        ],
        turns=[Turn(**t) for t in record.get("turns") or []],
    )
    return data.model_dump(mode="json")


__all__ = ["DATA", "WebhookBody", "body_schema", "call_ended_data", "webhook_body"]
