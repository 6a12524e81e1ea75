-- toolgate 0010: step 13 records every artifact a call produced (the tool's
-- images and blobs as well as the whole-result capture), so their owner can
-- read them through the artifact routes.

DROP FUNCTION toolgate_complete(text, uuid, uuid, bigint, text, text, text, jsonb, jsonb, bigint,
    boolean, uuid, text, bigint, text, timestamptz, text[], jsonb[]);

CREATE FUNCTION toolgate_complete(
    p_tenant text, p_id uuid, p_worker uuid, p_epoch bigint, p_status text, p_outcome text, p_reason text,
    p_result jsonb, p_error jsonb, p_output_bytes bigint, p_truncated boolean, p_artifact uuid,
    p_artifact_media text, p_artifact_bytes bigint, p_artifact_trust text, p_now timestamptz,
    p_kinds text[], p_bodies jsonb[], p_produced jsonb)
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
    INSERT INTO artifacts (id, tenant_id, run_id, invocation_id, media_type, bytes, trust, created_at)
    SELECT (made->>'id')::uuid, invocation.tenant_id, invocation.run_id, invocation.id,
           made->>'media_type', (made->>'bytes')::bigint, made->>'trust', p_now
    FROM tool_invocations invocation, jsonb_array_elements(COALESCE(p_produced, '[]'::jsonb)) made
    WHERE invocation.id = p_id;
    PERFORM toolgate_events(p_tenant, p_kinds, p_bodies, p_now);
    RETURN true;
END $$;
