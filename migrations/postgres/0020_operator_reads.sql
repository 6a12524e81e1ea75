-- toolgate 0020: what the operator's lists read. An approval records when
-- the caller holding its call stops waiting and the bridge turn it waits
-- in; a session its pinned tools; turns are recorded as they open and close
-- so they stay listable after their socket is gone; indexes serve the
-- newest-first lists, their (time, id) cursors and the health window.

ALTER TABLE approvals ADD COLUMN hold_ends_at TIMESTAMPTZ NULL;
ALTER TABLE approvals ADD COLUMN turn_id UUID NULL;
CREATE INDEX approvals_by_request ON approvals (requested_at, id);

ALTER TABLE sessions ADD COLUMN tool_names JSONB NOT NULL DEFAULT '[]';
CREATE INDEX sessions_by_open ON sessions (opened_at, session_id);

CREATE TABLE turns (
    turn_id        UUID PRIMARY KEY,
    tenant_id      TEXT NOT NULL,
    session_id     UUID NOT NULL,
    run_id         UUID NOT NULL,
    step_number    BIGINT NOT NULL,
    script_sha256  TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state IN ('open', 'closed', 'expired', 'suspended')),
    calls          BIGINT NOT NULL DEFAULT 0,
    opened_at      TIMESTAMPTZ NOT NULL,
    expires_at     TIMESTAMPTZ NOT NULL,
    closed_at      TIMESTAMPTZ NULL
);
CREATE INDEX turns_by_open ON turns (opened_at, turn_id);

ALTER TABLE turns ENABLE ROW LEVEL SECURITY;
ALTER TABLE turns FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON turns
    USING (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true))
    WITH CHECK (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true));

CREATE INDEX tool_invocations_by_creation ON tool_invocations (created_at, id);
CREATE INDEX tool_invocations_by_completion ON tool_invocations (completed_at)
    WHERE completed_at IS NOT NULL;
CREATE INDEX mcp_servers_by_creation ON mcp_servers (created_at, id);
CREATE INDEX mcp_tool_catalog_by_discovery ON mcp_tool_catalog (discovered_at, id);

-- A row's story and a server's last connection are read from the outbox.
CREATE INDEX events_by_invocation ON events ((payload->>'invocation_id'), id)
    WHERE payload ? 'invocation_id';
CREATE INDEX events_by_server ON events ((payload->>'server'), id)
    WHERE event_type IN ('mcp.server.connected', 'mcp.server.pinned', 'mcp.server.disconnected');
