-- toolgate 0021 for SQLite: the turns still open, by expiry (see the
-- PostgreSQL migration).

CREATE INDEX turns_open_by_expiry ON turns (expires_at) WHERE state = 'open';
