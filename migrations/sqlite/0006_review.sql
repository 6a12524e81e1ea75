-- toolgate 0006 for SQLite: the review queue's resolutions.

CREATE TABLE review_resolutions (
    id             TEXT PRIMARY KEY,
    tenant_id      TEXT NOT NULL,
    invocation_id  TEXT NOT NULL UNIQUE REFERENCES tool_invocations (id),
    resolution     TEXT NOT NULL,
    resolver       TEXT NOT NULL,
    note           TEXT NULL,
    resolved_at    INTEGER NOT NULL
);
