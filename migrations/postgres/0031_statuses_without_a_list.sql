-- toolgate 0031 for PostgreSQL: nothing changes. SQLite's 0031 writes the
-- CHECKs on a call's, an approval's and a turn's status as equalities
-- because SQLite tests a constant list through a temporary b-tree for
-- every row it writes; PostgreSQL tests a list in place. The versions of
-- both stores stay in step.

SELECT 1;
