-- toolgate 0011 for SQLite: nothing to change; the insert names started_at
-- itself when it writes a read's intent and claim as one commit.
SELECT 1;
