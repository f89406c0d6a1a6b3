"""What must outlive a process: `[store]` (SQLite or PostgreSQL) and the outbound `[campaign]` settings."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from duetaspan.config.base import _Section

_WINDOW = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-4]):([0-5]\d)$")
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
RETRY_OUTCOMES = (
    "busy",
    "no-answer",
    "failed",
    "voicemail_left",
    "voicemail_no_message",
    "human",
    "fax",
    "ivr_dead_end",
    "ivr_loop",
    "screening_rejected",
    "answered",
)


class StoreConfig(_Section):
    """The durable store: the call index, campaigns and their attempts, the do-not-call list, the event outbox.

    SQLite (WAL) by default, a file in the server's data folder (`[server] data_dir`); PostgreSQL for several
    servers on one database (`url`, `pip install 'duetaspan[postgres]'`). The schema is migrated forward at
    start (yoyo-migrations, `duetaspan/store/migrations`). See docs/store.md.

    Attributes:
        path: the SQLite file (relative to agent.toml); unset: `<[server] data_dir>/duetaspan.sqlite3`.
        url: `postgresql://USER[:PASSWORD]@HOST[:PORT]/DB` (or `?host=/socket/dir`); set: PostgreSQL, `path`
            unused. `$DUETASPAN_STORE_URL` takes precedence and keeps a password out of the file.
        server_id: this server's name in leases and attempts (which server dials which number); unset:
            `hostname:pid`.
    """

    path: Path | None = None
    url: str | None = Field(None, pattern=r"^postgres(ql)?://")
    server_id: str | None = Field(None, min_length=1, max_length=120)


class RetryRule(_Section):
    """How one outcome is retried.

    Attributes:
        delay_s: wait before the next attempt.
        jitter_s: plus a random 0..jitter_s (spreads retries of many numbers).
    """

    delay_s: float = Field(3600.0, ge=0)
    jitter_s: float = Field(0.0, ge=0)


def _default_retry() -> dict[str, RetryRule]:
    return {
        "busy": RetryRule(delay_s=600, jitter_s=120),
        "no-answer": RetryRule(delay_s=3600, jitter_s=600),
        "failed": RetryRule(delay_s=1800, jitter_s=300),
        "voicemail_no_message": RetryRule(delay_s=14400, jitter_s=1800),
    }


class CampaignConfig(_Section):
    """Outbound campaigns (`duetaspan campaign start`, `agent.campaign(...)`): pacing, calling windows, retries.
    A campaign started with its own values (the command line's flags) overrides these.

    Attributes:
        max_concurrent: calls of one campaign at once (over all servers on the store).
        calls_per_minute: attempts started per minute, per campaign (over all servers on the store).
        window: the callee's local hours for calls, `HH:MM-HH:MM` (the US TCPA allows 08:00-21:00).
        days: the callee's local weekdays for calls (`mon` .. `sun`).
        reserve_inbound: call slots of the server's budget a campaign never takes (inbound callers first).
        max_attempts: attempts per number at most, retries included.
        retry: per outcome (`busy`, `no-answer`, `failed`, `voicemail_left`, `voicemail_no_message`, `human`,
            `fax`, `ivr_dead_end`, `ivr_loop`, `screening_rejected`, `answered`), the delay and jitter before the
            next attempt; an outcome not listed is final (by default `fax`, `ivr_dead_end`, `ivr_loop`,
            `screening_rejected`).
        ring_timeout_s: how long a campaign call may ring.
        lease_s: how long a server's claim on a number in flight lasts without renewal (a server that died
            mid-call frees its numbers after this; its attempts are then `interrupted`).
        poll_s: how often the scheduler looks for due numbers.
    """

    max_concurrent: int = Field(2, ge=1, le=1000)
    calls_per_minute: float = Field(10.0, gt=0)
    window: str = "09:00-20:00"
    days: list[str] = Field(default_factory=lambda: ["mon", "tue", "wed", "thu", "fri", "sat"])
    reserve_inbound: int = Field(1, ge=0)
    max_attempts: int = Field(3, ge=1, le=50)
    retry: dict[str, RetryRule] = Field(default_factory=_default_retry)
    ring_timeout_s: float = Field(30.0, gt=0, le=600)
    lease_s: float = Field(60.0, ge=1)
    poll_s: float = Field(1.0, gt=0, le=60)

    @field_validator("window")
    @classmethod
    def _window(cls, value: str) -> str:
        m = _WINDOW.match(value)
        if not m or (int(m[1]), int(m[2])) >= (int(m[3]), int(m[4])):
            raise ValueError(f"window {value!r}: HH:MM-HH:MM, start before end (e.g. 09:00-20:00)")
        return value

    @field_validator("days")
    @classmethod
    def _days(cls, value: list[str]) -> list[str]:
        days = [d.lower()[:3] for d in value]
        bad = [d for d in days if d not in DAYS]
        if bad or not days:
            raise ValueError(f"days {value!r}: some of {', '.join(DAYS)}")
        return days

    @model_validator(mode="after")
    def _outcomes(self) -> CampaignConfig:
        unknown = sorted(set(self.retry) - set(RETRY_OUTCOMES))
        if unknown:
            raise ValueError(f"retry: unknown outcome(s) {unknown}; known: {', '.join(RETRY_OUTCOMES)}")
        return self


__all__ = ["DAYS", "RETRY_OUTCOMES", "CampaignConfig", "RetryRule", "StoreConfig"]
