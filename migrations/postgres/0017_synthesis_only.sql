-- toolgate 0017: answer before the limit (ADR-0136). Once a step leaves an
-- identical-call count one below the loop threshold, every later step of
-- the run is synthesis-only: its calls are refused `tool.loop_detected`
-- before dispatch. The step is kept here, so a restart, another node or an
-- approval resumed later obeys it as the node that saw it did.

CREATE TABLE breaker_synthesis (
    tenant_id   TEXT NOT NULL,
    run_id      UUID NOT NULL,
    -- the earliest step after which the run only answers
    after_step  BIGINT NOT NULL,
    PRIMARY KEY (run_id, tenant_id)
);

ALTER TABLE breaker_synthesis ENABLE ROW LEVEL SECURITY;
ALTER TABLE breaker_synthesis FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON breaker_synthesis
    USING (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true))
    WITH CHECK (current_setting('toolgate.scope', true) = 'system'
           OR tenant_id = current_setting('toolgate.tenant_id', true));

-- An uncounted insert goes in only where the breaker has nothing to say:
-- no identical call has an outcome, and the run is not synthesis-only for
-- the call's step.
CREATE OR REPLACE FUNCTION toolgate_insert_uncounted(
    p_tenant text, p_id uuid, p_session uuid, p_run uuid, p_step bigint, p_call text, p_tool text,
    p_version text, p_source text, p_server text, p_arguments jsonb, p_hash text, p_key text, p_status text,
    p_class text, p_side_effect text, p_principal jsonb, p_origin text, p_group uuid, p_deadline timestamptz,
    p_approval uuid, p_reason text, p_outcome text, p_worker uuid, p_now timestamptz, p_completed timestamptz,
    p_kinds text[], p_bodies jsonb[])
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
        p_completed, p_kinds, p_bodies) AS i WHERE i.id = p_id;
END $$;

-- The breaker's tally reads the run's synthesis step with its counts, in
-- the same statement (a row of its own, `t_synthesis` set).
DROP FUNCTION toolgate_tally(text, uuid, text, text);
CREATE FUNCTION toolgate_tally(p_tenant text, p_run uuid, p_tool text, p_hash text)
RETURNS TABLE (t_status text, t_code text, t_count bigint, t_base bigint, t_synthesis bigint)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM toolgate_scope(p_tenant);
    RETURN QUERY
        SELECT i.outcome_status, i.reason_code, count(*), NULL::bigint, NULL::bigint
        FROM tool_invocations i
        WHERE i.tenant_id = p_tenant AND i.run_id = p_run AND i.tool_name = p_tool
          AND i.arguments_hash = p_hash AND i.outcome_status IS NOT NULL
        GROUP BY i.outcome_status, i.reason_code
        UNION ALL
        SELECT NULL, NULL, NULL, b.base, NULL FROM breaker_evidence b
        WHERE b.tenant_id = p_tenant AND b.run_id = p_run AND b.tool_name = p_tool AND b.arguments_hash = p_hash
        UNION ALL
        SELECT NULL, NULL, NULL, NULL, s.after_step FROM breaker_synthesis s
        WHERE s.tenant_id = p_tenant AND s.run_id = p_run;
END $$;
