-- toolgate 0002: the unified circuit breaker. Its counts are derived from
-- tool_invocations itself (one counter keyed on name, arguments hash,
-- outcome status and reason code, per run), so they are exactly as durable
-- as the rows. What rows cannot hold is kept here: the last evidence key per
-- identical call, never stored with the result, and the restarts it bought.

CREATE INDEX tool_invocations_identical
    ON tool_invocations (run_id, tool_name, arguments_hash, outcome_status, reason_code);

CREATE TABLE breaker_evidence (
    tenant_id       TEXT NOT NULL,
    run_id          UUID NOT NULL,
    tool_name       TEXT NOT NULL,
    arguments_hash  TEXT NOT NULL,
    evidence_key    TEXT NOT NULL,
    -- successful identical calls before the count last restarted
    base            BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, tool_name, arguments_hash)
);

CREATE TABLE breaker_runs (
    tenant_id  TEXT NOT NULL,
    run_id     UUID PRIMARY KEY,
    restarts   INT NOT NULL DEFAULT 0
);

ALTER TABLE breaker_evidence ENABLE ROW LEVEL SECURITY;
ALTER TABLE breaker_evidence FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON breaker_evidence
    USING (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true))
    WITH CHECK (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true));

ALTER TABLE breaker_runs ENABLE ROW LEVEL SECURITY;
ALTER TABLE breaker_runs FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON breaker_runs
    USING (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true))
    WITH CHECK (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true));
