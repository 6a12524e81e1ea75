-- toolgate 0010 for SQLite: nothing to change; step 13 writes every
-- artifact a call produced in its transaction.
SELECT 1;
