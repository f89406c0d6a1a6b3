-- duetaspan store, version 1: the call index, the event outbox, campaigns (contacts, attempts), do-not-call.
-- Portable SQL (SQLite 3.35+ and PostgreSQL 13+): text ids made by the SDK, times as epoch seconds
-- (DOUBLE PRECISION), JSON as TEXT.

CREATE TABLE calls (
    id TEXT PRIMARY KEY,
    transport TEXT,
    direction TEXT,
    from_number TEXT,
    to_number TEXT,
    started_at DOUBLE PRECISION,
    ended_at DOUBLE PRECISION,
    duration_s DOUBLE PRECISION,
    outcome TEXT,
    verdict TEXT,
    complete INTEGER NOT NULL DEFAULT 0,
    campaign_id TEXT,
    record_path TEXT,
    wav_path TEXT,
    jsonl_path TEXT,
    spans INTEGER NOT NULL DEFAULT 0,
    indexed_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX calls_started ON calls (started_at);

CREATE TABLE outbox (
    id TEXT PRIMARY KEY,
    type TEXT NOT NULL,
    created DOUBLE PRECISION NOT NULL,
    call_id TEXT,
    data TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at DOUBLE PRECISION NOT NULL,
    last_answer TEXT
);
CREATE INDEX outbox_due ON outbox (state, next_attempt_at);

CREATE TABLE campaigns (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    state TEXT NOT NULL,
    created DOUBLE PRECISION NOT NULL,
    settings TEXT NOT NULL
);

CREATE TABLE contacts (
    id TEXT PRIMARY KEY,
    campaign_id TEXT NOT NULL REFERENCES campaigns (id),
    position INTEGER NOT NULL,
    to_number TEXT NOT NULL,
    variables TEXT NOT NULL,
    timezones TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at DOUBLE PRECISION NOT NULL,
    outcome TEXT,
    last_attempt_at DOUBLE PRECISION,
    lease_owner TEXT,
    lease_until DOUBLE PRECISION
);
CREATE INDEX contacts_due ON contacts (campaign_id, state, next_at);

CREATE TABLE attempts (
    id TEXT PRIMARY KEY,
    contact_id TEXT NOT NULL REFERENCES contacts (id),
    campaign_id TEXT NOT NULL,
    n INTEGER NOT NULL,
    owner TEXT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    ended_at DOUBLE PRECISION,
    outcome TEXT,
    call_id TEXT,
    detail TEXT
);
CREATE INDEX attempts_campaign ON attempts (campaign_id, started_at);

CREATE TABLE dnc (
    number TEXT PRIMARY KEY,
    added_at DOUBLE PRECISION NOT NULL
);
