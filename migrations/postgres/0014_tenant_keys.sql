-- toolgate 0014: an idempotency key is unique within its tenant. Two tenants
-- whose calls derive the same key (the same run id, step, call id, tool and
-- arguments) both run; neither learns of the other. The breaker's tables are
-- keyed by tenant too. The key's derivation is unchanged (it is passed
-- verbatim to remote systems); the unique index leads with the key, as no
-- index a lookup by id could fall into may lead with the tenant (0007).

ALTER TABLE tool_invocations DROP CONSTRAINT tool_invocations_idempotency_key_key;
ALTER TABLE tool_invocations ADD CONSTRAINT tool_invocations_key_in_tenant
    UNIQUE (idempotency_key, tenant_id);

ALTER TABLE breaker_evidence DROP CONSTRAINT breaker_evidence_pkey;
ALTER TABLE breaker_evidence ADD PRIMARY KEY (run_id, tool_name, arguments_hash, tenant_id);
ALTER TABLE breaker_runs DROP CONSTRAINT breaker_runs_pkey;
ALTER TABLE breaker_runs ADD PRIMARY KEY (run_id, tenant_id);

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
