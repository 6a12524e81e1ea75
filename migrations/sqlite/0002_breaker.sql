-- toolgate 0002 for SQLite: the breaker's evidence keys and restarts (the
-- counts themselves are derived from tool_invocations).

CREATE INDEX tool_invocations_identical
    ON tool_invocations (run_id, tool_name, arguments_hash, outcome_status, reason_code);

CREATE TABLE breaker_evidence (
    tenant_id       TEXT NOT NULL,
    run_id          TEXT NOT NULL,
    tool_name       TEXT NOT NULL,
    arguments_hash  TEXT NOT NULL,
    evidence_key    TEXT NOT NULL,
    base            INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, tool_name, arguments_hash)
);

CREATE TABLE breaker_runs (
    tenant_id  TEXT NOT NULL,
    run_id     TEXT PRIMARY KEY,
    restarts   INTEGER NOT NULL DEFAULT 0
);
