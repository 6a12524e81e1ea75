-- toolgate 0004 for SQLite: the MCP tool catalog history.

CREATE TABLE mcp_tool_catalog (
    id             TEXT PRIMARY KEY,
    tenant_id      TEXT NOT NULL,
    server_id      TEXT NOT NULL,
    catalog_hash   TEXT NOT NULL,
    remote_name    TEXT NOT NULL,
    registry_name  TEXT NOT NULL,
    input_schema   TEXT NOT NULL,
    discovered_at  INTEGER NOT NULL,
    withdrawn_at   INTEGER NULL,
    UNIQUE (tenant_id, server_id, catalog_hash, remote_name)
);
