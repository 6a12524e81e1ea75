//! PostgresStore: The invocation rows: the four commits, the watermark, take-overs, suspension, the breaker's counts and artifacts.

use super::*;

use std::sync::LazyLock;

use super::super::leaves;
use crate::domain::invocation::{
    AUTHORIZE_WAITING, CLAIM_EXPIRED, COMPLETE_SUSPENDED, RELEASE, REOPEN_APPROVAL, SETTLE_WAITING,
    SUSPEND, TAKE_OVER, Transition,
};

// The conditional writes made here (the claim, the watermark and the
// terminal write are PostgreSQL functions), each guarded by the phases its
// transition may leave, as the one table renders them.

static AUTHORIZE_WAITING_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE tool_invocations SET status = 'authorized', worker_id = $2, lease_epoch = lease_epoch + 1 \
         WHERE id = $1 AND {} AND tenant_id = $3 RETURNING {}",
        leaves(&AUTHORIZE_WAITING, ""),
        invocation_columns!()
    )
});

/// A terminal write of a row in `transition`'s phases (`$1`..`$11`).
fn terminal_write(transition: &Transition) -> String {
    format!(
        "UPDATE tool_invocations SET status = $2, outcome_status = $3, reason_code = $4, result = $5, \
         error = $6, output_bytes = $7, truncated = $8, artifact_id = $9, completed_at = $10 \
         WHERE id = $1 AND {} AND tenant_id = $11",
        leaves(transition, "")
    )
}

static SETTLE_WAITING_SQL: LazyLock<String> = LazyLock::new(|| terminal_write(&SETTLE_WAITING));

static COMPLETE_SUSPENDED_SQL: LazyLock<String> =
    LazyLock::new(|| terminal_write(&COMPLETE_SUSPENDED));

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
        "UPDATE tool_invocations SET suspended_kind = $1, suspended_ref = $2, worker_id = $3 \
         WHERE id = $4 AND tenant_id = $5 AND {} AND worker_id = $6 AND lease_epoch = $7",
        leaves(&SUSPEND, "")
    )
});

/// The workers whose rows recovery may take: released, or their lease run
/// out on the database's clock (never the claimer's). A row its worker let
/// go has no worker.
fn owner_gone(alias: &str) -> String {
    format!(
        "({alias}worker_id IS NULL OR {alias}worker_id IN (SELECT w.worker_id FROM workers w \
         WHERE w.released_at IS NOT NULL OR w.lease_expires_at < now()))"
    )
}

// The candidates are chosen once (a materialized CTE) and locked with SKIP
// LOCKED. The lease test names the dead workers positively: when a row
// another sweeper just took is rechecked against its new version, its new
// owner is not among them. (A NOT EXISTS over live workers would pass that
// recheck vacuously and steal the row.)
static CLAIM_EXPIRED_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH candidates AS MATERIALIZED (\
            SELECT i.id AS candidate_id FROM tool_invocations i WHERE {} AND {} \
            ORDER BY i.created_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
         UPDATE tool_invocations t SET worker_id = $1, lease_epoch = t.lease_epoch + 1, \
         attempt_number = CASE WHEN t.started_at IS NULL THEN t.attempt_number ELSE t.attempt_number + 1 END \
         FROM candidates c WHERE t.id = c.candidate_id RETURNING {}",
        leaves(&CLAIM_EXPIRED, "i."),
        owner_gone("i."),
        invocation_columns!()
    )
});

static TAKE_OVER_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE tool_invocations SET worker_id = $3, lease_epoch = lease_epoch + 1, \
         attempt_number = CASE WHEN started_at IS NULL THEN attempt_number ELSE attempt_number + 1 END \
         WHERE id = $1 AND tenant_id = $2 AND {} AND {} RETURNING {}",
        leaves(&TAKE_OVER, ""),
        owner_gone(""),
        invocation_columns!()
    )
});

static REOPEN_APPROVAL_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE tool_invocations SET status = 'waiting_for_approval', approval_id = $1, \
         reason_code = $2, worker_id = $3 \
         WHERE id = $4 AND tenant_id = $5 AND {} AND worker_id = $6 AND lease_epoch = $7",
        leaves(&REOPEN_APPROVAL, "")
    )
});

impl InvocationStore for PostgresStore {
    fn insert_invocation<'a>(
        &'a self,
        new: &'a NewInvocation,
        claim: Claim,
        events: &'a [ToolEvent],
    ) -> BoxFuture<'a, Result<InsertOutcome, StoreError>> {
        Box::pin(async move {
            // The function returns the new row, or the one of the tenant
            // already holding the key.
            match self.intent(INSERT, new, claim, events).await? {
                Some(record) if record.id == new.id => Ok(InsertOutcome::Inserted(record)),
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
            self.intent(INSERT_UNCOUNTED, new, claim, events)
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
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let row = sqlx::query(AUTHORIZE_WAITING_SQL.as_str())
                .bind(id)
                .bind(claim.worker_id)
                .bind(tenant_id)
                .fetch_optional(tx.statements())
                .await
                .map_err(database_error)?;
            let record = row.as_ref().map(invocation).transpose()?;
            if record.is_some() {
                append_events(&mut tx, tenant_id, events, claim.now).await?;
            }
            tx.commit().await.map_err(database_error)?;
            record.map(held).transpose()
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
        Box::pin(self.end_unfenced(
            SETTLE_WAITING_SQL.as_str(),
            tenant_id,
            id,
            terminal,
            events,
            now,
        ))
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
        Box::pin(async move {
            let mut lease = self.hot.lease_for(tenant_id).await?;
            let (kinds, bodies) = event_arrays(events)?;
            let result = sqlx::query(
                "SELECT * FROM toolgate_claim($1, $2, $3, $4, $5, $6, $7), \
                 set_config('synchronous_commit', COALESCE($8, current_setting('synchronous_commit')), true)",
            )
                .bind(tenant_id)
                .bind(id)
                .bind(fence.worker_id)
                .bind(fence.lease_epoch)
                .bind(now)
                .bind(kinds)
                .bind(bodies)
                .bind(synchronous_commit(durability))
                .fetch_optional(lease.statements()?)
                .await;
            let row = lease.settle(result)?;
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
        Box::pin(async move {
            let mut lease = self.hot.lease_for(tenant_id).await?;
            let result = sqlx::query_scalar(
                "SELECT toolgate_mark_effect_sent($1, $2, $3, $4, $5), \
                 set_config('synchronous_commit', COALESCE($6, current_setting('synchronous_commit')), true)",
            )
                .bind(tenant_id)
                .bind(id)
                .bind(fence.worker_id)
                .bind(fence.lease_epoch)
                .bind(now)
                .bind(synchronous_commit(durability))
                .fetch_one(lease.statements()?)
                .await;
            lease.settle(result)
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
        Box::pin(async move {
            let mut lease = self.hot.lease_for(tenant_id).await?;
            let (kinds, bodies) = event_arrays(events)?;
            let artifact = terminal.artifact.as_ref();
            let produced: Vec<serde_json::Value> = terminal
                .produced
                .iter()
                .map(|made| {
                    serde_json::json!({"id": made.id, "media_type": made.media_type,
                                       "bytes": made.bytes, "trust": made.trust.as_str()})
                })
                .collect();
            let result = sqlx::query_scalar(
                "SELECT toolgate_complete($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
                 $17, $18, $19), \
                 set_config('synchronous_commit', COALESCE($20, current_setting('synchronous_commit')), true)",
            )
            .bind(tenant_id)
            .bind(id)
            .bind(fence.worker_id)
            .bind(fence.lease_epoch)
            .bind(terminal.status.as_str())
            .bind(terminal.outcome_status.as_str())
            .bind(terminal.reason_code.map(ReasonCode::as_str))
            .bind(&terminal.result)
            .bind(&terminal.error)
            .bind(terminal.output_bytes)
            .bind(terminal.truncated)
            .bind(artifact.map(|a| a.id))
            .bind(artifact.map(|a| a.media_type.as_str()))
            .bind(artifact.map(|a| a.bytes))
            .bind(artifact.map(|a| a.trust.as_str()))
            .bind(now)
            .bind(kinds)
            .bind(bodies)
            .bind(serde_json::Value::Array(produced))
            .bind(synchronous_commit(terminal.durability))
            .fetch_one(lease.statements()?)
                .await;
            lease.settle(result)
        })
    }

    fn release_invocation<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let result = sqlx::query(RELEASE_SQL.as_str())
                .bind(id)
                .bind(tenant_id)
                .bind(fence.worker_id)
                .bind(fence.lease_epoch)
                .execute(tx.statements())
                .await
                .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            Ok(result.rows_affected() == 1)
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
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            // The lease is released with the row: a suspended call is not a
            // dead worker's, and no sweep may take it.
            let result = sqlx::query(SUSPEND_SQL.as_str())
                .bind(kind)
                .bind(reference)
                .bind(Option::<Uuid>::None)
                .bind(id)
                .bind(tenant_id)
                .bind(fence.worker_id)
                .bind(fence.lease_epoch)
                .execute(tx.statements())
                .await
                .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            Ok(result.rows_affected() == 1)
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
        Box::pin(self.end_unfenced(
            COMPLETE_SUSPENDED_SQL.as_str(),
            tenant_id,
            id,
            terminal,
            events,
            now,
        ))
    }

    fn open_run<'a>(&'a self, run: &'a RunOwner) -> BoxFuture<'a, Result<RunOwner, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(&run.tenant_id)).await?;
            sqlx::query(
                "INSERT INTO runs (run_id, tenant_id, principal_id, session_id, opened_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant_id, run_id) DO NOTHING",
            )
            .bind(run.run_id)
            .bind(&run.tenant_id)
            .bind(&run.principal_id)
            .bind(run.session_id)
            .bind(run.opened_at)
            .execute(tx.statements())
            .await
            .map_err(database_error)?;
            // A statement of its own: it sees a row another transaction
            // committed while the insert waited on it.
            let row = sqlx::query("SELECT * FROM runs WHERE tenant_id = $1 AND run_id = $2")
                .bind(&run.tenant_id)
                .bind(run.run_id)
                .fetch_one(tx.statements())
                .await
                .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            run_owner(&row)
        })
    }

    fn invocation<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
    ) -> BoxFuture<'a, Result<Option<InvocationRecord>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let row = sqlx::query(concat!(
                "SELECT ",
                invocation_columns!(),
                " FROM tool_invocations WHERE id = $1 AND tenant_id = $2"
            ))
            .bind(id)
            .bind(tenant_id)
            .fetch_optional(tx.statements())
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            row.as_ref().map(invocation).transpose()
        })
    }

    fn step_invocations<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        step_number: i64,
    ) -> BoxFuture<'a, Result<Vec<InvocationRecord>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let rows = sqlx::query(concat!(
                "SELECT ",
                invocation_columns!(),
                " FROM tool_invocations WHERE tenant_id = $1 AND run_id = $2 AND step_number = $3 \
                 ORDER BY created_at, id"
            ))
            .bind(tenant_id)
            .bind(run_id)
            .bind(step_number)
            .fetch_all(tx.statements())
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            rows.iter().map(invocation).collect()
        })
    }

    fn run_invocations<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
    ) -> BoxFuture<'a, Result<Vec<InvocationRecord>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let rows = sqlx::query(concat!(
                "SELECT ",
                invocation_columns!(),
                " FROM tool_invocations WHERE tenant_id = $1 AND run_id = $2 ORDER BY step_number, created_at, id"
            ))
            .bind(tenant_id)
            .bind(run_id)
            .fetch_all(tx.statements())
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            rows.iter().map(invocation).collect()
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
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let row = sqlx::query(concat!(
                "SELECT ",
                invocation_columns!(),
                " FROM tool_invocations WHERE tenant_id = $1 AND run_id = $2 AND tool_name = $3 \
                 AND arguments_hash = $4 AND status = 'waiting_for_approval' \
                 ORDER BY created_at, id LIMIT 1"
            ))
            .bind(tenant_id)
            .bind(run_id)
            .bind(tool_name)
            .bind(arguments_hash)
            .fetch_optional(tx.statements())
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            row.as_ref().map(invocation).transpose()
        })
    }

    fn latest_succeeded<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        tool_name: &'a str,
    ) -> BoxFuture<'a, Result<Option<InvocationRecord>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let row = sqlx::query(concat!(
                "SELECT ",
                invocation_columns!(),
                " FROM tool_invocations WHERE tenant_id = $1 AND run_id = $2 AND tool_name = $3 \
                 AND outcome_status = 'succeeded' \
                 ORDER BY step_number DESC, created_at DESC, id DESC LIMIT 1"
            ))
            .bind(tenant_id)
            .bind(run_id)
            .bind(tool_name)
            .fetch_optional(tx.statements())
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            row.as_ref().map(invocation).transpose()
        })
    }

    fn claim_expired(
        &self,
        claim: Claim,
        limit: i64,
    ) -> BoxFuture<'_, Result<Vec<Held>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::System).await?;
            let rows = sqlx::query(CLAIM_EXPIRED_SQL.as_str())
                .bind(claim.worker_id)
                .bind(limit)
                .fetch_all(tx.statements())
                .await
                .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            rows.iter().map(|row| held(invocation(row)?)).collect()
        })
    }

    fn take_over<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        claim: Claim,
    ) -> BoxFuture<'a, Result<Option<Held>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let row = sqlx::query(TAKE_OVER_SQL.as_str())
                .bind(id)
                .bind(tenant_id)
                .bind(claim.worker_id)
                .fetch_optional(tx.statements())
                .await
                .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
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
            let mut lease = self.hot.lease_for(tenant_id).await?;
            let result = sqlx::query(
                "SELECT t_status, t_code, t_count, t_base, t_synthesis FROM toolgate_tally($1, $2, $3, $4)",
            )
            .bind(tenant_id)
            .bind(run_id)
            .bind(tool_name)
            .bind(arguments_hash)
            .fetch_all(lease.statements()?)
            .await;
            let rows = lease.settle(result)?;
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
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let successes: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM tool_invocations WHERE tenant_id = $1 AND run_id = $2 AND tool_name = $3 \
                 AND arguments_hash = $4 AND outcome_status = 'succeeded'",
            )
            .bind(tenant_id)
            .bind(run_id)
            .bind(tool_name)
            .bind(arguments_hash)
            .fetch_one(tx.statements())
            .await
            .map_err(database_error)?;
            let last: Option<(String, i64)> = sqlx::query_as(
                "SELECT evidence_key, base FROM breaker_evidence WHERE tenant_id = $1 AND run_id = $2 \
                 AND tool_name = $3 AND arguments_hash = $4 FOR UPDATE",
            )
            .bind(tenant_id)
            .bind(run_id)
            .bind(tool_name)
            .bind(arguments_hash)
            .fetch_optional(tx.statements())
            .await
            .map_err(database_error)?;
            let restarted = match last {
                None => {
                    sqlx::query(
                        "INSERT INTO breaker_evidence (tenant_id, run_id, tool_name, arguments_hash, evidence_key, base) \
                         VALUES ($1, $2, $3, $4, $5, 0)",
                    )
                    .bind(tenant_id)
                    .bind(run_id)
                    .bind(tool_name)
                    .bind(arguments_hash)
                    .bind(evidence_key)
                    .execute(tx.statements())
                    .await
                    .map_err(database_error)?;
                    false
                }
                Some((key, _)) if key == evidence_key => false,
                Some((_, base)) => {
                    // A restart must lower the count, and the run must have one left.
                    let lowers = successes - base > 1;
                    let granted = lowers
                        && sqlx::query(
                            "INSERT INTO breaker_runs (tenant_id, run_id, restarts) VALUES ($1, $2, 1) \
                             ON CONFLICT (run_id, tenant_id) DO UPDATE SET restarts = breaker_runs.restarts + 1 \
                             WHERE breaker_runs.restarts < $3",
                        )
                        .bind(tenant_id)
                        .bind(run_id)
                        .bind(maximum_restarts)
                        .execute(tx.statements())
                        .await
                        .map_err(database_error)?
                        .rows_affected()
                            == 1;
                    let new_base = if granted { successes - 1 } else { base };
                    sqlx::query(
                        "UPDATE breaker_evidence SET evidence_key = $5, base = $6 WHERE tenant_id = $1 AND run_id = $2 \
                         AND tool_name = $3 AND arguments_hash = $4",
                    )
                    .bind(tenant_id)
                    .bind(run_id)
                    .bind(tool_name)
                    .bind(arguments_hash)
                    .bind(evidence_key)
                    .bind(new_base)
                    .execute(tx.statements())
                    .await
                    .map_err(database_error)?;
                    granted
                }
            };
            tx.commit().await.map_err(database_error)?;
            Ok(restarted)
        })
    }

    fn mark_synthesis_only<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        step: i64,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            sqlx::query(
                "INSERT INTO breaker_synthesis (tenant_id, run_id, after_step) VALUES ($1, $2, $3) \
                 ON CONFLICT (run_id, tenant_id) DO UPDATE \
                 SET after_step = LEAST(breaker_synthesis.after_step, EXCLUDED.after_step)",
            )
            .bind(tenant_id)
            .bind(run_id)
            .bind(step)
            .execute(tx.statements())
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)
        })
    }

    fn artifact<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
    ) -> BoxFuture<'a, Result<Option<ArtifactRecord>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let row = sqlx::query(ARTIFACT_WITH_OWNER)
                .bind(id)
                .bind(tenant_id)
                .fetch_optional(tx.statements())
                .await
                .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
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
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let moved = sqlx::query(REOPEN_APPROVAL_SQL.as_str())
                .bind(approval_id)
                .bind(reason_code.as_str())
                .bind(Option::<Uuid>::None)
                .bind(id)
                .bind(tenant_id)
                .bind(fence.worker_id)
                .bind(fence.lease_epoch)
                .execute(tx.statements())
                .await
                .map_err(database_error)?;
            if moved.rows_affected() != 1 {
                return Ok(false);
            }
            sqlx::query(
                "INSERT INTO approvals (id, tenant_id, invocation_id, tool_name, reason_code, status, requested_at) \
                 SELECT $1, tenant_id, id, tool_name, $2, 'pending', $3 FROM tool_invocations \
                 WHERE id = $4 AND tenant_id = $5",
            )
            .bind(approval_id)
            .bind(reason_code.as_str())
            .bind(now)
            .bind(id)
            .bind(tenant_id)
            .execute(tx.statements())
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            Ok(true)
        })
    }
}

/// The intent's statement: a call of `function` (`toolgate_insert` or its
/// uncounted form) with the row's parameters, committed as `$29` says.
macro_rules! intent_statement {
    ($function:literal) => {
        concat!(
            "SELECT * FROM ",
            $function,
            "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, \
             $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $30), \
             set_config('synchronous_commit', COALESCE($29, current_setting('synchronous_commit')), true)"
        )
    };
}
const INSERT: &str = intent_statement!("toolgate_insert");
const INSERT_UNCOUNTED: &str = intent_statement!("toolgate_insert_uncounted");

impl PostgresStore {
    /// Runs `sql` (one of the two above) for `new` on a hot connection: the
    /// row it returns, if any.
    async fn intent(
        &self,
        sql: &'static str,
        new: &NewInvocation,
        claim: Claim,
        events: &[ToolEvent],
    ) -> Result<Option<InvocationRecord>, StoreError> {
        let mut lease = self.hot.lease_for(&new.tenant_id).await?;
        let principal =
            serde_json::to_value(&new.principal).map_err(|e| StoreError::Decode(e.to_string()))?;
        let (kinds, bodies) = event_arrays(events)?;
        // No labels at all is NULL: every argument the model's.
        let argument_trust = (!new.argument_trust.labels().is_empty())
            .then(|| serde_json::to_value(&new.argument_trust))
            .transpose()
            .map_err(|e| StoreError::Decode(e.to_string()))?;
        let result = sqlx::query(sql)
            .bind(&new.tenant_id)
            .bind(new.id)
            .bind(new.session_id)
            .bind(new.run_id)
            .bind(new.step_number)
            .bind(&new.call_id)
            .bind(&new.tool_name)
            .bind(&new.tool_version)
            .bind(new.tool_source.as_str())
            .bind(&new.server_id)
            .bind(&new.arguments)
            .bind(&new.arguments_hash)
            .bind(&new.idempotency_key)
            .bind(new.status.as_str())
            .bind(new.idempotency_class.as_str())
            .bind(new.side_effect.as_str())
            .bind(principal)
            .bind(new.origin_trust.as_str())
            .bind(new.parallel_group)
            .bind(new.deadline_at)
            .bind(new.approval_id)
            .bind(new.reason_code.map(ReasonCode::as_str))
            .bind(
                new.status
                    .outcome_status(new.reason_code)
                    .map(|s| s.as_str()),
            )
            .bind(claim.worker_id)
            .bind(claim.now)
            .bind(new.status.is_terminal().then_some(claim.now))
            .bind(kinds)
            .bind(bodies)
            .bind(synchronous_commit(new.durability))
            .bind(argument_trust)
            .fetch_optional(lease.statements()?)
            .await;
        let row = lease.settle(result)?;
        row.as_ref().map(invocation).transpose()
    }
}

impl PostgresStore {
    /// Ends a row no worker holds (waiting, suspended) with `sql`, its
    /// terminal columns and, if it moved, its events, in one transaction.
    async fn end_unfenced(
        &self,
        sql: &'static str,
        tenant_id: &str,
        id: Uuid,
        terminal: &TerminalRecord,
        events: &[ToolEvent],
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
        let result = sqlx::query(sql)
            .bind(id)
            .bind(terminal.status.as_str())
            .bind(terminal.outcome_status.as_str())
            .bind(terminal.reason_code.map(ReasonCode::as_str))
            .bind(&terminal.result)
            .bind(&terminal.error)
            .bind(terminal.output_bytes)
            .bind(terminal.truncated)
            .bind(terminal.artifact.as_ref().map(|artifact| artifact.id))
            .bind(now)
            .bind(tenant_id.to_owned())
            .execute(tx.statements())
            .await
            .map_err(database_error)?;
        let ended = result.rows_affected() == 1;
        if ended {
            append_events(&mut tx, tenant_id, events, now).await?;
        }
        tx.commit().await.map_err(database_error)?;
        Ok(ended)
    }
}

/// The `synchronous_commit` a hot-path commit runs under: off for a relaxed
/// one (that transaction only), the session's own setting otherwise (never
/// weaker than the operator's, e.g. `remote_apply` on a replicated primary).
fn synchronous_commit(durability: Durability) -> Option<&'static str> {
    match durability {
        Durability::Flushed => None,
        Durability::Relaxed => Some("off"),
    }
}
