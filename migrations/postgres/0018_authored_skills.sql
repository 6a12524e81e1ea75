-- toolgate 0018: skills a tenant's agents wrote through skill.manage, the
-- tenant's own durable state. Loaded through skill.load as
-- EXTERNAL_UNTRUSTED: an agent wrote them.

CREATE TABLE skills (
    tenant_id       TEXT NOT NULL,
    name            TEXT NOT NULL,
    description     TEXT NOT NULL,
    body            TEXT NOT NULL,
    required_tools  JSONB NOT NULL,
    version         TEXT NOT NULL,
    author          TEXT NOT NULL,
    -- the idempotency key of the call that wrote this version
    written_by_key  TEXT NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (tenant_id, name)
);

ALTER TABLE skills ENABLE ROW LEVEL SECURITY;
ALTER TABLE skills FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON skills
    USING (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true))
    WITH CHECK (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true));
