-- toolgate 0025: each commit of a call runs one function whose statements
-- are its own. The functions they replace called others (the scope, twice
-- for an intent; the insert from the uncounted intent; the events), and
-- each nested call cost PostgreSQL a plan and a frame on every call; the
-- end also ran its produced-artifacts insert when the call produced none.
-- What they write, and when they write nothing, is theirs unchanged. The
-- intent and the end are new functions, and the earlier ones stay, so a
-- node of the previous release keeps working while the nodes are upgraded
-- one by one; the claim, the watermark and the breaker's tally keep their
-- names and arguments and are replaced in place.

-- An intent: the row, its approval when it waits for one, its events. With
-- p_uncounted, nothing is written and nothing comes back while an identical
-- call of the run has an outcome, the breaker has a synthesis-only step
-- before this one, or the key is held already; the caller then reads the
-- tally and asks again counted. Counted, a held key answers its row.
CREATE FUNCTION toolgate_intent(
    p_tenant text, p_id uuid, p_session uuid, p_run uuid, p_step bigint, p_call text, p_tool text,
    p_version text, p_source text, p_server text, p_arguments jsonb, p_hash text, p_key text, p_status text,
    p_class text, p_side_effect text, p_principal jsonb, p_origin text, p_group uuid, p_deadline timestamptz,
    p_approval uuid, p_reason text, p_outcome text, p_worker uuid, p_now timestamptz, p_completed timestamptz,
    p_kinds text[], p_bodies jsonb[], p_argument_trust jsonb, p_uncounted boolean)
RETURNS SETOF tool_invocations LANGUAGE plpgsql AS $$
DECLARE
    inserted tool_invocations;
BEGIN
    PERFORM set_config('toolgate.tenant_id', p_tenant, true), set_config('toolgate.scope', '', true);
    IF p_uncounted AND (
        EXISTS (SELECT 1 FROM tool_invocations i
                WHERE i.tenant_id = p_tenant AND i.run_id = p_run AND i.tool_name = p_tool
                  AND i.arguments_hash = p_hash AND i.outcome_status IS NOT NULL)
        OR EXISTS (SELECT 1 FROM breaker_synthesis s
                   WHERE s.tenant_id = p_tenant AND s.run_id = p_run AND s.after_step < p_step)) THEN
        RETURN;
    END IF;
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
        IF NOT p_uncounted THEN
            RETURN QUERY SELECT * FROM tool_invocations WHERE idempotency_key = p_key AND tenant_id = p_tenant;
        END IF;
        RETURN;
    END IF;
    IF p_approval IS NOT NULL AND p_reason IS NOT NULL THEN
        INSERT INTO approvals (id, tenant_id, invocation_id, tool_name, reason_code, status, requested_at)
        VALUES (p_approval, p_tenant, p_id, p_tool, p_reason, 'pending', p_now);
    END IF;
    IF cardinality(p_kinds) > 0 THEN
        INSERT INTO events (tenant_id, event_type, payload, created_at)
        SELECT p_tenant, e.kind, e.body, p_now
        FROM unnest(p_kinds, p_bodies) WITH ORDINALITY AS e(kind, body, n)
        ORDER BY e.n;
    END IF;
    RETURN NEXT inserted;
END $$;

-- A call's end: the terminal write under the claim's fence, the artifacts
-- the call produced, its events; false when the fence no longer holds.
CREATE FUNCTION toolgate_complete_invocation(
    p_tenant text, p_id uuid, p_worker uuid, p_epoch bigint, p_status text, p_outcome text, p_reason text,
    p_result jsonb, p_error jsonb, p_output_bytes bigint, p_truncated boolean, p_artifact uuid,
    p_artifact_media text, p_artifact_bytes bigint, p_artifact_trust text, p_now timestamptz,
    p_kinds text[], p_bodies jsonb[], p_produced jsonb)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    ended_run uuid;
BEGIN
    PERFORM set_config('toolgate.tenant_id', p_tenant, true), set_config('toolgate.scope', '', true);
    UPDATE tool_invocations SET status = p_status, outcome_status = p_outcome, reason_code = p_reason,
        result = p_result, error = p_error, output_bytes = p_output_bytes, truncated = p_truncated,
        artifact_id = p_artifact, completed_at = p_now
    WHERE id = p_id AND status IN ('authorized', 'running') AND tenant_id = p_tenant
      AND worker_id = p_worker AND lease_epoch = p_epoch
    RETURNING run_id INTO ended_run;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_artifact IS NOT NULL THEN
        INSERT INTO artifacts (id, tenant_id, run_id, invocation_id, media_type, bytes, trust, created_at)
        VALUES (p_artifact, p_tenant, ended_run, p_id, p_artifact_media, p_artifact_bytes, p_artifact_trust, p_now);
    END IF;
    IF jsonb_typeof(p_produced) = 'array' AND jsonb_array_length(p_produced) > 0 THEN
        INSERT INTO artifacts (id, tenant_id, run_id, invocation_id, media_type, bytes, trust, created_at)
        SELECT (made->>'id')::uuid, p_tenant, ended_run, p_id,
               made->>'media_type', (made->>'bytes')::bigint, made->>'trust', p_now
        FROM jsonb_array_elements(p_produced) made;
    END IF;
    IF cardinality(p_kinds) > 0 THEN
        INSERT INTO events (tenant_id, event_type, payload, created_at)
        SELECT p_tenant, e.kind, e.body, p_now
        FROM unnest(p_kinds, p_bodies) WITH ORDINALITY AS e(kind, body, n)
        ORDER BY e.n;
    END IF;
    RETURN true;
END $$;

-- Claimed for execution (step 9): the fenced move to running, its events.
CREATE OR REPLACE FUNCTION toolgate_claim(
    p_tenant text, p_id uuid, p_worker uuid, p_epoch bigint, p_now timestamptz, p_kinds text[], p_bodies jsonb[])
RETURNS SETOF tool_invocations LANGUAGE plpgsql AS $$
DECLARE
    claimed tool_invocations;
BEGIN
    PERFORM set_config('toolgate.tenant_id', p_tenant, true), set_config('toolgate.scope', '', true);
    UPDATE tool_invocations SET status = 'running', lease_epoch = lease_epoch + 1, started_at = p_now,
        attempt_number = CASE WHEN started_at IS NULL THEN attempt_number ELSE attempt_number + 1 END
    WHERE id = p_id AND status = 'authorized' AND worker_id = p_worker AND lease_epoch = p_epoch
      AND tenant_id = p_tenant
    RETURNING * INTO claimed;
    IF FOUND THEN
        IF cardinality(p_kinds) > 0 THEN
            INSERT INTO events (tenant_id, event_type, payload, created_at)
            SELECT p_tenant, e.kind, e.body, p_now
            FROM unnest(p_kinds, p_bodies) WITH ORDINALITY AS e(kind, body, n)
            ORDER BY e.n;
        END IF;
        RETURN NEXT claimed;
    END IF;
END $$;

-- The effect watermark: set once, under the current fence, while the
-- worker's lease is live by the database's clock.
CREATE OR REPLACE FUNCTION toolgate_mark_effect_sent(p_tenant text, p_id uuid, p_worker uuid, p_epoch bigint, p_now timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('toolgate.tenant_id', p_tenant, true), set_config('toolgate.scope', '', true);
    UPDATE tool_invocations SET effect_sent_at = COALESCE(effect_sent_at, p_now)
    WHERE id = p_id AND status = 'running' AND worker_id = p_worker AND lease_epoch = p_epoch
      AND tenant_id = p_tenant
      AND EXISTS (SELECT 1 FROM workers w WHERE w.worker_id = p_worker
                  AND w.released_at IS NULL AND w.lease_expires_at > now());
    RETURN FOUND;
END $$;

-- The breaker's counter for one identical call: counts by outcome, the
-- evidence base and the run's synthesis-only step, each a row of its own.
CREATE OR REPLACE FUNCTION toolgate_tally(p_tenant text, p_run uuid, p_tool text, p_hash text)
RETURNS TABLE (t_status text, t_code text, t_count bigint, t_base bigint, t_synthesis bigint)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('toolgate.tenant_id', p_tenant, true), set_config('toolgate.scope', '', true);
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
