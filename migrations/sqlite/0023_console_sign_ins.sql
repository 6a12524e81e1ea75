-- toolgate 0023 for SQLite: operators' console sign-ins, kept in the store
-- (see the PostgreSQL migration).

CREATE TABLE console_sign_ins (
    cookie_sha256  TEXT PRIMARY KEY,
    operator       TEXT NOT NULL,
    signed_in_at   INTEGER NOT NULL,
    expires_at     INTEGER NOT NULL
);

CREATE INDEX console_sign_ins_expiry ON console_sign_ins (expires_at);
