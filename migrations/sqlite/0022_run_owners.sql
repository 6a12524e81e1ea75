-- toolgate 0022 for SQLite: a run is its opener's (see the PostgreSQL
-- migration).

CREATE TABLE runs (
    tenant_id     TEXT NOT NULL,
    run_id        TEXT NOT NULL,
    principal_id  TEXT NOT NULL,
    session_id    TEXT NOT NULL,
    opened_at     INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, run_id)
);

-- SQLite takes the bare columns from the row holding min(created_at).
INSERT INTO runs (run_id, tenant_id, principal_id, session_id, opened_at)
    SELECT run_id, tenant_id, json_extract(principal, '$.id'), session_id, min(created_at)
    FROM tool_invocations GROUP BY tenant_id, run_id;
