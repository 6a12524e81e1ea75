-- toolgate 0021: the turns still open, by expiry. Every node's sweep looks
-- for open turns past their expiry (a stopped node's), and this keeps that
-- from reading every turn ever recorded.

CREATE INDEX turns_open_by_expiry ON turns (expires_at) WHERE state = 'open';
