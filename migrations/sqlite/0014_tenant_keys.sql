-- toolgate 0014 for SQLite: an idempotency key is unique within its tenant,
-- and the breaker's tables are keyed by tenant (see the PostgreSQL
-- migration). SQLite cannot drop a column's UNIQUE, so tool_invocations is
-- rebuilt (the runner turns foreign keys off around a rebuild and checks them
-- before committing), its indexes with it.

CREATE TABLE tool_invocations_rebuilt (
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
    idempotency_key    TEXT NOT NULL,
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
                      'succeeded', 'failed', 'denied', 'uncertain')),
    UNIQUE (idempotency_key, tenant_id)
);
INSERT INTO tool_invocations_rebuilt (id, tenant_id, session_id, run_id, step_number, call_id, tool_name, tool_version, arguments, arguments_hash, idempotency_key, status, principal, result, error, created_at, started_at, completed_at, worker_id, lease_epoch, deadline_at, approval_id, side_effect, tool_source, server_id, idempotency_class, effect_sent_at, attempt_number, suspended_kind, suspended_ref, output_bytes, truncated, artifact_id, outcome_status, reason_code, origin_trust, parallel_group)
    SELECT id, tenant_id, session_id, run_id, step_number, call_id, tool_name, tool_version, arguments, arguments_hash, idempotency_key, status, principal, result, error, created_at, started_at, completed_at, worker_id, lease_epoch, deadline_at, approval_id, side_effect, tool_source, server_id, idempotency_class, effect_sent_at, attempt_number, suspended_kind, suspended_ref, output_bytes, truncated, artifact_id, outcome_status, reason_code, origin_trust, parallel_group FROM tool_invocations;
DROP TABLE tool_invocations;
ALTER TABLE tool_invocations_rebuilt RENAME TO tool_invocations;
CREATE INDEX tool_invocations_in_flight ON tool_invocations (worker_id)
    WHERE status = 'running' AND suspended_kind IS NULL;
CREATE INDEX tool_invocations_identical
    ON tool_invocations (run_id, tool_name, arguments_hash, outcome_status, reason_code);
CREATE INDEX tool_invocations_by_run ON tool_invocations (run_id, step_number, created_at);
CREATE INDEX tool_invocations_uncertain ON tool_invocations (tenant_id, completed_at)
    WHERE outcome_status = 'uncertain';

CREATE TABLE breaker_evidence_rebuilt (
    tenant_id       TEXT NOT NULL,
    run_id          TEXT NOT NULL,
    tool_name       TEXT NOT NULL,
    arguments_hash  TEXT NOT NULL,
    evidence_key    TEXT NOT NULL,
    base            INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, tool_name, arguments_hash, tenant_id)
);
INSERT INTO breaker_evidence_rebuilt SELECT tenant_id, run_id, tool_name, arguments_hash, evidence_key, base
    FROM breaker_evidence;
DROP TABLE breaker_evidence;
ALTER TABLE breaker_evidence_rebuilt RENAME TO breaker_evidence;

CREATE TABLE breaker_runs_rebuilt (
    tenant_id  TEXT NOT NULL,
    run_id     TEXT NOT NULL,
    restarts   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, tenant_id)
);
INSERT INTO breaker_runs_rebuilt SELECT tenant_id, run_id, restarts FROM breaker_runs;
DROP TABLE breaker_runs;
ALTER TABLE breaker_runs_rebuilt RENAME TO breaker_runs;
