-- toolgate 0011: a read's intent and claim are one commit. A row inserted
-- RUNNING starts now, under the inserting worker's epoch-0 fence; every
-- other insert is as before.

CREATE OR REPLACE FUNCTION toolgate_insert(
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
        reason_code, outcome_status, worker_id, lease_epoch, created_at, completed_at, started_at)
    VALUES (p_id, p_tenant, p_session, p_run, p_step, p_call, p_tool, p_version, p_source, p_server,
        p_arguments, p_hash, p_key, p_status, p_class, p_side_effect, p_principal, p_origin, p_group,
        p_deadline, p_approval, p_reason, p_outcome, p_worker, 0, p_now, p_completed,
        CASE WHEN p_status = 'running' THEN p_now END)
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
