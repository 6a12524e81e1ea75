-- toolgate 0033 for SQLite: nothing changes. PostgreSQL's 0033 gives a
-- counted intent an INSERT of its own, planned once per connection rather
-- than on every call; SQLite prepares each statement once and keeps it.
-- The versions of both stores stay in step.

SELECT 1;
