-- toolgate 0015 for SQLite: an invocation may be put to a human more than
-- once (see the PostgreSQL migration). SQLite cannot drop a column's
-- UNIQUE, so approvals is rebuilt (the runner turns foreign keys off around
-- a rebuild and checks them before committing), its indexes with it.

CREATE TABLE approvals_rebuilt (
    id              TEXT PRIMARY KEY,
    tenant_id       TEXT NOT NULL,
    invocation_id   TEXT NOT NULL REFERENCES tool_invocations (id),
    tool_name       TEXT NOT NULL,
    reason_code     TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'denied', 'expired')),
    approver        TEXT NULL,
    requested_at    INTEGER NOT NULL,
    decided_at      INTEGER NULL
);
INSERT INTO approvals_rebuilt (id, tenant_id, invocation_id, tool_name, reason_code, status, approver, requested_at, decided_at)
    SELECT id, tenant_id, invocation_id, tool_name, reason_code, status, approver, requested_at, decided_at FROM approvals;
DROP TABLE approvals;
ALTER TABLE approvals_rebuilt RENAME TO approvals;
CREATE INDEX approvals_pending ON approvals (tenant_id, requested_at) WHERE status = 'pending';
CREATE INDEX approvals_by_invocation ON approvals (invocation_id);
