-- toolgate 0032 for SQLite: nothing changes. PostgreSQL's 0032 gives a
-- call's intent and end functions that answer whether they wrote, not the
-- row; SQLite's statements already do. The versions of both stores stay
-- in step.

SELECT 1;
