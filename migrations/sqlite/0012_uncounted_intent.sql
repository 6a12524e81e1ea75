-- toolgate 0012 for SQLite: nothing to change; the insert that shows the
-- breaker has nothing to count is one statement of its script.
SELECT 1;
