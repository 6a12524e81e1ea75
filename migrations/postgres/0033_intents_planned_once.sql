-- toolgate 0033: a counted intent's INSERT is planned once per connection,
-- not on every call.
--
-- 0032's intent asked the breaker's question in its INSERT's condition,
-- `WHERE NOT p_uncounted OR NOT EXISTS ...`. PL/pgSQL keeps a statement's
-- plan for its parameters (a custom plan) for its first five runs and then
-- keeps the generic plan only if it costs no more than they did. Planned
-- for a counted intent (p_uncounted false), the condition folds away, so
-- the custom plan cost less than the generic one with its two subqueries,
-- and PostgreSQL planned the 29-column INSERT again on every counted
-- intent (a recovered call's, or one its policy did not simply allow):
-- pg_stat_statements counted 41 plans in 40 runs. Each kind of intent now
-- has its own INSERT, whose plan is the same for any values, so each is
-- planned as often as any other statement of the hot path (six times per
-- connection: five custom plans, then the generic one kept).
--
-- The function keeps its name, arguments and answer, so it is replaced in
-- place, and a node of the previous release calls it as before.

CREATE OR REPLACE FUNCTION toolgate_write_intent(
    p_tenant text, p_id uuid, p_session uuid, p_run uuid, p_step bigint, p_call text, p_tool text,
    p_version text, p_source text, p_server text, p_arguments jsonb, p_hash text, p_key text, p_status text,
    p_class text, p_side_effect text, p_principal jsonb, p_origin text, p_group uuid, p_deadline timestamptz,
    p_approval uuid, p_reason text, p_outcome text, p_worker uuid, p_now timestamptz, p_completed timestamptz,
    p_kinds text[], p_bodies jsonb[], p_argument_trust jsonb, p_uncounted boolean,
    p_synchronous_commit text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    setting text;
BEGIN
    setting := set_config('toolgate.tenant_id', p_tenant, true);
    setting := set_config('toolgate.scope', '', true);
    IF p_synchronous_commit IS NOT NULL THEN
        setting := set_config('synchronous_commit', p_synchronous_commit, true);
    END IF;
    IF p_uncounted THEN
        -- Nothing is inserted while the breaker has something to count: an
        -- identical call of the run with an outcome, or the run's
        -- synthesis-only step before this one.
        INSERT INTO tool_invocations (id, tenant_id, session_id, run_id, step_number, call_id, tool_name,
            tool_version, tool_source, server_id, arguments, arguments_hash, idempotency_key, status,
            idempotency_class, side_effect, principal, origin_trust, parallel_group, deadline_at, approval_id,
            reason_code, outcome_status, worker_id, lease_epoch, created_at, completed_at, started_at,
            argument_trust)
        SELECT p_id, p_tenant, p_session, p_run, p_step, p_call, p_tool, p_version, p_source, p_server,
            p_arguments, p_hash, p_key, p_status, p_class, p_side_effect, p_principal, p_origin, p_group,
            p_deadline, p_approval, p_reason, p_outcome, p_worker, 0, p_now, p_completed,
            CASE WHEN p_status = 'running' THEN p_now END, p_argument_trust
        WHERE NOT EXISTS (SELECT 1 FROM tool_invocations i
                          WHERE i.tenant_id = p_tenant AND i.run_id = p_run AND i.tool_name = p_tool
                            AND i.arguments_hash = p_hash AND i.outcome_status IS NOT NULL)
          AND NOT EXISTS (SELECT 1 FROM breaker_synthesis s
                          WHERE s.tenant_id = p_tenant AND s.run_id = p_run AND s.after_step < p_step)
        ON CONFLICT (idempotency_key, tenant_id) DO NOTHING;
    ELSE
        INSERT INTO tool_invocations (id, tenant_id, session_id, run_id, step_number, call_id, tool_name,
            tool_version, tool_source, server_id, arguments, arguments_hash, idempotency_key, status,
            idempotency_class, side_effect, principal, origin_trust, parallel_group, deadline_at, approval_id,
            reason_code, outcome_status, worker_id, lease_epoch, created_at, completed_at, started_at,
            argument_trust)
        VALUES (p_id, p_tenant, p_session, p_run, p_step, p_call, p_tool, p_version, p_source, p_server,
            p_arguments, p_hash, p_key, p_status, p_class, p_side_effect, p_principal, p_origin, p_group,
            p_deadline, p_approval, p_reason, p_outcome, p_worker, 0, p_now, p_completed,
            CASE WHEN p_status = 'running' THEN p_now END, p_argument_trust)
        ON CONFLICT (idempotency_key, tenant_id) DO NOTHING;
    END IF;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_approval IS NOT NULL AND p_reason IS NOT NULL THEN
        INSERT INTO approvals (id, tenant_id, invocation_id, tool_name, reason_code, status, requested_at)
        VALUES (p_approval, p_tenant, p_id, p_tool, p_reason, 'pending', p_now);
    END IF;
    IF cardinality(p_kinds) > 0 THEN
        INSERT INTO events (tenant_id, event_type, payload, created_at)
        SELECT p_tenant, e.kind, COALESCE(e.body, p_bodies[cardinality(p_bodies)]), p_now
        FROM unnest(p_kinds, p_bodies) AS e(kind, body);
    END IF;
    RETURN true;
END $$;
