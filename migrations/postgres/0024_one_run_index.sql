-- toolgate 0024: one index leads with the run. Every call asks, before its
-- intent is written, whether an identical call of its run has ended; that
-- question names the run, the tool and the arguments' hash, which
-- tool_invocations_identical answers in a few pages. tool_invocations_by_run
-- (run, step, time) led with the run too, and before statistics existed (a
-- new database) the planner costed both alike and could take it: it then
-- read every row of the run for each call, work that grew with the run.
-- With one index leading with the run the choice no longer rests on
-- statistics, and every intent writes one index entry fewer. A run's calls
-- in step order (a replayed turn, the run's own list) are the identical
-- index's rows of that run, sorted: a run's length, not the table's.

DROP INDEX tool_invocations_by_run;
