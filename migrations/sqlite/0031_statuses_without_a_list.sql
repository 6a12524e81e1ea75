-- toolgate 0031 for SQLite: the CHECKs on a call's, an approval's and a
-- turn's status are written as equalities, not as lists.
--
-- SQLite tests a constant list of more than two values through a temporary
-- b-tree built each time the statement runs (see 0030), and a CHECK is
-- tested by every INSERT and by every UPDATE that sets its column: a call's
-- intent, its claim and its end each opened, filled and closed one. The
-- same condition as equalities is a few comparisons.
--
-- SQLite cannot alter a CHECK. Rebuilding the tables would copy every row
-- (a minute and three quarters of the file again at a million calls), so
-- the tables' recorded definitions are edited in place instead, as SQLite
-- documents for changes that leave what is stored as it is
-- (https://sqlite.org/lang_altertable.html#otheralter): each new CHECK
-- holds exactly where the old one held, so every row still satisfies it.
-- RESET reloads the schema, which fails the migration if an edited
-- definition does not parse; the guard table fails it unless all three
-- were edited, and creating it moves the schema's version on, so every
-- other connection reloads the schema too. PostgreSQL tests a list in
-- place and is unchanged (its 0031 changes nothing).

PRAGMA writable_schema = ON;
UPDATE sqlite_schema SET sql = replace(sql,
    'CHECK (status IN (''proposed'', ''authorized'', ''waiting_for_approval'', ''running'',
                      ''succeeded'', ''failed'', ''denied'', ''uncertain''))',
    'CHECK (status = ''proposed'' OR status = ''authorized'' OR status = ''waiting_for_approval''
           OR status = ''running'' OR status = ''succeeded'' OR status = ''failed''
           OR status = ''denied'' OR status = ''uncertain'')')
    WHERE type = 'table' AND name = 'tool_invocations';
UPDATE sqlite_schema SET sql = replace(sql,
    'CHECK (status IN (''pending'', ''approved'', ''denied'', ''expired''))',
    'CHECK (status = ''pending'' OR status = ''approved'' OR status = ''denied''
                                         OR status = ''expired'')')
    WHERE type = 'table' AND name = 'approvals';
UPDATE sqlite_schema SET sql = replace(sql,
    'CHECK (state IN (''open'', ''closed'', ''expired'', ''suspended''))',
    'CHECK (state = ''open'' OR state = ''closed'' OR state = ''expired''
                                        OR state = ''suspended'')')
    WHERE type = 'table' AND name = 'turns';
PRAGMA writable_schema = RESET;

CREATE TABLE toolgate_checks_edited (edited INTEGER NOT NULL CHECK (edited = 3));
INSERT INTO toolgate_checks_edited
    SELECT count(*) FROM sqlite_schema
    WHERE type = 'table' AND name IN ('tool_invocations', 'approvals', 'turns')
      AND sql NOT LIKE '% IN (%';
DROP TABLE toolgate_checks_edited;
