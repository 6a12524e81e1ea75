-- toolgate 0005: mcp_servers, the configured servers as the design document
-- specifies them. Operator stdio servers are written per tenant when a
-- session of that tenant first discovers them; credential_ref is a broker
-- reference, never a secret.

CREATE TABLE mcp_servers (
    id                    UUID PRIMARY KEY,
    tenant_id             TEXT NOT NULL,
    server_id             TEXT NOT NULL,
    transport             TEXT NOT NULL,
    endpoint              TEXT NOT NULL,
    auth_scheme           TEXT NOT NULL,
    auth_name             TEXT NULL,
    credential_ref        TEXT NULL,
    token_endpoint        TEXT NULL,
    token_scopes          JSONB NULL,
    side_effect           TEXT NOT NULL,
    risk                  TEXT NOT NULL,
    idempotency           TEXT NOT NULL,
    required_scopes       JSONB NOT NULL,
    timeout_seconds       INT NOT NULL,
    maximum_output_bytes  BIGINT NOT NULL,
    enabled               BOOLEAN NOT NULL DEFAULT true,
    created_at            TIMESTAMPTZ NOT NULL,
    UNIQUE (tenant_id, server_id)
);

ALTER TABLE mcp_servers ENABLE ROW LEVEL SECURITY;
ALTER TABLE mcp_servers FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON mcp_servers
    USING (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true))
    WITH CHECK (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true));
