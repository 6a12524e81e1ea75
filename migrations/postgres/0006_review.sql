-- toolgate 0006: the review queue's resolutions. A human's verdict on an
-- UNCERTAIN invocation is its own row; the invocation's record is never
-- changed by it.

CREATE TABLE review_resolutions (
    id             UUID PRIMARY KEY,
    tenant_id      TEXT NOT NULL,
    invocation_id  UUID NOT NULL UNIQUE REFERENCES tool_invocations (id),
    resolution     TEXT NOT NULL,
    resolver       TEXT NOT NULL,
    note           TEXT NULL,
    resolved_at    TIMESTAMPTZ NOT NULL
);

ALTER TABLE review_resolutions ENABLE ROW LEVEL SECURITY;
ALTER TABLE review_resolutions FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON review_resolutions
    USING (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true))
    WITH CHECK (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true));
