-- toolgate 0023: operators' console sign-ins, kept in the store so that
-- one survives a restart and works on every node. A sign-in is kept by the
-- sha256 of its cookie: the table holds nothing a browser could present.

CREATE TABLE console_sign_ins (
    cookie_sha256  TEXT PRIMARY KEY,
    operator       TEXT NOT NULL,
    signed_in_at   TIMESTAMPTZ NOT NULL,
    expires_at     TIMESTAMPTZ NOT NULL
);

CREATE INDEX console_sign_ins_expiry ON console_sign_ins (expires_at);

-- No tenant's scope reads or writes them.
ALTER TABLE console_sign_ins ENABLE ROW LEVEL SECURITY;
ALTER TABLE console_sign_ins FORCE ROW LEVEL SECURITY;
CREATE POLICY system_only ON console_sign_ins
    USING (current_setting('toolgate.scope', true) = 'system')
    WITH CHECK (current_setting('toolgate.scope', true) = 'system');
