-- toolgate 0013: leases on the database's clock, and a node's identity
-- told from a copy of it.
-- A worker records where its node folder is (a fingerprint of the host's
-- boot and the folder), so a second process started from a copy of the
-- folder is refused while the original's lease is live. The effect
-- watermark is set only while its worker's lease is live on the database's
-- clock: a worker that lost its lease (paused past it, or released by a
-- copy) never starts an effect.

ALTER TABLE workers ADD COLUMN host TEXT NOT NULL DEFAULT '';
CREATE INDEX workers_holding_node ON workers (node) WHERE released_at IS NULL;

CREATE OR REPLACE FUNCTION toolgate_mark_effect_sent(p_tenant text, p_id uuid, p_worker uuid, p_epoch bigint, p_now timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM toolgate_scope(p_tenant);
    UPDATE tool_invocations SET effect_sent_at = COALESCE(effect_sent_at, p_now)
    WHERE id = p_id AND status = 'running' AND worker_id = p_worker AND lease_epoch = p_epoch
      AND tenant_id = p_tenant
      AND EXISTS (SELECT 1 FROM workers w WHERE w.worker_id = p_worker
                  AND w.released_at IS NULL AND w.lease_expires_at > now());
    RETURN FOUND;
END $$;
