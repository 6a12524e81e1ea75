//! SqliteStore: The invocation rows: the four commits, the watermark,
//! take-overs, suspension, the breaker's counts and artifacts. Each
//! conditional write is guarded by the phases its transition may leave, as
//! the one table renders them.

use std::sync::LazyLock;

use super::*;
use crate::domain::InvocationStatus;
use crate::domain::invocation::{
    AUTHORIZE_WAITING, CLAIM, CLAIM_EXPIRED, COMPLETE, COMPLETE_SUSPENDED, MARK_EFFECT_SENT,
    RELEASE, REOPEN_APPROVAL, SETTLE_WAITING, SUSPEND, TAKE_OVER, Transition,
};

/// A terminal write of a row in `transition`'s phases (`$1`..`$11`), fenced
/// by `$12` and `$13` when `fenced`.
fn terminal_write(transition: &Transition, fenced: bool) -> String {
    format!(
        "UPDATE tool_invocations SET status = $2, outcome_status = $3, reason_code = $4, result = $5, \
         error = $6, output_bytes = $7, truncated = $8, artifact_id = $9, completed_at = $10 \
         WHERE id = $1 AND {} AND tenant_id = $11{}",
        leaves(transition, ""),
        if fenced {
            " AND worker_id = $12 AND lease_epoch = $13"
        } else {
            ""
        }
    )
}

static COMPLETE_SQL: LazyLock<String> = LazyLock::new(|| terminal_write(&COMPLETE, true));
static SETTLE_WAITING_SQL: LazyLock<String> =
    LazyLock::new(|| terminal_write(&SETTLE_WAITING, false));
static COMPLETE_SUSPENDED_SQL: LazyLock<String> =
    LazyLock::new(|| terminal_write(&COMPLETE_SUSPENDED, false));

static AUTHORIZE_WAITING_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE tool_invocations SET status = 'authorized', worker_id = $2, lease_epoch = lease_epoch + 1 \
         WHERE id = $1 AND {} AND tenant_id = $3 RETURNING {}",
        leaves(&AUTHORIZE_WAITING, ""),
        invocation_columns!()
    )
});

static CLAIM_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE tool_invocations SET status = 'running', lease_epoch = lease_epoch + 1, started_at = $4, \
         attempt_number = CASE WHEN started_at IS NULL THEN attempt_number ELSE attempt_number + 1 END \
         WHERE id = $1 AND {} AND worker_id = $2 AND lease_epoch = $3 AND tenant_id = $5 RETURNING {}",
        leaves(&CLAIM, ""),
        invocation_columns!()
    )
});

// The lease is judged by the store's clock, as workers are renewed by it.
static MARK_EFFECT_SENT_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE tool_invocations SET effect_sent_at = COALESCE(effect_sent_at, $4) \
         WHERE id = $1 AND {} AND worker_id = $2 AND lease_epoch = $3 AND tenant_id = $5 \
         AND EXISTS (SELECT 1 FROM workers w WHERE w.worker_id = $2 \
                     AND w.released_at IS NULL AND w.lease_expires_at > $6)",
        leaves(&MARK_EFFECT_SENT, "")
    )
});

static RELEASE_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE tool_invocations SET worker_id = NULL, lease_epoch = lease_epoch + 1 \
         WHERE id = $1 AND tenant_id = $2 AND {} AND worker_id = $3 AND lease_epoch = $4",
        leaves(&RELEASE, "")
    )
});

// The lease is released with the row: a suspended call is not a dead
// worker's, and no sweep may take it.
static SUSPEND_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE tool_invocations SET suspended_kind = $1, suspended_ref = $2, worker_id = NULL \
         WHERE id = $4 AND tenant_id = $5 AND {} AND worker_id = $6 AND lease_epoch = $7",
        leaves(&SUSPEND, "")
    )
});

/// A row whose worker is gone: none, released, or its lease run out at `$T`.
fn owner_gone(alias: &str, now: &str) -> String {
    format!(
        "NOT EXISTS (SELECT 1 FROM workers w WHERE w.worker_id = {alias}worker_id \
         AND w.released_at IS NULL AND w.lease_expires_at >= {now})"
    )
}

static CLAIM_EXPIRED_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE tool_invocations SET worker_id = $1, lease_epoch = lease_epoch + 1, \
         attempt_number = CASE WHEN started_at IS NULL THEN attempt_number ELSE attempt_number + 1 END \
         WHERE id IN (SELECT i.id FROM tool_invocations i WHERE {} AND {} \
                      ORDER BY i.created_at LIMIT $3) \
         RETURNING {}",
        leaves(&CLAIM_EXPIRED, "i."),
        owner_gone("i.", "$2"),
        invocation_columns!()
    )
});

static TAKE_OVER_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE tool_invocations SET worker_id = $3, lease_epoch = lease_epoch + 1, \
         attempt_number = CASE WHEN started_at IS NULL THEN attempt_number ELSE attempt_number + 1 END \
         WHERE id = $1 AND tenant_id = $2 AND {} AND {} RETURNING {}",
        leaves(&TAKE_OVER, ""),
        owner_gone("tool_invocations.", "$4"),
        invocation_columns!()
    )
});

static REOPEN_APPROVAL_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE tool_invocations SET status = 'waiting_for_approval', approval_id = $1, \
         reason_code = $2, worker_id = NULL \
         WHERE id = $4 AND tenant_id = $5 AND {} AND worker_id = $6 AND lease_epoch = $7",
        leaves(&REOPEN_APPROVAL, "")
    )
});

const INSERT_INTENT: &str = concat!(
    "INSERT INTO tool_invocations (id, tenant_id, session_id, run_id, step_number, call_id, tool_name, \
     tool_version, tool_source, server_id, arguments, arguments_hash, idempotency_key, status, \
     idempotency_class, side_effect, principal, origin_trust, parallel_group, deadline_at, approval_id, \
     reason_code, outcome_status, worker_id, lease_epoch, created_at, completed_at, started_at, \
     argument_trust) \
     SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, \
     $21, $22, $23, $24, 0, $25, $26, $27, $29 \
     WHERE NOT $28 OR (NOT EXISTS (SELECT 1 FROM tool_invocations WHERE tenant_id = $2 AND run_id = $4 \
     AND tool_name = $7 AND arguments_hash = $12 AND outcome_status IS NOT NULL) \
     AND NOT EXISTS (SELECT 1 FROM breaker_synthesis WHERE tenant_id = $2 AND run_id = $4 \
     AND after_step < $5)) \
     ON CONFLICT (idempotency_key, tenant_id) DO NOTHING RETURNING ",
    invocation_columns!()
);

/// A terminal record as the values its UPDATE binds, owned so that a
/// flushed commit can take them to the writer.
struct Terminal {
    record: TerminalRecord,
}

impl Terminal {
    /// `$1` to `$11` (`$12` and `$13` with `fence`), run: whether the row
    /// moved.
    fn write(
        &self,
        connection: &Connection,
        sql: &str,
        id: Uuid,
        tenant_id: &str,
        now: DateTime<Utc>,
        fence: Option<Fence>,
    ) -> Result<bool, StoreError> {
        let terminal = &self.record;
        let query = query(sql)
            .bind(id.to_string())
            .bind(terminal.status.as_str())
            .bind(terminal.outcome_status.as_str())
            .bind(terminal.reason_code.map(ReasonCode::as_str))
            .bind(terminal.result.as_ref().map(text))
            .bind(terminal.error.as_ref().map(text))
            .bind(terminal.output_bytes)
            .bind(terminal.truncated)
            .bind(
                terminal
                    .artifact
                    .as_ref()
                    .map(|artifact| artifact.id.to_string()),
            )
            .bind(micros(now))
            .bind(tenant_id);
        let query = match fence {
            Some(fence) => query
                .bind(fence.worker_id.to_string())
                .bind(fence.lease_epoch),
            None => query,
        };
        Ok(query.execute(connection)? == 1)
    }
}

impl InvocationStore for SqliteStore {
    fn insert_invocation<'a>(
        &'a self,
        new: &'a NewInvocation,
        claim: Claim,
        events: &'a [ToolEvent],
    ) -> BoxFuture<'a, Result<InsertOutcome, StoreError>> {
        Box::pin(async move {
            if let Some(record) = self.intent(new, claim, events, false).await? {
                return Ok(InsertOutcome::Inserted(record));
            }
            // The key is held within the tenant: that row is the call's.
            let existing = self.read(|connection| {
                query(concat!(
                    "SELECT ",
                    invocation_columns!(),
                    " FROM tool_invocations WHERE idempotency_key = $1 AND tenant_id = $2"
                ))
                .bind(&new.idempotency_key)
                .bind(&new.tenant_id)
                .fetch_optional(connection)
            })?;
            match existing.as_ref().map(invocation).transpose()? {
                Some(record) => Ok(InsertOutcome::Existing(record)),
                None => Err(StoreError::Query("the row holding the key is gone".into())),
            }
        })
    }

    fn insert_uncounted<'a>(
        &'a self,
        new: &'a NewInvocation,
        claim: Claim,
        events: &'a [ToolEvent],
    ) -> BoxFuture<'a, Result<Option<Held>, StoreError>> {
        Box::pin(async move {
            self.intent(new, claim, events, true)
                .await?
                .map(held)
                .transpose()
        })
    }

    fn authorize_waiting<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        claim: Claim,
        events: &'a [ToolEvent],
    ) -> BoxFuture<'a, Result<Option<Held>, StoreError>> {
        let tenant_id = tenant_id.to_owned();
        Box::pin(async move {
            let events = event_rows(events)?;
            let row = self
                .flushed(move |connection| {
                    let row = query(&AUTHORIZE_WAITING_SQL)
                        .bind(id.to_string())
                        .bind(claim.worker_id.to_string())
                        .bind(&tenant_id)
                        .fetch_optional(connection)?;
                    if row.is_some() {
                        append_events(connection, &tenant_id, &events, claim.now)?;
                    }
                    Ok(row)
                })
                .await?;
            row.as_ref()
                .map(invocation)
                .transpose()?
                .map(held)
                .transpose()
        })
    }

    fn settle_waiting<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        terminal: &'a TerminalRecord,
        events: &'a [ToolEvent],
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let (tenant_id, terminal) = (
            tenant_id.to_owned(),
            Terminal {
                record: terminal.clone(),
            },
        );
        Box::pin(async move {
            let events = event_rows(events)?;
            self.flushed(move |connection| {
                let moved =
                    terminal.write(connection, &SETTLE_WAITING_SQL, id, &tenant_id, now, None)?;
                if moved {
                    append_events(connection, &tenant_id, &events, now)?;
                }
                Ok(moved)
            })
            .await
        })
    }

    fn claim_invocation<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
        now: DateTime<Utc>,
        events: &'a [ToolEvent],
        durability: Durability,
    ) -> BoxFuture<'a, Result<Option<Held>, StoreError>> {
        let tenant_id = tenant_id.to_owned();
        Box::pin(async move {
            let events = event_rows(events)?;
            let row = self
                .write(durability, move |connection| {
                    let row = query(&CLAIM_SQL)
                        .bind(id.to_string())
                        .bind(fence.worker_id.to_string())
                        .bind(fence.lease_epoch)
                        .bind(micros(now))
                        .bind(&tenant_id)
                        .fetch_optional(connection)?;
                    if row.is_some() {
                        append_events(connection, &tenant_id, &events, now)?;
                    }
                    Ok(row)
                })
                .await?;
            row.as_ref()
                .map(invocation)
                .transpose()?
                .map(held)
                .transpose()
        })
    }

    fn mark_effect_sent<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
        now: DateTime<Utc>,
        durability: Durability,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let tenant_id = tenant_id.to_owned();
        Box::pin(async move {
            self.write(durability, move |connection| {
                let marked = query(&MARK_EFFECT_SENT_SQL)
                    .bind(id.to_string())
                    .bind(fence.worker_id.to_string())
                    .bind(fence.lease_epoch)
                    .bind(micros(now))
                    .bind(&tenant_id)
                    .bind(micros(Utc::now()))
                    .execute(connection)?;
                Ok(marked == 1)
            })
            .await
        })
    }

    fn complete_invocation<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
        terminal: &'a TerminalRecord,
        events: &'a [ToolEvent],
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let (tenant_id, durability) = (tenant_id.to_owned(), terminal.durability);
        let terminal = Terminal {
            record: terminal.clone(),
        };
        Box::pin(async move {
            let events = event_rows(events)?;
            self.write(durability, move |connection| {
                let moved =
                    terminal.write(connection, &COMPLETE_SQL, id, &tenant_id, now, Some(fence))?;
                if !moved {
                    return Ok(false);
                }
                let record = &terminal.record;
                for artifact in record.artifact.iter().chain(record.produced.iter()) {
                    query(
                        "INSERT INTO artifacts (id, tenant_id, run_id, invocation_id, media_type, bytes, trust, created_at) \
                         SELECT $1, tenant_id, run_id, id, $3, $4, $5, $6 FROM tool_invocations WHERE id = $2",
                    )
                    .bind(artifact.id.to_string())
                    .bind(id.to_string())
                    .bind(&artifact.media_type)
                    .bind(artifact.bytes)
                    .bind(artifact.trust.as_str())
                    .bind(micros(now))
                    .execute(connection)?;
                }
                append_events(connection, &tenant_id, &events, now)?;
                Ok(true)
            })
            .await
        })
    }

    fn release_invocation<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let tenant_id = tenant_id.to_owned();
        Box::pin(async move {
            self.flushed(move |connection| {
                let moved = query(&RELEASE_SQL)
                    .bind(id.to_string())
                    .bind(tenant_id)
                    .bind(fence.worker_id.to_string())
                    .bind(fence.lease_epoch)
                    .execute(connection)?;
                Ok(moved == 1)
            })
            .await
        })
    }

    fn suspend_invocation<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
        kind: &'a str,
        reference: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let (tenant_id, kind, reference) =
            (tenant_id.to_owned(), kind.to_owned(), reference.to_owned());
        Box::pin(async move {
            self.flushed(move |connection| {
                let moved = query(&SUSPEND_SQL)
                    .bind(kind)
                    .bind(reference)
                    .bind(Option::<String>::None)
                    .bind(id.to_string())
                    .bind(tenant_id)
                    .bind(fence.worker_id.to_string())
                    .bind(fence.lease_epoch)
                    .execute(connection)?;
                Ok(moved == 1)
            })
            .await
        })
    }

    fn complete_suspended<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        terminal: &'a TerminalRecord,
        events: &'a [ToolEvent],
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let (tenant_id, terminal) = (
            tenant_id.to_owned(),
            Terminal {
                record: terminal.clone(),
            },
        );
        Box::pin(async move {
            let events = event_rows(events)?;
            self.flushed(move |connection| {
                let moved = terminal.write(
                    connection,
                    &COMPLETE_SUSPENDED_SQL,
                    id,
                    &tenant_id,
                    now,
                    None,
                )?;
                if moved {
                    append_events(connection, &tenant_id, &events, now)?;
                }
                Ok(moved)
            })
            .await
        })
    }

    fn open_run<'a>(&'a self, run: &'a RunOwner) -> BoxFuture<'a, Result<RunOwner, StoreError>> {
        let run = run.clone();
        Box::pin(async move {
            self.flushed(move |connection| {
                query(
                    "INSERT INTO runs (run_id, tenant_id, principal_id, session_id, opened_at) \
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant_id, run_id) DO NOTHING",
                )
                .bind(run.run_id.to_string())
                .bind(&run.tenant_id)
                .bind(&run.principal_id)
                .bind(run.session_id.to_string())
                .bind(micros(run.opened_at))
                .execute(connection)?;
                run_owner(
                    &query("SELECT * FROM runs WHERE tenant_id = $1 AND run_id = $2")
                        .bind(&run.tenant_id)
                        .bind(run.run_id.to_string())
                        .fetch_one(connection)?,
                )
            })
            .await
        })
    }

    fn invocation<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
    ) -> BoxFuture<'a, Result<Option<InvocationRecord>, StoreError>> {
        Box::pin(async move {
            self.read(|connection| {
                query(concat!(
                    "SELECT ",
                    invocation_columns!(),
                    " FROM tool_invocations WHERE id = $1 AND tenant_id = $2"
                ))
                .bind(id.to_string())
                .bind(tenant_id)
                .fetch_optional(connection)?
                .as_ref()
                .map(invocation)
                .transpose()
            })
        })
    }

    fn run_invocations<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
    ) -> BoxFuture<'a, Result<Vec<InvocationRecord>, StoreError>> {
        Box::pin(async move {
            self.read(|connection| {
                query(concat!(
                    "SELECT ",
                    invocation_columns!(),
                    " FROM tool_invocations WHERE tenant_id = $1 AND run_id = $2 ORDER BY step_number, created_at, id"
                ))
                .bind(tenant_id)
                .bind(run_id.to_string())
                .fetch_all(connection)?
                .iter()
                .map(invocation)
                .collect()
            })
        })
    }

    fn step_invocations<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        step_number: i64,
    ) -> BoxFuture<'a, Result<Vec<InvocationRecord>, StoreError>> {
        Box::pin(async move {
            self.read(|connection| {
                query(concat!(
                    "SELECT ",
                    invocation_columns!(),
                    " FROM tool_invocations WHERE tenant_id = $1 AND run_id = $2 AND step_number = $3 \
                     ORDER BY created_at, id"
                ))
                .bind(tenant_id)
                .bind(run_id.to_string())
                .bind(step_number)
                .fetch_all(connection)?
                .iter()
                .map(invocation)
                .collect()
            })
        })
    }

    fn waiting_call<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        tool_name: &'a str,
        arguments_hash: &'a str,
    ) -> BoxFuture<'a, Result<Option<InvocationRecord>, StoreError>> {
        Box::pin(async move {
            self.read(|connection| {
                query(concat!(
                    "SELECT ",
                    invocation_columns!(),
                    " FROM tool_invocations WHERE tenant_id = $1 AND run_id = $2 AND tool_name = $3 \
                     AND arguments_hash = $4 AND status = 'waiting_for_approval' \
                     ORDER BY created_at, id LIMIT 1"
                ))
                .bind(tenant_id)
                .bind(run_id.to_string())
                .bind(tool_name)
                .bind(arguments_hash)
                .fetch_optional(connection)?
                .as_ref()
                .map(invocation)
                .transpose()
            })
        })
    }

    fn latest_succeeded<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        tool_name: &'a str,
    ) -> BoxFuture<'a, Result<Option<InvocationRecord>, StoreError>> {
        Box::pin(async move {
            self.read(|connection| {
                query(concat!(
                    "SELECT ",
                    invocation_columns!(),
                    " FROM tool_invocations WHERE tenant_id = $1 AND run_id = $2 AND tool_name = $3 \
                     AND outcome_status = 'succeeded' \
                     ORDER BY step_number DESC, created_at DESC, id DESC LIMIT 1"
                ))
                .bind(tenant_id)
                .bind(run_id.to_string())
                .bind(tool_name)
                .fetch_optional(connection)?
                .as_ref()
                .map(invocation)
                .transpose()
            })
        })
    }

    fn claim_expired(
        &self,
        claim: Claim,
        limit: i64,
    ) -> BoxFuture<'_, Result<Vec<Held>, StoreError>> {
        Box::pin(async move {
            let rows = self
                .flushed(move |connection| {
                    query(&CLAIM_EXPIRED_SQL)
                        .bind(claim.worker_id.to_string())
                        .bind(micros(claim.now))
                        .bind(limit)
                        .fetch_all(connection)
                })
                .await?;
            rows.iter().map(|row| held(invocation(row)?)).collect()
        })
    }

    fn take_over<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        claim: Claim,
    ) -> BoxFuture<'a, Result<Option<Held>, StoreError>> {
        let tenant_id = tenant_id.to_owned();
        Box::pin(async move {
            let row = self
                .flushed(move |connection| {
                    query(&TAKE_OVER_SQL)
                        .bind(id.to_string())
                        .bind(tenant_id)
                        .bind(claim.worker_id.to_string())
                        .bind(micros(claim.now))
                        .fetch_optional(connection)
                })
                .await?;
            row.as_ref()
                .map(invocation)
                .transpose()?
                .map(held)
                .transpose()
        })
    }

    fn breaker_tally<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        tool_name: &'a str,
        arguments_hash: &'a str,
    ) -> BoxFuture<'a, Result<BreakerTally, StoreError>> {
        Box::pin(async move {
            // One statement, so one snapshot: the counts, then the evidence
            // base as a row of its own (`t_count` NULL), named as
            // PostgreSQL's `toolgate_tally` names them.
            let rows = self.read(|connection| {
                query(
                    "SELECT outcome_status AS t_status, reason_code AS t_code, count(*) AS t_count, \
                     NULL AS t_base, NULL AS t_synthesis \
                     FROM tool_invocations \
                     WHERE tenant_id = $1 AND run_id = $2 AND tool_name = $3 AND arguments_hash = $4 \
                       AND outcome_status IS NOT NULL \
                     GROUP BY outcome_status, reason_code \
                     UNION ALL \
                     SELECT NULL, NULL, NULL, base, NULL FROM breaker_evidence \
                     WHERE tenant_id = $1 AND run_id = $2 AND tool_name = $3 AND arguments_hash = $4 \
                     UNION ALL \
                     SELECT NULL, NULL, NULL, NULL, after_step FROM breaker_synthesis \
                     WHERE tenant_id = $1 AND run_id = $2",
                )
                .bind(tenant_id)
                .bind(run_id.to_string())
                .bind(tool_name)
                .bind(arguments_hash)
                .fetch_all(connection)
            })?;
            breaker_tally(&rows)
        })
    }

    fn record_evidence<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        tool_name: &'a str,
        arguments_hash: &'a str,
        evidence_key: &'a str,
        maximum_restarts: i32,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let (tenant_id, run_id, tool_name, arguments_hash, evidence_key) = (
            tenant_id.to_owned(),
            run_id.to_string(),
            tool_name.to_owned(),
            arguments_hash.to_owned(),
            evidence_key.to_owned(),
        );
        Box::pin(async move {
            self.flushed(move |connection| {
                let successes: i64 = get(
                    &query(
                        "SELECT count(*) AS n FROM tool_invocations WHERE tenant_id = $1 AND run_id = $2 \
                         AND tool_name = $3 AND arguments_hash = $4 AND outcome_status = 'succeeded'",
                    )
                    .bind(&tenant_id)
                    .bind(&run_id)
                    .bind(&tool_name)
                    .bind(&arguments_hash)
                    .fetch_one(connection)?,
                    "n",
                )?;
                let last = query(
                    "SELECT evidence_key, base FROM breaker_evidence WHERE tenant_id = $1 AND run_id = $2 \
                     AND tool_name = $3 AND arguments_hash = $4",
                )
                .bind(&tenant_id)
                .bind(&run_id)
                .bind(&tool_name)
                .bind(&arguments_hash)
                .fetch_optional(connection)?
                .map(|row| Ok((get::<String>(&row, "evidence_key")?, get::<i64>(&row, "base")?)))
                .transpose()?;
                let restarted = match last {
                    None => {
                        query(
                            "INSERT INTO breaker_evidence (tenant_id, run_id, tool_name, arguments_hash, evidence_key, base) \
                             VALUES ($1, $2, $3, $4, $5, 0)",
                        )
                        .bind(&tenant_id)
                        .bind(&run_id)
                        .bind(&tool_name)
                        .bind(&arguments_hash)
                        .bind(&evidence_key)
                        .execute(connection)?;
                        false
                    }
                    Some((key, _)) if key == evidence_key => false,
                    Some((_, base)) => {
                        // A restart must lower the count, and the run must
                        // have one left.
                        let lowers = successes - base > 1;
                        let granted = lowers
                            && query(
                                "INSERT INTO breaker_runs (tenant_id, run_id, restarts) VALUES ($1, $2, 1) \
                                 ON CONFLICT (run_id, tenant_id) DO UPDATE SET restarts = breaker_runs.restarts + 1 \
                                 WHERE breaker_runs.restarts < $3",
                            )
                            .bind(&tenant_id)
                            .bind(&run_id)
                            .bind(maximum_restarts)
                            .execute(connection)?
                                == 1;
                        let new_base = if granted { successes - 1 } else { base };
                        query(
                            "UPDATE breaker_evidence SET evidence_key = $5, base = $6 WHERE tenant_id = $1 \
                             AND run_id = $2 AND tool_name = $3 AND arguments_hash = $4",
                        )
                        .bind(&tenant_id)
                        .bind(&run_id)
                        .bind(&tool_name)
                        .bind(&arguments_hash)
                        .bind(&evidence_key)
                        .bind(new_base)
                        .execute(connection)?;
                        granted
                    }
                };
                Ok(restarted)
            })
            .await
        })
    }

    fn mark_synthesis_only<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        step: i64,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let tenant_id = tenant_id.to_owned();
        Box::pin(async move {
            self.flushed(move |connection| {
                query(
                    "INSERT INTO breaker_synthesis (tenant_id, run_id, after_step) VALUES ($1, $2, $3) \
                     ON CONFLICT (run_id, tenant_id) DO UPDATE \
                     SET after_step = MIN(breaker_synthesis.after_step, excluded.after_step)",
                )
                .bind(tenant_id)
                .bind(run_id.to_string())
                .bind(step)
                .execute(connection)
                .map(|_| ())
            })
            .await
        })
    }

    fn artifact<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
    ) -> BoxFuture<'a, Result<Option<ArtifactRecord>, StoreError>> {
        Box::pin(async move {
            let row = self.read(|connection| {
                query(ARTIFACT_WITH_OWNER)
                    .bind(id.to_string())
                    .bind(tenant_id)
                    .fetch_optional(connection)
            })?;
            row.as_ref().map(artifact).transpose()
        })
    }

    fn reopen_approval<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
        approval_id: Uuid,
        reason_code: ReasonCode,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let tenant_id = tenant_id.to_owned();
        Box::pin(async move {
            self.flushed(move |connection| {
                let moved = query(&REOPEN_APPROVAL_SQL)
                    .bind(approval_id.to_string())
                    .bind(reason_code.as_str())
                    .bind(Option::<String>::None)
                    .bind(id.to_string())
                    .bind(&tenant_id)
                    .bind(fence.worker_id.to_string())
                    .bind(fence.lease_epoch)
                    .execute(connection)?;
                if moved != 1 {
                    return Ok(false);
                }
                query(
                    "INSERT INTO approvals (id, tenant_id, invocation_id, tool_name, reason_code, status, requested_at) \
                     SELECT $1, tenant_id, id, tool_name, $2, 'pending', $3 FROM tool_invocations \
                     WHERE id = $4 AND tenant_id = $5",
                )
                .bind(approval_id.to_string())
                .bind(reason_code.as_str())
                .bind(micros(now))
                .bind(id.to_string())
                .bind(&tenant_id)
                .execute(connection)?;
                Ok(true)
            })
            .await
        })
    }
}

impl SqliteStore {
    /// The intent's commit for `new`: the row it inserted, if any, with its
    /// events and its approval when it waits for one. With `uncounted`, only
    /// while no identical call of the run has an outcome. A known key, or an
    /// uncounted insert the breaker has something to count for, inserts
    /// nothing.
    async fn intent(
        &self,
        new: &NewInvocation,
        claim: Claim,
        events: &[ToolEvent],
        uncounted: bool,
    ) -> Result<Option<InvocationRecord>, StoreError> {
        let principal =
            serde_json::to_string(&new.principal).map_err(|e| StoreError::Decode(e.to_string()))?;
        let events = event_rows(events)?;
        // No labels at all is NULL: every argument the model's.
        let argument_trust = (!new.argument_trust.labels().is_empty())
            .then(|| serde_json::to_string(&new.argument_trust))
            .transpose()
            .map_err(|e| StoreError::Decode(e.to_string()))?;
        let new = new.clone();
        let durability = new.durability;
        let inserted = self
            .write(durability, move |connection| {
                let row = query(INSERT_INTENT)
                    .bind(new.id.to_string())
                    .bind(&new.tenant_id)
                    .bind(new.session_id.to_string())
                    .bind(new.run_id.to_string())
                    .bind(new.step_number)
                    .bind(&new.call_id)
                    .bind(&new.tool_name)
                    .bind(&new.tool_version)
                    .bind(new.tool_source.as_str())
                    .bind(&new.server_id)
                    .bind(text(&new.arguments))
                    .bind(&new.arguments_hash)
                    .bind(&new.idempotency_key)
                    .bind(new.status.as_str())
                    .bind(new.idempotency_class.as_str())
                    .bind(new.side_effect.as_str())
                    .bind(principal)
                    .bind(new.origin_trust.as_str())
                    .bind(new.parallel_group.map(|id| id.to_string()))
                    .bind(new.deadline_at.map(micros))
                    .bind(new.approval_id.map(|id| id.to_string()))
                    .bind(new.reason_code.map(ReasonCode::as_str))
                    .bind(new.status.outcome_status(new.reason_code).map(|s| s.as_str()))
                    .bind(claim.worker_id.to_string())
                    .bind(micros(claim.now))
                    .bind(new.status.is_terminal().then_some(micros(claim.now)))
                    .bind((new.status == InvocationStatus::Running).then_some(micros(claim.now)))
                    .bind(uncounted)
                    .bind(argument_trust)
                    .fetch_optional(connection)?;
                if row.is_none() {
                    return Ok(None);
                }
                append_events(connection, &new.tenant_id, &events, claim.now)?;
                if let (Some(approval_id), Some(reason_code)) = (new.approval_id, new.reason_code) {
                    query(
                        "INSERT INTO approvals (id, tenant_id, invocation_id, tool_name, reason_code, status, requested_at) \
                         VALUES ($1, $2, $3, $4, $5, 'pending', $6)",
                    )
                    .bind(approval_id.to_string())
                    .bind(&new.tenant_id)
                    .bind(new.id.to_string())
                    .bind(&new.tool_name)
                    .bind(reason_code.as_str())
                    .bind(micros(claim.now))
                    .execute(connection)?;
                }
                Ok(row)
            })
            .await?;
        inserted.as_ref().map(invocation).transpose()
    }
}
