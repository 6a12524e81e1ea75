-- toolgate 0019: where a call's arguments came from, as its caller carried
-- it (Decision 9), kept on its row: what policy read, and what recovery's
-- re-check of authority reads again. NULL on a row written before: every
-- argument the model's.

ALTER TABLE tool_invocations ADD COLUMN argument_trust JSONB NULL;

-- The intent functions take the labels as their last argument. The earlier
-- ones stay, so a node of the previous release keeps inserting (its rows
-- without labels) while the nodes are upgraded one by one.
CREATE FUNCTION toolgate_insert(
    p_tenant text, p_id uuid, p_session uuid, p_run uuid, p_step bigint, p_call text, p_tool text,
    p_version text, p_source text, p_server text, p_arguments jsonb, p_hash text, p_key text, p_status text,
    p_class text, p_side_effect text, p_principal jsonb, p_origin text, p_group uuid, p_deadline timestamptz,
    p_approval uuid, p_reason text, p_outcome text, p_worker uuid, p_now timestamptz, p_completed timestamptz,
    p_kinds text[], p_bodies jsonb[], p_argument_trust jsonb)
RETURNS SETOF tool_invocations LANGUAGE plpgsql AS $$
DECLARE
    inserted tool_invocations;
BEGIN
    PERFORM toolgate_scope(p_tenant);
    INSERT INTO tool_invocations (id, tenant_id, session_id, run_id, step_number, call_id, tool_name,
        tool_version, tool_source, server_id, arguments, arguments_hash, idempotency_key, status,
        idempotency_class, side_effect, principal, origin_trust, parallel_group, deadline_at, approval_id,
        reason_code, outcome_status, worker_id, lease_epoch, created_at, completed_at, started_at,
        argument_trust)
    VALUES (p_id, p_tenant, p_session, p_run, p_step, p_call, p_tool, p_version, p_source, p_server,
        p_arguments, p_hash, p_key, p_status, p_class, p_side_effect, p_principal, p_origin, p_group,
        p_deadline, p_approval, p_reason, p_outcome, p_worker, 0, p_now, p_completed,
        CASE WHEN p_status = 'running' THEN p_now END, p_argument_trust)
    ON CONFLICT (idempotency_key, tenant_id) DO NOTHING
    RETURNING * INTO inserted;
    IF NOT FOUND THEN
        RETURN QUERY SELECT * FROM tool_invocations WHERE idempotency_key = p_key AND tenant_id = p_tenant;
        RETURN;
    END IF;
    IF p_approval IS NOT NULL AND p_reason IS NOT NULL THEN
        INSERT INTO approvals (id, tenant_id, invocation_id, tool_name, reason_code, status, requested_at)
        VALUES (p_approval, p_tenant, p_id, p_tool, p_reason, 'pending', p_now);
    END IF;
    PERFORM toolgate_events(p_tenant, p_kinds, p_bodies, p_now);
    RETURN NEXT inserted;
END $$;

CREATE FUNCTION toolgate_insert_uncounted(
    p_tenant text, p_id uuid, p_session uuid, p_run uuid, p_step bigint, p_call text, p_tool text,
    p_version text, p_source text, p_server text, p_arguments jsonb, p_hash text, p_key text, p_status text,
    p_class text, p_side_effect text, p_principal jsonb, p_origin text, p_group uuid, p_deadline timestamptz,
    p_approval uuid, p_reason text, p_outcome text, p_worker uuid, p_now timestamptz, p_completed timestamptz,
    p_kinds text[], p_bodies jsonb[], p_argument_trust jsonb)
RETURNS SETOF tool_invocations LANGUAGE plpgsql AS $$
BEGIN
    PERFORM toolgate_scope(p_tenant);
    IF EXISTS (SELECT 1 FROM tool_invocations i
               WHERE i.tenant_id = p_tenant AND i.run_id = p_run AND i.tool_name = p_tool
                 AND i.arguments_hash = p_hash AND i.outcome_status IS NOT NULL)
       OR EXISTS (SELECT 1 FROM breaker_synthesis s
                  WHERE s.tenant_id = p_tenant AND s.run_id = p_run AND s.after_step < p_step) THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM toolgate_insert(p_tenant, p_id, p_session, p_run, p_step, p_call, p_tool,
        p_version, p_source, p_server, p_arguments, p_hash, p_key, p_status, p_class, p_side_effect,
        p_principal, p_origin, p_group, p_deadline, p_approval, p_reason, p_outcome, p_worker, p_now,
        p_completed, p_kinds, p_bodies, p_argument_trust) AS i WHERE i.id = p_id;
END $$;
