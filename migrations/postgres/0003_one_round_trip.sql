-- toolgate 0003: each commit of the pipeline's hot path as one statement.
-- A function sets the tenant that row-level security reads, makes the write
-- and appends the commit's events, all inside the statement's own
-- transaction: one round trip instead of BEGIN, the write, the events and
-- COMMIT. Functions run as the caller, so row-level security applies.

CREATE FUNCTION toolgate_scope(p_tenant text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('toolgate.tenant_id', p_tenant, true);
    PERFORM set_config('toolgate.scope', '', true);
END $$;

CREATE FUNCTION toolgate_events(p_tenant text, p_kinds text[], p_bodies jsonb[], p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (tenant_id, event_type, payload, created_at)
    SELECT p_tenant, e.kind, e.body, p_now
    FROM unnest(p_kinds, p_bodies) WITH ORDINALITY AS e(kind, body, n)
    ORDER BY e.n;
END $$;

-- The breaker's counter for one identical call: counts by outcome, and the
-- evidence base in a row of its own (t_base set, the rest null).
CREATE FUNCTION toolgate_tally(p_tenant text, p_run uuid, p_tool text, p_hash text)
RETURNS TABLE (t_status text, t_code text, t_count bigint, t_base bigint) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM toolgate_scope(p_tenant);
    RETURN QUERY
        SELECT i.outcome_status, i.reason_code, count(*), NULL::bigint
        FROM tool_invocations i
        WHERE i.tenant_id = p_tenant AND i.run_id = p_run AND i.tool_name = p_tool
          AND i.arguments_hash = p_hash AND i.outcome_status IS NOT NULL
        GROUP BY i.outcome_status, i.reason_code
        UNION ALL
        SELECT NULL, NULL, NULL, b.base FROM breaker_evidence b
        WHERE b.tenant_id = p_tenant AND b.run_id = p_run AND b.tool_name = p_tool AND b.arguments_hash = p_hash;
END $$;

-- Step 8 (or 7, or a denial): the row, its approval and its events; or the
-- row already holding the key, unchanged.
CREATE FUNCTION toolgate_insert(
    p_tenant text, p_id uuid, p_session uuid, p_run uuid, p_step bigint, p_call text, p_tool text,
    p_version text, p_source text, p_server text, p_arguments jsonb, p_hash text, p_key text, p_status text,
    p_class text, p_side_effect text, p_principal jsonb, p_origin text, p_group uuid, p_deadline timestamptz,
    p_approval uuid, p_reason text, p_outcome text, p_worker uuid, p_now timestamptz, p_completed timestamptz,
    p_kinds text[], p_bodies jsonb[])
RETURNS SETOF tool_invocations LANGUAGE plpgsql AS $$
DECLARE
    inserted tool_invocations;
BEGIN
    PERFORM toolgate_scope(p_tenant);
    INSERT INTO tool_invocations (id, tenant_id, session_id, run_id, step_number, call_id, tool_name,
        tool_version, tool_source, server_id, arguments, arguments_hash, idempotency_key, status,
        idempotency_class, side_effect, principal, origin_trust, parallel_group, deadline_at, approval_id,
        reason_code, outcome_status, worker_id, lease_epoch, created_at, completed_at)
    VALUES (p_id, p_tenant, p_session, p_run, p_step, p_call, p_tool, p_version, p_source, p_server,
        p_arguments, p_hash, p_key, p_status, p_class, p_side_effect, p_principal, p_origin, p_group,
        p_deadline, p_approval, p_reason, p_outcome, p_worker, 0, p_now, p_completed)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING * INTO inserted;
    IF NOT FOUND THEN
        RETURN QUERY SELECT * FROM tool_invocations WHERE idempotency_key = p_key;
        RETURN;
    END IF;
    IF p_approval IS NOT NULL AND p_reason IS NOT NULL THEN
        INSERT INTO approvals (id, tenant_id, invocation_id, tool_name, reason_code, status, requested_at)
        VALUES (p_approval, p_tenant, p_id, p_tool, p_reason, 'pending', p_now);
    END IF;
    PERFORM toolgate_events(p_tenant, p_kinds, p_bodies, p_now);
    RETURN NEXT inserted;
END $$;

-- Step 9: AUTHORIZED to RUNNING under a new fence, with its events.
CREATE FUNCTION toolgate_claim(
    p_tenant text, p_id uuid, p_worker uuid, p_epoch bigint, p_now timestamptz, p_kinds text[], p_bodies jsonb[])
RETURNS SETOF tool_invocations LANGUAGE plpgsql AS $$
DECLARE
    claimed tool_invocations;
BEGIN
    PERFORM toolgate_scope(p_tenant);
    UPDATE tool_invocations SET status = 'running', lease_epoch = lease_epoch + 1, started_at = p_now,
        attempt_number = CASE WHEN started_at IS NULL THEN attempt_number ELSE attempt_number + 1 END
    WHERE id = p_id AND status = 'authorized' AND worker_id = p_worker AND lease_epoch = p_epoch
      AND tenant_id = p_tenant
    RETURNING * INTO claimed;
    IF FOUND THEN
        PERFORM toolgate_events(p_tenant, p_kinds, p_bodies, p_now);
        RETURN NEXT claimed;
    END IF;
END $$;

-- The effect watermark: set once, under the current fence.
CREATE FUNCTION toolgate_mark_effect_sent(p_tenant text, p_id uuid, p_worker uuid, p_epoch bigint, p_now timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM toolgate_scope(p_tenant);
    UPDATE tool_invocations SET effect_sent_at = COALESCE(effect_sent_at, p_now)
    WHERE id = p_id AND status = 'running' AND worker_id = p_worker AND lease_epoch = p_epoch
      AND tenant_id = p_tenant;
    RETURN FOUND;
END $$;

-- Step 13: the terminal write under the current fence, the artifact record
-- and the events.
CREATE FUNCTION toolgate_complete(
    p_tenant text, p_id uuid, p_worker uuid, p_epoch bigint, p_status text, p_outcome text, p_reason text,
    p_result jsonb, p_error jsonb, p_output_bytes bigint, p_truncated boolean, p_artifact uuid,
    p_artifact_media text, p_artifact_bytes bigint, p_artifact_trust text, p_now timestamptz,
    p_kinds text[], p_bodies jsonb[])
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM toolgate_scope(p_tenant);
    UPDATE tool_invocations SET status = p_status, outcome_status = p_outcome, reason_code = p_reason,
        result = p_result, error = p_error, output_bytes = p_output_bytes, truncated = p_truncated,
        artifact_id = p_artifact, completed_at = p_now
    WHERE id = p_id AND status IN ('authorized', 'running') AND tenant_id = p_tenant
      AND worker_id = p_worker AND lease_epoch = p_epoch;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_artifact IS NOT NULL THEN
        INSERT INTO artifacts (id, tenant_id, run_id, invocation_id, media_type, bytes, trust, created_at)
        SELECT p_artifact, tenant_id, run_id, id, p_artifact_media, p_artifact_bytes, p_artifact_trust, p_now
        FROM tool_invocations WHERE id = p_id;
    END IF;
    PERFORM toolgate_events(p_tenant, p_kinds, p_bodies, p_now);
    RETURN true;
END $$;
