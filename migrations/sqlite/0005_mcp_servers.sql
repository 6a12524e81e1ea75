-- toolgate 0005 for SQLite: mcp_servers.

CREATE TABLE mcp_servers (
    id                    TEXT PRIMARY KEY,
    tenant_id             TEXT NOT NULL,
    server_id             TEXT NOT NULL,
    transport             TEXT NOT NULL,
    endpoint              TEXT NOT NULL,
    auth_scheme           TEXT NOT NULL,
    auth_name             TEXT NULL,
    credential_ref        TEXT NULL,
    token_endpoint        TEXT NULL,
    token_scopes          TEXT NULL,
    side_effect           TEXT NOT NULL,
    risk                  TEXT NOT NULL,
    idempotency           TEXT NOT NULL,
    required_scopes       TEXT NOT NULL,
    timeout_seconds       INTEGER NOT NULL,
    maximum_output_bytes  INTEGER NOT NULL,
    enabled               INTEGER NOT NULL DEFAULT 1,
    created_at            INTEGER NOT NULL,
    UNIQUE (tenant_id, server_id)
);
