//! SqliteStore: The invocation rows: the four commits, the watermark, take-overs, suspension, the breaker's counts and artifacts.

use super::*;

/// A fenced call's terminal UPDATE ([`terminal_binds`] with a fence).
macro_rules! complete_update {
    () => {
        "UPDATE tool_invocations SET status = $2, outcome_status = $3, reason_code = $4, result = $5, \
         error = $6, output_bytes = $7, truncated = $8, artifact_id = $9, completed_at = $10 \
         WHERE id = $1 AND status IN ('authorized', 'running') AND tenant_id = $11 \
         AND worker_id = $12 AND lease_epoch = $13"
    };
}

impl InvocationStore for SqliteStore {
    fn insert_invocation<'a>(
        &'a self,
        new: &'a NewInvocation,
        claim: Claim,
        events: &'a [ToolEvent],
    ) -> BoxFuture<'a, Result<InsertOutcome, StoreError>> {
        Box::pin(async move {
            let Some(record) = self.intent(new, claim, events, false).await? else {
                // The key is held within the tenant: that row is the call's.
                let existing = sqlx::query(concat!(
                    "SELECT ",
                    invocation_columns!(),
                    " FROM tool_invocations WHERE idempotency_key = $1 AND tenant_id = $2"
                ))
                .bind(&new.idempotency_key)
                .bind(&new.tenant_id)
                .fetch_optional(&mut *self.reader().await?)
                .await
                .map_err(database_error)?;
                return match existing.as_ref().map(invocation).transpose()? {
                    Some(record) => Ok(InsertOutcome::Existing(record)),
                    None => Err(StoreError::Query("the row holding the key is gone".into())),
                };
            };
            Ok(InsertOutcome::Inserted(record))
        })
    }

    fn insert_uncounted<'a>(
        &'a self,
        new: &'a NewInvocation,
        claim: Claim,
        events: &'a [ToolEvent],
    ) -> BoxFuture<'a, Result<Option<HeldRow>, StoreError>> {
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
    ) -> BoxFuture<'a, Result<Option<HeldRow>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let row = sqlx::query(concat!(
                "UPDATE tool_invocations SET status = 'authorized', worker_id = $2, lease_epoch = lease_epoch + 1 \
                 WHERE id = $1 AND status = 'waiting_for_approval' AND tenant_id = $3 RETURNING ",
                invocation_columns!()
            ))
            .bind(id.to_string())
            .bind(claim.worker_id.to_string())
            .bind(tenant_id)
            .fetch_optional(&mut *tx)
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
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let result = terminal_update(
                &mut tx,
                "UPDATE tool_invocations SET status = $2, outcome_status = $3, reason_code = $4, result = $5, \
                 error = $6, output_bytes = $7, truncated = $8, artifact_id = $9, completed_at = $10 \
                 WHERE id = $1 AND status = 'waiting_for_approval' AND tenant_id = $11",
                id,
                tenant_id,
                terminal,
                now,
                None,
            )
            .await?;
            if result {
                append_events(&mut tx, tenant_id, events, now).await?;
            }
            tx.commit().await.map_err(database_error)?;
            Ok(result)
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
    ) -> BoxFuture<'a, Result<Option<HeldRow>, StoreError>> {
        Box::pin(async move {
            let rows = self
                .script_as(
                    durability,
                    sqlx::query(concat!(
                        "BEGIN IMMEDIATE; \
                         UPDATE tool_invocations SET status = 'running', lease_epoch = lease_epoch + 1, started_at = $4, \
                         attempt_number = CASE WHEN started_at IS NULL THEN attempt_number ELSE attempt_number + 1 END \
                         WHERE id = $1 AND status = 'authorized' AND worker_id = $2 AND lease_epoch = $3 \
                         AND tenant_id = $5 RETURNING ",
                        invocation_columns!(),
                        "; ",
                        insert_events!("$6", "$5", "$4", "changes() = 1"),
                        "; COMMIT"
                    ))
                    .bind(id.to_string())
                    .bind(fence.worker_id.to_string())
                    .bind(fence.lease_epoch)
                    .bind(micros(now))
                    .bind(tenant_id)
                    .bind(events_json(events)?),
                )
                .await?;
            let record = rows.first().map(invocation).transpose()?;
            record.map(held).transpose()
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
            let rows = self
                .script_as(
                    durability,
                    sqlx::query(
                        "BEGIN IMMEDIATE; \
                         UPDATE tool_invocations SET effect_sent_at = COALESCE(effect_sent_at, $4) \
                         WHERE id = $1 AND status = 'running' AND worker_id = $2 AND lease_epoch = $3 \
                         AND tenant_id = $5 \
                         AND EXISTS (SELECT 1 FROM workers w WHERE w.worker_id = $2 \
                                     AND w.released_at IS NULL AND w.lease_expires_at > $6) \
                         RETURNING id; \
                         COMMIT",
                    )
                    .bind(id.to_string())
                    .bind(fence.worker_id.to_string())
                    .bind(fence.lease_epoch)
                    .bind(micros(now))
                    .bind(tenant_id)
                    // The lease is judged by the store's clock, as workers
                    // are renewed by it.
                    .bind(micros(Utc::now())),
                )
                .await?;
            Ok(rows.len() == 1)
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
            if terminal.artifact.is_none() && terminal.produced.is_empty() {
                // The common case as one script; artifacts take the path
                // below, a statement each.
                let rows = self
                    .script_as(
                        terminal.durability,
                        terminal_binds(
                            sqlx::query(concat!(
                                "BEGIN IMMEDIATE; ",
                                complete_update!(),
                                " RETURNING id; ",
                                insert_events!("$14", "$11", "$10", "changes() = 1"),
                                "; COMMIT"
                            )),
                            id,
                            tenant_id,
                            terminal,
                            now,
                            Some(fence),
                        )
                        .bind(events_json(events)?),
                    )
                    .await?;
                return Ok(rows.len() == 1);
            }
            let mut tx = self.begin_as(terminal.durability).await?;
            let result = terminal_update(
                &mut tx,
                complete_update!(),
                id,
                tenant_id,
                terminal,
                now,
                Some(fence),
            )
            .await?;
            if result {
                for artifact in terminal.artifact.iter().chain(terminal.produced.iter()) {
                    sqlx::query(
                        "INSERT INTO artifacts (id, tenant_id, run_id, invocation_id, media_type, bytes, trust, created_at) \
                         SELECT $1, tenant_id, run_id, id, $3, $4, $5, $6 FROM tool_invocations WHERE id = $2",
                    )
                    .bind(artifact.id.to_string())
                    .bind(id.to_string())
                    .bind(&artifact.media_type)
                    .bind(artifact.bytes)
                    .bind(artifact.trust.as_str())
                    .bind(micros(now))
                    .execute(&mut *tx)
                    .await
                    .map_err(database_error)?;
                }
                append_events(&mut tx, tenant_id, events, now).await?;
            }
            tx.commit().await.map_err(database_error)?;
            Ok(result)
        })
    }

    fn release_invocation<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let result = sqlx::query(
                "UPDATE tool_invocations SET worker_id = NULL, lease_epoch = lease_epoch + 1 \
                 WHERE id = $1 AND tenant_id = $2 AND status IN ('authorized', 'running') \
                 AND suspended_kind IS NULL AND worker_id = $3 AND lease_epoch = $4",
            )
            .bind(id.to_string())
            .bind(tenant_id)
            .bind(fence.worker_id.to_string())
            .bind(fence.lease_epoch)
            .execute(&mut *tx)
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
            let mut tx = self.begin().await?;
            // The lease is released with the row: a suspended call is not a
            // dead worker's, and no sweep may take it.
            let result = sqlx::query(
                "UPDATE tool_invocations SET suspended_kind = $1, suspended_ref = $2, worker_id = $3 \
                 WHERE id = $4 AND tenant_id = $5 AND status = 'running' AND suspended_kind IS NULL \
                 AND worker_id = $6 AND lease_epoch = $7",
            )
            .bind(kind)
            .bind(reference)
            .bind(Option::<String>::None)
            .bind(id.to_string())
            .bind(tenant_id)
            .bind(fence.worker_id.to_string())
            .bind(fence.lease_epoch)
            .execute(&mut *tx)
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
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let result = terminal_update(
                &mut tx,
                "UPDATE tool_invocations SET status = $2, outcome_status = $3, reason_code = $4, result = $5, \
                 error = $6, output_bytes = $7, truncated = $8, artifact_id = $9, completed_at = $10 \
                 WHERE id = $1 AND status = 'running' AND suspended_kind IS NOT NULL AND tenant_id = $11",
                id,
                tenant_id,
                terminal,
                now,
                None,
            )
            .await?;
            if result {
                append_events(&mut tx, tenant_id, events, now).await?;
            }
            tx.commit().await.map_err(database_error)?;
            Ok(result)
        })
    }

    fn invocation<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
    ) -> BoxFuture<'a, Result<Option<InvocationRecord>, StoreError>> {
        Box::pin(async move {
            let row = sqlx::query(concat!(
                "SELECT ",
                invocation_columns!(),
                " FROM tool_invocations WHERE id = $1 AND tenant_id = $2"
            ))
            .bind(id.to_string())
            .bind(tenant_id)
            .fetch_optional(&mut *self.reader().await?)
            .await
            .map_err(database_error)?;
            row.as_ref().map(invocation).transpose()
        })
    }

    fn run_invocations<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
    ) -> BoxFuture<'a, Result<Vec<InvocationRecord>, StoreError>> {
        Box::pin(async move {
            let rows = sqlx::query(concat!(
                "SELECT ",
                invocation_columns!(),
                " FROM tool_invocations WHERE tenant_id = $1 AND run_id = $2 ORDER BY step_number, created_at, id"
            ))
            .bind(tenant_id)
            .bind(run_id.to_string())
            .fetch_all(&mut *self.reader().await?)
            .await
            .map_err(database_error)?;
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
            let row = sqlx::query(concat!(
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
            .fetch_optional(&mut *self.reader().await?)
            .await
            .map_err(database_error)?;
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
            let row = sqlx::query(concat!(
                "SELECT ",
                invocation_columns!(),
                " FROM tool_invocations WHERE tenant_id = $1 AND run_id = $2 AND tool_name = $3 \
                 AND outcome_status = 'succeeded' \
                 ORDER BY step_number DESC, created_at DESC, id DESC LIMIT 1"
            ))
            .bind(tenant_id)
            .bind(run_id.to_string())
            .bind(tool_name)
            .fetch_optional(&mut *self.reader().await?)
            .await
            .map_err(database_error)?;
            row.as_ref().map(invocation).transpose()
        })
    }

    fn claim_expired(
        &self,
        claim: Claim,
        limit: i64,
    ) -> BoxFuture<'_, Result<Vec<HeldRow>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let rows = sqlx::query(concat!(
                "UPDATE tool_invocations SET worker_id = $1, lease_epoch = lease_epoch + 1, \
                 attempt_number = CASE WHEN started_at IS NULL THEN attempt_number ELSE attempt_number + 1 END \
                 WHERE id IN (\
                    SELECT i.id FROM tool_invocations i LEFT JOIN workers w ON w.worker_id = i.worker_id \
                    WHERE i.status IN ('authorized', 'running') AND i.suspended_kind IS NULL \
                      AND (w.worker_id IS NULL OR w.released_at IS NOT NULL OR w.lease_expires_at < $2) \
                    ORDER BY i.created_at LIMIT $3) \
                 RETURNING ",
                invocation_columns!()
            ))
            .bind(claim.worker_id.to_string())
            .bind(micros(claim.now))
            .bind(limit)
            .fetch_all(&mut *tx)
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
    ) -> BoxFuture<'a, Result<Option<HeldRow>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let row = sqlx::query(concat!(
                "UPDATE tool_invocations SET worker_id = $3, lease_epoch = lease_epoch + 1, \
                 attempt_number = CASE WHEN started_at IS NULL THEN attempt_number ELSE attempt_number + 1 END \
                 WHERE id = $1 AND tenant_id = $2 AND status IN ('authorized', 'running') \
                   AND suspended_kind IS NULL \
                   AND NOT EXISTS (SELECT 1 FROM workers w WHERE w.worker_id = tool_invocations.worker_id \
                                   AND w.released_at IS NULL AND w.lease_expires_at >= $4) \
                 RETURNING ",
                invocation_columns!()
            ))
            .bind(id.to_string())
            .bind(tenant_id)
            .bind(claim.worker_id.to_string())
            .bind(micros(claim.now))
            .fetch_optional(&mut *tx)
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
            // One statement, so one snapshot and one round trip: the counts,
            // then the evidence base as a row of its own (`n` NULL).
            let rows = sqlx::query(
                "SELECT outcome_status, reason_code, count(*) AS n, NULL AS base FROM tool_invocations \
                 WHERE tenant_id = $1 AND run_id = $2 AND tool_name = $3 AND arguments_hash = $4 \
                   AND outcome_status IS NOT NULL \
                 GROUP BY outcome_status, reason_code \
                 UNION ALL \
                 SELECT NULL, NULL, NULL, base FROM breaker_evidence \
                 WHERE tenant_id = $1 AND run_id = $2 AND tool_name = $3 AND arguments_hash = $4",
            )
            .bind(tenant_id)
            .bind(run_id.to_string())
            .bind(tool_name)
            .bind(arguments_hash)
            .fetch_all(&mut *self.reader().await?)
            .await
            .map_err(database_error)?;
            let mut tally = BreakerTally::default();
            for row in &rows {
                if let Some(base) = get::<Option<i64>>(row, "base")? {
                    tally.evidence_base = base;
                    continue;
                }
                tally.counts.push((
                    parse(&get::<String>(row, "outcome_status")?, "outcome_status")?,
                    parse_optional(get(row, "reason_code")?, "reason_code")?,
                    get::<i64>(row, "n")?,
                ));
            }
            Ok(tally)
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
            let mut tx = self.begin().await?;
            let successes: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM tool_invocations WHERE tenant_id = $1 AND run_id = $2 AND tool_name = $3 \
                 AND arguments_hash = $4 AND outcome_status = 'succeeded'",
            )
            .bind(tenant_id)
            .bind(run_id.to_string())
            .bind(tool_name)
            .bind(arguments_hash)
            .fetch_one(&mut *tx)
            .await
            .map_err(database_error)?;
            let last: Option<(String, i64)> = sqlx::query_as(
                "SELECT evidence_key, base FROM breaker_evidence WHERE tenant_id = $1 AND run_id = $2 \
                 AND tool_name = $3 AND arguments_hash = $4",
            )
            .bind(tenant_id)
            .bind(run_id.to_string())
            .bind(tool_name)
            .bind(arguments_hash)
            .fetch_optional(&mut *tx)
            .await
            .map_err(database_error)?;
            let restarted = match last {
                None => {
                    sqlx::query(
                        "INSERT INTO breaker_evidence (tenant_id, run_id, tool_name, arguments_hash, evidence_key, base) \
                         VALUES ($1, $2, $3, $4, $5, 0)",
                    )
                    .bind(tenant_id)
                    .bind(run_id.to_string())
                    .bind(tool_name)
                    .bind(arguments_hash)
                    .bind(evidence_key)
                    .execute(&mut *tx)
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
                        .bind(run_id.to_string())
                        .bind(maximum_restarts)
                        .execute(&mut *tx)
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
                    .bind(run_id.to_string())
                    .bind(tool_name)
                    .bind(arguments_hash)
                    .bind(evidence_key)
                    .bind(new_base)
                    .execute(&mut *tx)
                    .await
                    .map_err(database_error)?;
                    granted
                }
            };
            tx.commit().await.map_err(database_error)?;
            Ok(restarted)
        })
    }

    fn artifact<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
    ) -> BoxFuture<'a, Result<Option<ArtifactRecord>, StoreError>> {
        Box::pin(async move {
            let row = sqlx::query("SELECT id, run_id, media_type, bytes, trust FROM artifacts WHERE id = $1 AND tenant_id = $2")
                .bind(id.to_string())
                .bind(tenant_id)
                .fetch_optional(&mut *self.reader().await?)
                .await
                .map_err(database_error)?;
            row.map(|row| {
                Ok(ArtifactRecord {
                    artifact: StoredArtifact {
                        id: uuid(&row, "id")?,
                        media_type: get(&row, "media_type")?,
                        bytes: get(&row, "bytes")?,
                        trust: parse(&get::<String>(&row, "trust")?, "trust")?,
                    },
                    run_id: uuid(&row, "run_id")?,
                })
            })
            .transpose()
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
            let mut tx = self.begin().await?;
            let moved = sqlx::query(
                "UPDATE tool_invocations SET status = 'waiting_for_approval', approval_id = $1, \
                 reason_code = $2, worker_id = $3 \
                 WHERE id = $4 AND tenant_id = $5 AND status IN ('authorized', 'running') \
                 AND suspended_kind IS NULL AND worker_id = $6 AND lease_epoch = $7",
            )
            .bind(approval_id.to_string())
            .bind(reason_code.as_str())
            .bind(Option::<String>::None)
            .bind(id.to_string())
            .bind(tenant_id)
            .bind(fence.worker_id.to_string())
            .bind(fence.lease_epoch)
            .execute(&mut *tx)
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
            .bind(approval_id.to_string())
            .bind(reason_code.as_str())
            .bind(micros(now))
            .bind(id.to_string())
            .bind(tenant_id)
            .execute(&mut *tx)
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            Ok(true)
        })
    }
}

/// The terminal columns of an UPDATE, fenced when `fence` is given.
async fn terminal_update(
    tx: &mut Tx,
    sql: &'static str,
    id: Uuid,
    tenant_id: &str,
    terminal: &TerminalRecord,
    now: DateTime<Utc>,
    fence: Option<Fence>,
) -> Result<bool, StoreError> {
    let result = terminal_binds(sqlx::query(sql), id, tenant_id, terminal, now, fence)
        .execute(&mut **tx)
        .await
        .map_err(database_error)?;
    Ok(result.rows_affected() == 1)
}

/// Binds a terminal UPDATE's `$1` to `$11` (`$12` and `$13` with `fence`).
fn terminal_binds<'q>(
    query: sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments>,
    id: Uuid,
    tenant_id: &str,
    terminal: &TerminalRecord,
    now: DateTime<Utc>,
    fence: Option<Fence>,
) -> sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments> {
    let query = query
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
        .bind(tenant_id.to_owned());
    match fence {
        Some(fence) => query
            .bind(fence.worker_id.to_string())
            .bind(fence.lease_epoch),
        None => query,
    }
}

impl SqliteStore {
    /// The intent's script for `new`: the row it inserted, if any. With
    /// `uncounted`, only while no identical call of the run has an outcome.
    async fn intent(
        &self,
        new: &NewInvocation,
        claim: Claim,
        events: &[ToolEvent],
        uncounted: bool,
    ) -> Result<Option<InvocationRecord>, StoreError> {
        let principal =
            serde_json::to_string(&new.principal).map_err(|e| StoreError::Decode(e.to_string()))?;
        // One script: the row, its events and its approval when it waits
        // for one, the last two only where the row went in (a known key, or
        // an uncounted insert the breaker has something to count for,
        // inserts nothing).
        let inserted = self
            .script_as(
                new.durability,
                sqlx::query(concat!(
                    "BEGIN IMMEDIATE; \
                     INSERT INTO tool_invocations (id, tenant_id, session_id, run_id, step_number, call_id, tool_name, \
                     tool_version, tool_source, server_id, arguments, arguments_hash, idempotency_key, status, \
                     idempotency_class, side_effect, principal, origin_trust, parallel_group, deadline_at, approval_id, \
                     reason_code, outcome_status, worker_id, lease_epoch, created_at, completed_at, started_at) \
                     SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, \
                     $21, $22, $23, $24, 0, $25, $26, $27 \
                     WHERE NOT $29 OR NOT EXISTS (SELECT 1 FROM tool_invocations WHERE tenant_id = $2 AND run_id = $4 \
                     AND tool_name = $7 AND arguments_hash = $12 AND outcome_status IS NOT NULL) \
                     ON CONFLICT (idempotency_key, tenant_id) DO NOTHING RETURNING ",
                    invocation_columns!(),
                    "; ",
                    // `changes()` is still the row's insert here.
                    insert_events!("$28", "$2", "$25", "changes() = 1"),
                    "; INSERT INTO approvals (id, tenant_id, invocation_id, tool_name, reason_code, status, requested_at) \
                     SELECT $21, $2, $1, $7, $22, 'pending', $25 \
                     WHERE $21 IS NOT NULL AND $22 IS NOT NULL \
                     AND EXISTS (SELECT 1 FROM tool_invocations WHERE id = $1) \
                     AND NOT EXISTS (SELECT 1 FROM approvals WHERE id = $21)",
                    "; COMMIT"
                ))
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
                .bind(
                    (new.status == crate::domain::InvocationStatus::Running)
                        .then_some(micros(claim.now)),
                )
                .bind(events_json(events)?)
                .bind(uncounted),
            )
            .await?;
        inserted.first().map(invocation).transpose()
    }
}
