-- toolgate 0030 for SQLite: events_by_server's condition is written as
-- three equalities, not as a list.
--
-- SQLite tests a constant list of more than two values (`IN ('a', 'b',
-- 'c')`) through a temporary b-tree built for each statement run, and an
-- INSERT into events tests every partial index's condition. So each event
-- row opened, filled and closed a b-tree of its own, whatever its kind:
-- four a call. The same condition as equalities is three comparisons. The
-- servers' list asks it in the same words, which is what lets SQLite read
-- through the index. PostgreSQL tests a list without a table and is
-- unchanged (its 0030 changes nothing).

DROP INDEX events_by_server;
CREATE INDEX events_by_server ON events (json_extract(payload, '$.server'), id)
    WHERE event_type = 'mcp.server.connected' OR event_type = 'mcp.server.pinned'
        OR event_type = 'mcp.server.disconnected';
