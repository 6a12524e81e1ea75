-- toolgate 0013 for SQLite: a worker records where its node folder is, so
-- a process started from a copy of the folder is refused while the
-- original's lease is live. (One node: its clock is the store's.)

ALTER TABLE workers ADD COLUMN host TEXT NOT NULL DEFAULT '';
CREATE INDEX workers_holding_node ON workers (node) WHERE released_at IS NULL;
