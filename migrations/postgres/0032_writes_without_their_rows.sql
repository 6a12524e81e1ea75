-- toolgate 0032: a call's intent and end answer whether they wrote, not
-- the row; each hot-path function sets its transaction's settings as
-- plain expressions; a call's status is checked through a type.
--
-- toolgate_intent returned its row (`SETOF tool_invocations`): each intent
-- formed the inserted row again for RETURNING, put it in a tuple store,
-- read it back through a function scan of 38 columns and sent it, and the
-- node decoded it, although the node builds that record from the values it
-- sent. toolgate_write_intent answers whether it inserted; a counted intent
-- that finds its key held reads that row by key (a retry, not a call's
-- usual path). An uncounted intent asks the breaker's question in its
-- INSERT's condition rather than in a query before it.
--
-- `PERFORM set_config(...)` ran a query of its own through the executor;
-- an assignment evaluates the call in place. The intent and the end also
-- take the transaction's `synchronous_commit` (NULL: the session's own),
-- which their statement set beside them.
--
-- A commit's events are inserted straight from unnest's rows, which come
-- in the arrays' order and are numbered in it: `ORDER BY` on the ordinal
-- kept the SELECT a subquery scan of its own in every insert. The bodies
-- may stop short of the kinds, and every kind past the last body has that
-- body: a running intent's three events say the same but for their kind,
-- and their body is now sent and parsed once, not three times.
--
-- PostgreSQL reads a CHECK's expression from its stored text and plans it
-- again in every statement that writes the table: the list of eight
-- statuses, a constant array printed byte by byte, cost each intent and
-- each end about 5 µs. The same rule as a cast to a type that holds the
-- eight statuses is a few nodes; a status outside them fails the write
-- as before (invalid_text_representation, naming the value).
--
-- The intent and the end are new functions, and the earlier ones stay, so
-- a node of the previous release keeps working while the nodes are
-- upgraded one by one; the claim, the watermark and the breaker's tally
-- keep their names, arguments and answers and are replaced in place.

CREATE TYPE toolgate_invocation_status AS ENUM ('proposed', 'authorized', 'waiting_for_approval',
    'running', 'succeeded', 'failed', 'denied', 'uncertain');
ALTER TABLE tool_invocations DROP CONSTRAINT tool_invocations_status_check,
    ADD CONSTRAINT tool_invocations_status_check CHECK (status::toolgate_invocation_status IS NOT NULL);

CREATE FUNCTION toolgate_write_intent(
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
    -- Uncounted, nothing is inserted while the breaker has something to
    -- count: an identical call of the run with an outcome, or the run's
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
    WHERE NOT p_uncounted
       OR NOT EXISTS (SELECT 1 FROM tool_invocations i
                      WHERE i.tenant_id = p_tenant AND i.run_id = p_run AND i.tool_name = p_tool
                        AND i.arguments_hash = p_hash AND i.outcome_status IS NOT NULL)
          AND NOT EXISTS (SELECT 1 FROM breaker_synthesis s
                          WHERE s.tenant_id = p_tenant AND s.run_id = p_run AND s.after_step < p_step)
    ON CONFLICT (idempotency_key, tenant_id) DO NOTHING;
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

-- A call's end: the terminal write under the claim's fence, the artifacts
-- the call produced, its events; false when the fence no longer holds.
CREATE FUNCTION toolgate_write_end(
    p_tenant text, p_id uuid, p_worker uuid, p_epoch bigint, p_status text, p_outcome text, p_reason text,
    p_result jsonb, p_error jsonb, p_output_bytes bigint, p_truncated boolean, p_artifact uuid,
    p_artifact_media text, p_artifact_bytes bigint, p_artifact_trust text, p_now timestamptz,
    p_kinds text[], p_bodies jsonb[], p_produced jsonb, p_synchronous_commit text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    setting text;
    ended_run uuid;
BEGIN
    setting := set_config('toolgate.tenant_id', p_tenant, true);
    setting := set_config('toolgate.scope', '', true);
    IF p_synchronous_commit IS NOT NULL THEN
        setting := set_config('synchronous_commit', p_synchronous_commit, true);
    END IF;
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
        SELECT p_tenant, e.kind, COALESCE(e.body, p_bodies[cardinality(p_bodies)]), p_now
        FROM unnest(p_kinds, p_bodies) AS e(kind, body);
    END IF;
    RETURN true;
END $$;

-- Claimed for execution (step 9): the fenced move to running, its events.
CREATE OR REPLACE FUNCTION toolgate_claim(
    p_tenant text, p_id uuid, p_worker uuid, p_epoch bigint, p_now timestamptz, p_kinds text[], p_bodies jsonb[])
RETURNS SETOF tool_invocations LANGUAGE plpgsql AS $$
DECLARE
    setting text;
    claimed tool_invocations;
BEGIN
    setting := set_config('toolgate.tenant_id', p_tenant, true);
    setting := set_config('toolgate.scope', '', true);
    UPDATE tool_invocations SET status = 'running', lease_epoch = lease_epoch + 1, started_at = p_now,
        attempt_number = CASE WHEN started_at IS NULL THEN attempt_number ELSE attempt_number + 1 END
    WHERE id = p_id AND status = 'authorized' AND worker_id = p_worker AND lease_epoch = p_epoch
      AND tenant_id = p_tenant
    RETURNING * INTO claimed;
    IF FOUND THEN
        IF cardinality(p_kinds) > 0 THEN
            INSERT INTO events (tenant_id, event_type, payload, created_at)
            SELECT p_tenant, e.kind, COALESCE(e.body, p_bodies[cardinality(p_bodies)]), p_now
            FROM unnest(p_kinds, p_bodies) AS e(kind, body);
        END IF;
        RETURN NEXT claimed;
    END IF;
END $$;

-- The effect watermark: set once, under the current fence, while the
-- worker's lease is live by the database's clock.
CREATE OR REPLACE FUNCTION toolgate_mark_effect_sent(p_tenant text, p_id uuid, p_worker uuid, p_epoch bigint, p_now timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    setting text;
BEGIN
    setting := set_config('toolgate.tenant_id', p_tenant, true);
    setting := set_config('toolgate.scope', '', true);
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
DECLARE
    setting text;
BEGIN
    setting := set_config('toolgate.tenant_id', p_tenant, true);
    setting := set_config('toolgate.scope', '', true);
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
