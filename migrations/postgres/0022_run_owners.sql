-- toolgate 0022: a run is its opener's. The first call or turn of a run
-- records the principal it belongs to; a call of another principal of the
-- tenant naming the run is refused before anything is written, so it can
-- neither add steps, trip the run's breaker nor replace its working state.
-- Runs are per tenant: another tenant's run of the same id is its own.

CREATE TABLE runs (
    tenant_id     TEXT NOT NULL,
    run_id        UUID NOT NULL,
    principal_id  TEXT NOT NULL,
    -- the session whose call or turn opened the run
    session_id    UUID NOT NULL,
    opened_at     TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (tenant_id, run_id)
);

-- Runs recorded before this version belong to the principal of their first
-- recorded call.
INSERT INTO runs (run_id, tenant_id, principal_id, session_id, opened_at)
    SELECT DISTINCT ON (tenant_id, run_id) run_id, tenant_id, principal->>'id', session_id, created_at
    FROM tool_invocations ORDER BY tenant_id, run_id, created_at, id;

ALTER TABLE runs ENABLE ROW LEVEL SECURITY;
ALTER TABLE runs FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON runs
    USING (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true))
    WITH CHECK (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true));
