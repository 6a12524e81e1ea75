-- toolgate 0029: the rows a worker holds are found through an index of
-- their own. Recovery's sweep looks for held rows (authorized or running)
-- whose worker is gone, oldest first; tool_invocations_in_flight held only
-- running rows by worker, which that question cannot use, so the sweep
-- read the whole table when none was held (a sequential scan before
-- statistics). tool_invocations_held holds the held rows alone, by creation, and
-- replaces tool_invocations_in_flight, which nothing read.
--
-- SQLite's tool_invocations_identical no longer holds a call's outcome, so
-- ending a call leaves its entry where it is. Here ending a call changes
-- indexed columns (status, completed_at), so the row's new version gets an
-- entry in every index whatever this one holds, and the outcome in its key
-- keeps the breaker's tally an index-only scan: it stays.

DROP INDEX tool_invocations_in_flight;
CREATE INDEX tool_invocations_held ON tool_invocations (created_at)
    WHERE status IN ('authorized', 'running');
