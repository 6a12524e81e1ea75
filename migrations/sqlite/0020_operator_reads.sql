-- toolgate 0020 for SQLite: what the operator's lists read (see the
-- PostgreSQL migration).

ALTER TABLE approvals ADD COLUMN hold_ends_at INTEGER NULL;
ALTER TABLE approvals ADD COLUMN turn_id TEXT NULL;
CREATE INDEX approvals_by_request ON approvals (requested_at, id);

ALTER TABLE sessions ADD COLUMN tool_names TEXT NOT NULL DEFAULT '[]';
CREATE INDEX sessions_by_open ON sessions (opened_at, session_id);

CREATE TABLE turns (
    turn_id        TEXT PRIMARY KEY,
    tenant_id      TEXT NOT NULL,
    session_id     TEXT NOT NULL,
    run_id         TEXT NOT NULL,
    step_number    INTEGER NOT NULL,
    script_sha256  TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state IN ('open', 'closed', 'expired', 'suspended')),
    calls          INTEGER NOT NULL DEFAULT 0,
    opened_at      INTEGER NOT NULL,
    expires_at     INTEGER NOT NULL,
    closed_at      INTEGER NULL
);
CREATE INDEX turns_by_open ON turns (opened_at, turn_id);

CREATE INDEX tool_invocations_by_creation ON tool_invocations (created_at, id);
CREATE INDEX tool_invocations_by_completion ON tool_invocations (completed_at)
    WHERE completed_at IS NOT NULL;
CREATE INDEX mcp_servers_by_creation ON mcp_servers (created_at, id);
CREATE INDEX mcp_tool_catalog_by_discovery ON mcp_tool_catalog (discovered_at, id);

CREATE INDEX events_by_invocation ON events (json_extract(payload, '$.invocation_id'), id);
CREATE INDEX events_by_server ON events (json_extract(payload, '$.server'), id)
    WHERE event_type IN ('mcp.server.connected', 'mcp.server.pinned', 'mcp.server.disconnected');
