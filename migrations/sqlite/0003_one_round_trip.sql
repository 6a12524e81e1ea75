-- toolgate 0003 for SQLite: nothing. PostgreSQL's 0003 moves each hot-path
-- commit into one statement to save network round trips, which an embedded
-- database does not make. The version exists so both backends count alike.
SELECT 1;
