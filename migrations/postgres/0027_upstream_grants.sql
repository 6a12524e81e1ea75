-- toolgate 0027: oauth2_user. Each principal's grant at an upstream server,
-- its tokens sealed by the node before they are written (the row holds no
-- token in clear), and the consent flows under way, kept by the sha256 of
-- their state and taken once.

CREATE TABLE upstream_grants (
    tenant_id      TEXT NOT NULL,
    principal_id   TEXT NOT NULL,
    server_id      TEXT NOT NULL,
    issuer         TEXT NOT NULL,
    scopes         JSONB NOT NULL,
    sealed_tokens  TEXT NOT NULL,
    granted_at     TIMESTAMPTZ NOT NULL,
    last_used_at   TIMESTAMPTZ NULL,
    -- A node refreshing the tokens holds this until then: two nodes never
    -- redeem one refresh token.
    refresh_lease_until TIMESTAMPTZ NULL,
    PRIMARY KEY (tenant_id, principal_id, server_id)
);

ALTER TABLE upstream_grants ENABLE ROW LEVEL SECURITY;
ALTER TABLE upstream_grants FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON upstream_grants
    USING (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true))
    WITH CHECK (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true));

CREATE TABLE consent_flows (
    state_sha256     TEXT PRIMARY KEY,
    tenant_id        TEXT NOT NULL,
    principal_id     TEXT NOT NULL,
    server_id        TEXT NOT NULL,
    browser_sha256   TEXT NOT NULL,
    sealed_verifier  TEXT NOT NULL,
    issuer           TEXT NOT NULL,
    iss_required     BOOLEAN NOT NULL,
    token_endpoint   TEXT NOT NULL,
    resource         TEXT NOT NULL,
    scopes           JSONB NOT NULL,
    started_at       TIMESTAMPTZ NOT NULL,
    expires_at       TIMESTAMPTZ NOT NULL
);

CREATE INDEX consent_flows_expiry ON consent_flows (expires_at);
CREATE INDEX consent_flows_by_principal ON consent_flows (tenant_id, principal_id, started_at);

-- A callback names only its state: the flow is found before its tenant is
-- known, so no tenant's scope reads or writes them.
ALTER TABLE consent_flows ENABLE ROW LEVEL SECURITY;
ALTER TABLE consent_flows FORCE ROW LEVEL SECURITY;
CREATE POLICY system_only ON consent_flows
    USING (current_setting('toolgate.scope', true) = 'system')
    WITH CHECK (current_setting('toolgate.scope', true) = 'system');
