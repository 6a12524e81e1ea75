-- toolgate 0029 for SQLite: the rows a worker holds are found through an
-- index of their own, and the index of identical calls no longer holds a
-- call's outcome.
--
-- Recovery's sweep looks for held rows (authorized or running) whose
-- worker is gone, oldest first. tool_invocations_in_flight held only
-- running rows by worker, which that question cannot use, so the sweep
-- read every row of the table through its creation index, each sweep, on
-- the one writer: at a million calls, every flushed commit waited on it.
-- tool_invocations_held holds the held rows alone, by creation, and
-- replaces tool_invocations_in_flight, which nothing read: a call still
-- writes one entry at its intent and removes it at its end.
--
-- With outcome_status and reason_code in tool_invocations_identical's key,
-- ending a call moved its entry from the run's open calls to its ended
-- ones, two leaf pages away: 2.5 of the 8 pages each call's end commit
-- wrote. The questions it answers name the run, the tool and the
-- arguments' hash, and the rows they match are few (the breaker stops a
-- run's identical calls at its threshold), so their outcomes are read from
-- those rows. PostgreSQL keeps that index whole (see its migration).

DROP INDEX tool_invocations_in_flight;
CREATE INDEX tool_invocations_held ON tool_invocations (created_at)
    WHERE status IN ('authorized', 'running');

DROP INDEX tool_invocations_identical;
CREATE INDEX tool_invocations_identical ON tool_invocations (run_id, tool_name, arguments_hash);
