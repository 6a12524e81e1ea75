-- toolgate 0009: which mcp_servers rows a tenant wrote. Preparation writes
-- the operator's servers into every tenant's rows too; only a tenant's own
-- rows are dialled for that tenant as its servers.

ALTER TABLE mcp_servers ADD COLUMN tenant_configured BOOLEAN NOT NULL DEFAULT false;
