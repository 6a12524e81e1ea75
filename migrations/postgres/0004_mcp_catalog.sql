-- toolgate 0004: the MCP tool catalog, a history rather than a cache. A
-- discovery whose catalog hash is new writes a generation; names that
-- disappeared get withdrawn_at stamped; nothing else is ever updated.

CREATE TABLE mcp_tool_catalog (
    id             UUID PRIMARY KEY,
    tenant_id      TEXT NOT NULL,
    server_id      TEXT NOT NULL,
    catalog_hash   TEXT NOT NULL,
    remote_name    TEXT NOT NULL,
    registry_name  TEXT NOT NULL,
    input_schema   JSONB NOT NULL,
    discovered_at  TIMESTAMPTZ NOT NULL,
    withdrawn_at   TIMESTAMPTZ NULL,
    UNIQUE (tenant_id, server_id, catalog_hash, remote_name)
);

ALTER TABLE mcp_tool_catalog ENABLE ROW LEVEL SECURITY;
ALTER TABLE mcp_tool_catalog FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON mcp_tool_catalog
    USING (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true))
    WITH CHECK (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true));
