-- toolgate 0030 for PostgreSQL: nothing changes. SQLite's 0030 writes
-- events_by_server's condition as equalities because SQLite tests a
-- constant list through a temporary b-tree for every event row written;
-- PostgreSQL tests a list in place. The versions of both stores stay in
-- step.

SELECT 1;
