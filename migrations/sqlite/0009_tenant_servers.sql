-- toolgate 0009 for SQLite: which mcp_servers rows a tenant wrote.

ALTER TABLE mcp_servers ADD COLUMN tenant_configured INTEGER NOT NULL DEFAULT 0;
