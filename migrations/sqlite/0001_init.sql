-- toolgate 0001 for embedded SQLite (one node): the same tables as
-- PostgreSQL's. UUIDs and JSON are TEXT; timestamps are INTEGER microseconds
-- since the Unix epoch, so comparisons are numeric.

CREATE TABLE workers (
    worker_id         TEXT PRIMARY KEY,
    node              TEXT NOT NULL,
    started_at        INTEGER NOT NULL,
    heartbeat_at      INTEGER NOT NULL,
    lease_expires_at  INTEGER NOT NULL,
    released_at       INTEGER NULL
);

CREATE TABLE tool_invocations (
    id                 TEXT PRIMARY KEY,
    tenant_id          TEXT NOT NULL,
    session_id         TEXT NOT NULL,
    run_id             TEXT NOT NULL,
    step_number        INTEGER NOT NULL,
    call_id            TEXT NOT NULL,
    tool_name          TEXT NOT NULL,
    tool_version       TEXT NOT NULL,
    arguments          TEXT NOT NULL,
    arguments_hash     TEXT NOT NULL,
    idempotency_key    TEXT NOT NULL UNIQUE,
    status             TEXT NOT NULL,
    principal          TEXT NOT NULL,
    result             TEXT NULL,
    error              TEXT NULL,
    created_at         INTEGER NOT NULL,
    started_at         INTEGER NULL,
    completed_at       INTEGER NULL,
    worker_id          TEXT NULL,
    lease_epoch        INTEGER NOT NULL DEFAULT 0,
    deadline_at        INTEGER NULL,
    approval_id        TEXT NULL,
    side_effect        TEXT NOT NULL,
    tool_source        TEXT NOT NULL DEFAULT 'builtin',
    server_id          TEXT NULL,
    idempotency_class  TEXT NOT NULL,
    effect_sent_at     INTEGER NULL,
    attempt_number     INTEGER NOT NULL DEFAULT 1,
    suspended_kind     TEXT NULL,
    suspended_ref      TEXT NULL,
    output_bytes       INTEGER NULL,
    truncated          INTEGER NOT NULL DEFAULT 0,
    artifact_id        TEXT NULL,
    outcome_status     TEXT NULL,
    reason_code        TEXT NULL,
    origin_trust       TEXT NOT NULL,
    parallel_group     TEXT NULL,
    CHECK (status IN ('proposed', 'authorized', 'waiting_for_approval', 'running',
                      'succeeded', 'failed', 'denied', 'uncertain'))
);

CREATE INDEX tool_invocations_by_run ON tool_invocations (tenant_id, run_id, step_number, created_at);
CREATE INDEX tool_invocations_in_flight ON tool_invocations (worker_id)
    WHERE status = 'running' AND suspended_kind IS NULL;

CREATE TABLE approvals (
    id              TEXT PRIMARY KEY,
    tenant_id       TEXT NOT NULL,
    invocation_id   TEXT NOT NULL UNIQUE REFERENCES tool_invocations (id),
    tool_name       TEXT NOT NULL,
    reason_code     TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'denied', 'expired')),
    approver        TEXT NULL,
    requested_at    INTEGER NOT NULL,
    decided_at      INTEGER NULL
);

CREATE INDEX approvals_pending ON approvals (tenant_id, requested_at) WHERE status = 'pending';

CREATE TABLE artifacts (
    id             TEXT PRIMARY KEY,
    tenant_id      TEXT NOT NULL,
    run_id         TEXT NOT NULL,
    invocation_id  TEXT NOT NULL REFERENCES tool_invocations (id),
    media_type     TEXT NOT NULL,
    bytes          INTEGER NOT NULL,
    trust          TEXT NOT NULL,
    created_at     INTEGER NOT NULL
);

-- One writer at a time: ids are assigned in commit order.
CREATE TABLE events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id   TEXT NULL,
    event_type  TEXT NOT NULL,
    payload     TEXT NOT NULL,
    created_at  INTEGER NOT NULL
);
