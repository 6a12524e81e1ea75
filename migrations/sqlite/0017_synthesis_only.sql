-- toolgate 0017 for SQLite: the step after which a run only answers (see
-- the PostgreSQL migration).

CREATE TABLE breaker_synthesis (
    tenant_id   TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    after_step  INTEGER NOT NULL,
    PRIMARY KEY (run_id, tenant_id)
);
