"""What happens to a call's data after (and around) the call: `[webhooks]`, `[analysis]` and `[privacy]`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from duetaspan.config.base import _Section

EVENT_TYPES = (
    "call.started",
    "call.answered",
    "call.transferred",
    "call.ended",
    "call.analyzed",
    "campaign.started",  # the campaign events duetaspan.outbound writes (docs/campaigns.md)
    "campaign.paused",
    "campaign.running",  # resumed
    "campaign.cancelled",
    "campaign.done",  # every number's attempts are over (the campaign's state is `done`)
    "campaign.attempt",  # one contact's attempt finished (or was suppressed: do-not-call)
)


class WebhooksConfig(_Section):
    """Signed lifecycle events POSTed to your systems (see docs/webhooks.md).

    Each event is written to the store's outbox in the transaction that changes the call's state and
    delivered at least once (its `id` is stable across retries: de-duplicate on it). The body is signed with
    `$DUETASPAN_WEBHOOK_SECRET` (`Duetaspan-Signature`; `$DUETASPAN_WEBHOOK_SECRET_PREVIOUS` during a key
    rotation); a server with `urls` and no secret refuses to start.

    Attributes:
        urls: where every event is POSTed (each URL gets each event).
        events: the event types sent (`"call.*"`, `"campaign.*"` patterns allowed); default all.
        retry_for_s: how long a failing delivery is retried (exponential backoff with jitter) before it is a
            dead letter (`duetaspan webhooks replay` sends it again).
        timeout_s: one delivery's deadline (connect and answer); a timeout is retried.
        max_backoff_s: the longest wait between two tries.
    """

    urls: list[str] = Field(default_factory=list)
    events: list[str] = Field(default_factory=lambda: ["call.*", "campaign.*"])
    retry_for_s: float = Field(86400.0, gt=0)
    timeout_s: float = Field(10.0, gt=0)
    max_backoff_s: float = Field(3600.0, gt=0)

    @field_validator("urls")
    @classmethod
    def _http_urls(cls, urls: list[str]) -> list[str]:
        bad = [u for u in urls if not u.startswith(("http://", "https://"))]
        if bad:
            raise ValueError(f"not http(s) URLs: {bad}")
        return urls

    @field_validator("events")
    @classmethod
    def _known_events(cls, events: list[str]) -> list[str]:
        for pattern in events:
            if pattern not in EVENT_TYPES and not (pattern.endswith(".*") and any(
                t.startswith(pattern[:-1]) for t in EVENT_TYPES
            )):  # fmt: skip
                raise ValueError(
                    f"unknown event {pattern!r} (known: {list(EVENT_TYPES)}, or call.* / campaign.*)"
                )
        return events

    def wants(self, event_type: str) -> bool:
        """Whether `event_type` is sent."""
        return any(
            p == event_type or (p.endswith(".*") and event_type.startswith(p[:-1])) for p in self.events
        )


class AnalysisConfig(_Section):
    """End-of-call analysis by the router's LLM (see docs/analysis.md): a summary, a yes/no success check and
    fields extracted to a schema, from the call's two-sided transcript and its tool results (redacted when
    `[privacy] redact` is set), validated, stored in the record and sent as `call.analyzed`.

    Attributes:
        enabled: analyse every call after it ends (needs `[router] model`).
        summary: ask for a short summary.
        success_question: a question answered yes or no (`"Did the caller book a table?"`); unset: no check.
        model: a pydantic model the fields are extracted to, as `"package.module:ClassName"`.
        schema_: a JSON Schema (an object schema) for the fields, written in TOML as `[analysis.schema]`;
            use `model` or `schema`, not both.
        instructions: extra instructions for the analysing LLM (your domain's terms, what counts as success).
        timeout_s: one LLM request's deadline.
    """

    enabled: bool = False
    summary: bool = True
    success_question: str | None = None
    model: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    instructions: str = ""
    timeout_s: float = Field(60.0, gt=0)

    @model_validator(mode="after")
    def _one_schema(self) -> AnalysisConfig:
        if self.model and self.schema_:
            raise ValueError("set model or schema, not both")
        if self.schema_ is not None and self.schema_.get("type", "object") != "object":
            raise ValueError('schema: the fields schema must be an object schema (type = "object")')
        return self


class PrivacyConfig(_Section):
    """Personal data in what the SDK stores and sends (see docs/privacy.md).

    Attributes:
        redact: kinds replaced in records, transcripts, traces, logs, webhooks and the viewer: `card`
            (Luhn-checked card numbers), `ssn` (US social security numbers), `phone` (phone numbers),
            `email`, `digits` (digit strings of 6+ written or 4+ read aloud). Tools still get the real
            values; the router's LLM sees the caller's real words (it must pass them to tools); end-of-call
            analysis reads the redacted transcript.
        phone_region: the region phone numbers without a country code are read in (ISO 3166 code).
    """

    redact: list[Literal["card", "ssn", "phone", "email", "digits"]] = Field(default_factory=list)
    phone_region: str = Field("US", pattern=r"^[A-Z]{2}$")


__all__ = ["EVENT_TYPES", "AnalysisConfig", "PrivacyConfig", "WebhooksConfig"]
