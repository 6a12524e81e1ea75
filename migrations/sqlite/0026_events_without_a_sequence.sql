-- toolgate 0026 for SQLite: an event's id is its row's, without
-- AUTOINCREMENT. AUTOINCREMENT kept the highest id ever given in
-- sqlite_sequence, a page every commit that writes events rewrote (two of a
-- read's twenty pages); toolgate never deletes an event, so the highest id
-- given is the highest id held, and a new row's (one above it) is the same
-- id AUTOINCREMENT gave, in commit order under the one writer. SQLite cannot
-- drop AUTOINCREMENT from a table, so events is rebuilt, its indexes with it.

CREATE TABLE events_rebuilt (
    id          INTEGER PRIMARY KEY,
    tenant_id   TEXT NULL,
    event_type  TEXT NOT NULL,
    payload     TEXT NOT NULL,
    created_at  INTEGER NOT NULL
);

INSERT INTO events_rebuilt (id, tenant_id, event_type, payload, created_at)
    SELECT id, tenant_id, event_type, payload, created_at FROM events ORDER BY id;

DROP TABLE events;
ALTER TABLE events_rebuilt RENAME TO events;
DELETE FROM sqlite_sequence WHERE name = 'events';

CREATE INDEX events_by_invocation ON events (json_extract(payload, '$.invocation_id'), id);
CREATE INDEX events_by_server ON events (json_extract(payload, '$.server'), id)
    WHERE event_type IN ('mcp.server.connected', 'mcp.server.pinned', 'mcp.server.disconnected');
