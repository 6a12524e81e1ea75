-- toolgate 0019 for SQLite: where a call's arguments came from, kept on its
-- row (see the PostgreSQL migration).

ALTER TABLE tool_invocations ADD COLUMN argument_trust TEXT NULL;
