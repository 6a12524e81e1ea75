-- toolgate 0008 for SQLite: sessions, so that this node after a restart can
-- serve a session it opened before: what it was opened with, and the hashes of
-- the tool set it pinned, which must be reproduced exactly.

CREATE TABLE sessions (
    session_id          TEXT PRIMARY KEY,
    tenant_id           TEXT NOT NULL,
    principal           TEXT NOT NULL,
    agent               TEXT NOT NULL,
    tool_schema_sha256  TEXT NOT NULL,
    tool_contract_sha256 TEXT NOT NULL,
    opened_at           INTEGER NOT NULL,
    -- Refreshed at most hourly while in use; a session idle a day has ended.
    last_used_at        INTEGER NOT NULL
);

CREATE INDEX sessions_by_last_use ON sessions (last_used_at);
