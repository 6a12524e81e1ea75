-- toolgate 0007 for SQLite: no index a lookup by id could fall into leads with the
-- tenant. Every lookup by run names the run, and every hot-path write names
-- the row's id. An index led by tenant_id let the planner, before statistics
-- existed (a new database, or one tenant holding every row), read
-- `tenant_id = $1` as one row and scan the tenant's whole index for each
-- claim and completion instead of the primary key: database work that grew
-- with the table.
--
-- Applied in the migration's transaction: writes to tool_invocations wait
-- while the two indexes build, which on a large table is worth a quiet
-- moment.

DROP INDEX tool_invocations_by_run;
CREATE INDEX tool_invocations_by_run ON tool_invocations (run_id, step_number, created_at);

-- The review queue reads one tenant's UNCERTAIN rows, oldest first. Only a
-- query that names that outcome can use it.
CREATE INDEX tool_invocations_uncertain ON tool_invocations (tenant_id, completed_at)
    WHERE outcome_status = 'uncertain';
