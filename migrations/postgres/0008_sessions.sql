-- toolgate 0008: sessions, so that any node sharing this database (and this
-- one after a restart) can serve a session another opened: what it was
-- opened with, and the hashes of the tool set it pinned, which the node that
-- takes it over must reproduce exactly.

CREATE TABLE sessions (
    session_id          UUID PRIMARY KEY,
    tenant_id           TEXT NOT NULL,
    principal           JSONB NOT NULL,
    agent               JSONB NOT NULL,
    tool_schema_sha256  TEXT NOT NULL,
    tool_contract_sha256 TEXT NOT NULL,
    opened_at           TIMESTAMPTZ NOT NULL,
    -- Refreshed at most hourly while in use; a session idle a day has ended.
    last_used_at        TIMESTAMPTZ NOT NULL
);

CREATE INDEX sessions_by_last_use ON sessions (last_used_at);

ALTER TABLE sessions ENABLE ROW LEVEL SECURITY;
ALTER TABLE sessions FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON sessions
    USING (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true))
    WITH CHECK (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true));
