-- toolgate 0018 for SQLite: skills a tenant's agents wrote (see the
-- PostgreSQL migration).

CREATE TABLE skills (
    tenant_id       TEXT NOT NULL,
    name            TEXT NOT NULL,
    description     TEXT NOT NULL,
    body            TEXT NOT NULL,
    required_tools  TEXT NOT NULL,
    version         TEXT NOT NULL,
    author          TEXT NOT NULL,
    written_by_key  TEXT NOT NULL,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, name)
);
