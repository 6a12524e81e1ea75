-- toolgate 0015: an invocation may be put to a human more than once.
-- Recovery reopens a held row's approval when its standing authority is
-- gone (the transition `reopen_approval`), and every decision stays on
-- record, so an invocation has an approval per time it was asked.

ALTER TABLE approvals DROP CONSTRAINT approvals_invocation_id_key;
CREATE INDEX approvals_by_invocation ON approvals (invocation_id);
