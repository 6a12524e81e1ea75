-- toolgate 0024 for SQLite: one index leads with the run (see the
-- PostgreSQL migration); every intent writes one index entry fewer.

DROP INDEX tool_invocations_by_run;
