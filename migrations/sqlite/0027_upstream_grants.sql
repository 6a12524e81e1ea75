-- toolgate 0027 for SQLite: oauth2_user's grants and consent flows (see the
-- PostgreSQL migration).

CREATE TABLE upstream_grants (
    tenant_id      TEXT NOT NULL,
    principal_id   TEXT NOT NULL,
    server_id      TEXT NOT NULL,
    issuer         TEXT NOT NULL,
    scopes         TEXT NOT NULL,
    sealed_tokens  TEXT NOT NULL,
    granted_at     INTEGER NOT NULL,
    last_used_at   INTEGER NULL,
    -- A node refreshing the tokens holds this until then: two nodes never
    -- redeem one refresh token.
    refresh_lease_until INTEGER NULL,
    PRIMARY KEY (tenant_id, principal_id, server_id)
);

CREATE TABLE consent_flows (
    state_sha256     TEXT PRIMARY KEY,
    tenant_id        TEXT NOT NULL,
    principal_id     TEXT NOT NULL,
    server_id        TEXT NOT NULL,
    browser_sha256   TEXT NOT NULL,
    sealed_verifier  TEXT NOT NULL,
    issuer           TEXT NOT NULL,
    iss_required     INTEGER NOT NULL,
    token_endpoint   TEXT NOT NULL,
    resource         TEXT NOT NULL,
    scopes           TEXT NOT NULL,
    started_at       INTEGER NOT NULL,
    expires_at       INTEGER NOT NULL
);

CREATE INDEX consent_flows_expiry ON consent_flows (expires_at);
CREATE INDEX consent_flows_by_principal ON consent_flows (tenant_id, principal_id, started_at);
