-- toolgate 0012: an allowed call's intent in the same commit that shows the
-- breaker has nothing to count. The row goes in only while no identical call
-- of the run (same tool, same arguments hash) has an outcome, the rows the
-- breaker's tally counts; otherwise, or when the key is already held,
-- nothing is written and nothing comes back, and the caller reads the tally
-- and inserts as before.

CREATE FUNCTION toolgate_insert_uncounted(
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
                 AND i.arguments_hash = p_hash AND i.outcome_status IS NOT NULL) THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM toolgate_insert(p_tenant, p_id, p_session, p_run, p_step, p_call, p_tool,
        p_version, p_source, p_server, p_arguments, p_hash, p_key, p_status, p_class, p_side_effect,
        p_principal, p_origin, p_group, p_deadline, p_approval, p_reason, p_outcome, p_worker, p_now,
        p_completed, p_kinds, p_bodies) AS i WHERE i.id = p_id;
END $$;
