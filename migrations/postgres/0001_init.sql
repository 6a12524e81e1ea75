-- toolgate 0001: workers, tool_invocations, approvals, artifacts, the events
-- outbox.
-- Tenant-owned tables carry tenant_id and row-level security keyed on the
-- per-transaction setting toolgate.tenant_id; system work (recovery, the
-- operator's event stream) sets toolgate.scope = 'system' instead.

CREATE TABLE workers (
    worker_id         UUID PRIMARY KEY,
    node              TEXT NOT NULL,
    started_at        TIMESTAMPTZ NOT NULL,
    heartbeat_at      TIMESTAMPTZ NOT NULL,
    lease_expires_at  TIMESTAMPTZ NOT NULL,
    released_at       TIMESTAMPTZ NULL
);

CREATE TABLE tool_invocations (
    id                 UUID PRIMARY KEY,
    tenant_id          TEXT NOT NULL,
    session_id         UUID NOT NULL,
    run_id             UUID NOT NULL,
    step_number        BIGINT NOT NULL,
    call_id            TEXT NOT NULL,
    tool_name          TEXT NOT NULL,
    tool_version       TEXT NOT NULL,
    arguments          JSONB NOT NULL,
    arguments_hash     TEXT NOT NULL,
    idempotency_key    TEXT NOT NULL UNIQUE,
    status             TEXT NOT NULL,
    principal          JSONB NOT NULL,
    result             JSONB NULL,
    error              JSONB NULL,
    created_at         TIMESTAMPTZ NOT NULL,
    started_at         TIMESTAMPTZ NULL,
    completed_at       TIMESTAMPTZ NULL,
    worker_id          UUID NULL,
    lease_epoch        BIGINT NOT NULL DEFAULT 0,
    deadline_at        TIMESTAMPTZ NULL,
    approval_id        UUID NULL,
    side_effect        TEXT NOT NULL,
    -- the design document's additions
    tool_source        TEXT NOT NULL DEFAULT 'builtin',
    server_id          TEXT NULL,
    idempotency_class  TEXT NOT NULL,
    effect_sent_at     TIMESTAMPTZ NULL,
    attempt_number     INT NOT NULL DEFAULT 1,
    suspended_kind     TEXT NULL,
    suspended_ref      TEXT NULL,
    output_bytes       BIGINT NULL,
    truncated          BOOLEAN NOT NULL DEFAULT false,
    artifact_id        UUID NULL,
    outcome_status     TEXT NULL,
    reason_code        TEXT NULL,
    origin_trust       TEXT NOT NULL,
    parallel_group     UUID NULL,
    CHECK (status IN ('proposed', 'authorized', 'waiting_for_approval', 'running',
                      'succeeded', 'failed', 'denied', 'uncertain'))
);

CREATE INDEX tool_invocations_by_run ON tool_invocations (tenant_id, run_id, step_number, created_at);
CREATE INDEX tool_invocations_in_flight ON tool_invocations (worker_id)
    WHERE status = 'running' AND suspended_kind IS NULL;

CREATE TABLE approvals (
    id              UUID PRIMARY KEY,
    tenant_id       TEXT NOT NULL,
    invocation_id   UUID NOT NULL UNIQUE REFERENCES tool_invocations (id),
    tool_name       TEXT NOT NULL,
    reason_code     TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'denied', 'expired')),
    approver        TEXT NULL,
    requested_at    TIMESTAMPTZ NOT NULL,
    decided_at      TIMESTAMPTZ NULL
);

CREATE INDEX approvals_pending ON approvals (tenant_id, requested_at) WHERE status = 'pending';

-- What the artifact store holds, recorded with the result that made it.
CREATE TABLE artifacts (
    id             UUID PRIMARY KEY,
    tenant_id      TEXT NOT NULL,
    run_id         UUID NOT NULL,
    invocation_id  UUID NOT NULL REFERENCES tool_invocations (id),
    media_type     TEXT NOT NULL,
    bytes          BIGINT NOT NULL,
    trust          TEXT NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL
);

-- The outbox. txid lets a reader stop below the oldest transaction still
-- running, so an id committed late is never skipped.
CREATE TABLE events (
    id          BIGSERIAL PRIMARY KEY,
    tenant_id   TEXT NULL,
    event_type  TEXT NOT NULL,
    payload     JSONB NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    txid        xid8 NOT NULL DEFAULT pg_current_xact_id()
);

ALTER TABLE tool_invocations ENABLE ROW LEVEL SECURITY;
ALTER TABLE tool_invocations FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tool_invocations
    USING (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true))
    WITH CHECK (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true));

ALTER TABLE approvals ENABLE ROW LEVEL SECURITY;
ALTER TABLE approvals FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON approvals
    USING (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true))
    WITH CHECK (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true));

ALTER TABLE artifacts ENABLE ROW LEVEL SECURITY;
ALTER TABLE artifacts FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON artifacts
    USING (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true))
    WITH CHECK (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true));

ALTER TABLE events ENABLE ROW LEVEL SECURITY;
ALTER TABLE events FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON events
    USING (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true))
    WITH CHECK (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true));
