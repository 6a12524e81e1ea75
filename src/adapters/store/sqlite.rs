//! The store on embedded SQLite: the single-node default. Writes take the
//! database lock at `BEGIN IMMEDIATE`, so there is one writer at a time and
//! event ids are assigned in commit order. UUIDs and JSON are TEXT and
//! timestamps INTEGER microseconds, converted here.

use chrono::{DateTime, Utc};
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Row, Sqlite, SqlitePool, Transaction};
use uuid::Uuid;

use super::{SQLITE_MIGRATIONS, database_error, event_body, parse, parse_optional, plan};
use crate::domain::{ApprovalStatus, ReasonCode};
use crate::ports::{
    ApprovalRecord, BoxFuture, BreakerTally, CatalogEntry, CatalogGeneration, CatalogRow, Claim,
    EventRecord, Fence, InsertOutcome, InvocationRecord, McpServerRow, NewInvocation,
    PlatformEvent, PreparationRecord, ReviewRecord, SessionRecord, Store, StoreError,
    StoredArtifact, TerminalRecord, ToolEvent, WorkerLease,
};

/// Readers run beside the one writer (WAL).
const MAXIMUM_CONNECTIONS: u32 = 8;

/// How long a writer waits for the lock before the store reports busy.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

macro_rules! invocation_columns {
    () => {
        "id, tenant_id, session_id, run_id, step_number, call_id, tool_name, tool_version, tool_source, \
         server_id, arguments, arguments_hash, idempotency_key, status, idempotency_class, side_effect, \
         principal, origin_trust, parallel_group, deadline_at, approval_id, effect_sent_at, attempt_number, \
         worker_id, lease_epoch, suspended_kind, suspended_ref, outcome_status, reason_code, result, error, \
         output_bytes, truncated, artifact_id, created_at, started_at, completed_at"
    };
}

macro_rules! approval_columns {
    () => {
        "id, tenant_id, invocation_id, tool_name, reason_code, status, approver, requested_at, decided_at"
    };
}

/// The SQLite store.
#[derive(Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating if missing) the database file; does not migrate.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(database_error)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // FULL: a commit survives power loss, not only a crash.
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT);
        if let Some(parent) = options.get_filename().parent()
            && !parent.as_os_str().is_empty()
        {
            std::fs::create_dir_all(parent)
                .map_err(|e| StoreError::Unavailable(format!("database folder: {}", e.kind())))?;
        }
        let pool = SqlitePoolOptions::new()
            .max_connections(MAXIMUM_CONNECTIONS)
            .connect_with(options)
            .await
            .map_err(database_error)?;
        Ok(SqliteStore { pool })
    }

    /// A write transaction holding the database lock from its first statement,
    /// so it never fails halfway on a lock upgrade.
    async fn begin(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        self.pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(database_error)
    }

    async fn applied(&self) -> Result<Vec<(i64, String)>, StoreError> {
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS toolgate_migrations (\
                version BIGINT PRIMARY KEY, description TEXT NOT NULL, \
                checksum TEXT NOT NULL, applied_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)",
        )
        .execute(&self.pool)
        .await
        .map_err(database_error)?;
        let rows =
            sqlx::query("SELECT version, checksum FROM toolgate_migrations ORDER BY version")
                .fetch_all(&self.pool)
                .await
                .map_err(database_error)?;
        rows.iter()
            .map(|row| Ok((get(row, "version")?, get(row, "checksum")?)))
            .collect()
    }
}

fn get<'r, T>(row: &'r SqliteRow, column: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, Sqlite> + sqlx::Type<Sqlite>,
{
    row.try_get(column)
        .map_err(|error| StoreError::Decode(format!("{column}: {error}")))
}

fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

fn time(row: &SqliteRow, column: &str) -> Result<DateTime<Utc>, StoreError> {
    let micros: i64 = get(row, column)?;
    DateTime::from_timestamp_micros(micros)
        .ok_or_else(|| StoreError::Decode(format!("{column}: out of range")))
}

fn optional_time(row: &SqliteRow, column: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
    get::<Option<i64>>(row, column)?
        .map(|micros| {
            DateTime::from_timestamp_micros(micros)
                .ok_or_else(|| StoreError::Decode(format!("{column}: out of range")))
        })
        .transpose()
}

fn uuid(row: &SqliteRow, column: &str) -> Result<Uuid, StoreError> {
    let text: String = get(row, column)?;
    Uuid::parse_str(&text).map_err(|_| StoreError::Decode(format!("{column}: not a UUID")))
}

fn optional_uuid(row: &SqliteRow, column: &str) -> Result<Option<Uuid>, StoreError> {
    get::<Option<String>>(row, column)?
        .map(|text| {
            Uuid::parse_str(&text).map_err(|_| StoreError::Decode(format!("{column}: not a UUID")))
        })
        .transpose()
}

const SESSION_BY_ID: &str = "SELECT session_id, tenant_id, principal, agent, tool_schema_sha256, \
                             tool_contract_sha256, opened_at, last_used_at FROM sessions WHERE session_id = $1";

fn session_row(row: &SqliteRow) -> Result<SessionRecord, StoreError> {
    Ok(SessionRecord {
        session_id: uuid(row, "session_id")?,
        tenant_id: get(row, "tenant_id")?,
        principal: serde_json::from_value(json(row, "principal")?)
            .map_err(|e| StoreError::Decode(format!("principal: {e}")))?,
        agent: serde_json::from_value(json(row, "agent")?)
            .map_err(|e| StoreError::Decode(format!("agent: {e}")))?,
        tool_schema_sha256: get(row, "tool_schema_sha256")?,
        tool_contract_sha256: get(row, "tool_contract_sha256")?,
        opened_at: time(row, "opened_at")?,
        last_used_at: time(row, "last_used_at")?,
    })
}

fn json(row: &SqliteRow, column: &str) -> Result<serde_json::Value, StoreError> {
    let text: String = get(row, column)?;
    serde_json::from_str(&text).map_err(|_| StoreError::Decode(format!("{column}: not JSON")))
}

fn optional_json(row: &SqliteRow, column: &str) -> Result<Option<serde_json::Value>, StoreError> {
    get::<Option<String>>(row, column)?
        .map(|text| {
            serde_json::from_str(&text)
                .map_err(|_| StoreError::Decode(format!("{column}: not JSON")))
        })
        .transpose()
}

fn text(value: &serde_json::Value) -> String {
    value.to_string()
}

fn invocation(row: &SqliteRow) -> Result<InvocationRecord, StoreError> {
    let principal = json(row, "principal")?;
    Ok(InvocationRecord {
        id: uuid(row, "id")?,
        tenant_id: get(row, "tenant_id")?,
        session_id: uuid(row, "session_id")?,
        run_id: uuid(row, "run_id")?,
        step_number: get(row, "step_number")?,
        call_id: get(row, "call_id")?,
        tool_name: get(row, "tool_name")?,
        tool_version: get(row, "tool_version")?,
        tool_source: parse(&get::<String>(row, "tool_source")?, "tool_source")?,
        server_id: get(row, "server_id")?,
        arguments: json(row, "arguments")?,
        arguments_hash: get(row, "arguments_hash")?,
        idempotency_key: get(row, "idempotency_key")?,
        status: parse(&get::<String>(row, "status")?, "status")?,
        idempotency_class: parse(
            &get::<String>(row, "idempotency_class")?,
            "idempotency_class",
        )?,
        side_effect: parse(&get::<String>(row, "side_effect")?, "side_effect")?,
        principal: serde_json::from_value(principal)
            .map_err(|e| StoreError::Decode(format!("principal: {e}")))?,
        origin_trust: parse(&get::<String>(row, "origin_trust")?, "origin_trust")?,
        parallel_group: optional_uuid(row, "parallel_group")?,
        deadline_at: optional_time(row, "deadline_at")?,
        approval_id: optional_uuid(row, "approval_id")?,
        effect_sent_at: optional_time(row, "effect_sent_at")?,
        attempt_number: get(row, "attempt_number")?,
        worker_id: optional_uuid(row, "worker_id")?,
        lease_epoch: get(row, "lease_epoch")?,
        suspended_kind: get(row, "suspended_kind")?,
        suspended_ref: get(row, "suspended_ref")?,
        outcome_status: parse_optional(get(row, "outcome_status")?, "outcome_status")?,
        reason_code: parse_optional(get(row, "reason_code")?, "reason_code")?,
        result: optional_json(row, "result")?,
        error: optional_json(row, "error")?,
        output_bytes: get(row, "output_bytes")?,
        truncated: get(row, "truncated")?,
        artifact_id: optional_uuid(row, "artifact_id")?,
        created_at: time(row, "created_at")?,
        started_at: optional_time(row, "started_at")?,
        completed_at: optional_time(row, "completed_at")?,
    })
}

fn approval(row: &SqliteRow) -> Result<ApprovalRecord, StoreError> {
    Ok(ApprovalRecord {
        id: uuid(row, "id")?,
        tenant_id: get(row, "tenant_id")?,
        invocation_id: uuid(row, "invocation_id")?,
        tool_name: get(row, "tool_name")?,
        reason_code: parse::<ReasonCode>(&get::<String>(row, "reason_code")?, "reason_code")?,
        status: parse::<ApprovalStatus>(&get::<String>(row, "status")?, "status")?,
        approver: get(row, "approver")?,
        requested_at: time(row, "requested_at")?,
        decided_at: optional_time(row, "decided_at")?,
    })
}

async fn append_events(
    tx: &mut Transaction<'static, Sqlite>,
    tenant_id: &str,
    events: &[ToolEvent],
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    for event in events {
        sqlx::query("INSERT INTO events (tenant_id, event_type, payload, created_at) VALUES ($1, $2, $3, $4)")
            .bind(tenant_id)
            .bind(event.kind.as_str())
            .bind(text(&event_body(event)?))
            .bind(micros(now))
            .execute(&mut **tx)
            .await
            .map_err(database_error)?;
    }
    Ok(())
}

impl Store for SqliteStore {
    fn pending_migrations(&self) -> BoxFuture<'_, Result<Vec<i64>, StoreError>> {
        Box::pin(async move {
            let applied = self.applied().await?;
            Ok(plan(SQLITE_MIGRATIONS, &applied)?
                .iter()
                .map(|m| m.version)
                .collect())
        })
    }

    fn migrate(&self) -> BoxFuture<'_, Result<Vec<i64>, StoreError>> {
        Box::pin(async move {
            self.applied().await?;
            let mut tx = self.begin().await?;
            // Read again under the lock: another process may have just migrated.
            let rows =
                sqlx::query("SELECT version, checksum FROM toolgate_migrations ORDER BY version")
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(database_error)?;
            let applied = rows
                .iter()
                .map(|row| Ok((get(row, "version")?, get(row, "checksum")?)))
                .collect::<Result<Vec<(i64, String)>, StoreError>>()?;
            let pending = plan(SQLITE_MIGRATIONS, &applied)?;
            for migration in &pending {
                sqlx::raw_sql(migration.sql)
                    .execute(&mut *tx)
                    .await
                    .map_err(|error| StoreError::Migration {
                        version: migration.version,
                        reason: database_error(error).to_string(),
                    })?;
                sqlx::query("INSERT INTO toolgate_migrations (version, description, checksum) VALUES ($1, $2, $3)")
                    .bind(migration.version)
                    .bind(migration.description)
                    .bind(migration.checksum())
                    .execute(&mut *tx)
                    .await
                    .map_err(database_error)?;
            }
            tx.commit().await.map_err(database_error)?;
            Ok(pending.iter().map(|m| m.version).collect())
        })
    }

    fn register_worker<'a>(
        &'a self,
        lease: &'a WorkerLease,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            sqlx::query(
                "INSERT INTO workers (worker_id, node, started_at, heartbeat_at, lease_expires_at) \
                 VALUES ($1, $2, $3, $3, $4)",
            )
            .bind(lease.worker_id.to_string())
            .bind(&lease.node)
            .bind(micros(lease.started_at))
            .bind(micros(lease.lease_expires_at))
            .execute(&self.pool)
            .await
            .map_err(database_error)?;
            Ok(())
        })
    }

    fn heartbeat(
        &self,
        worker_id: Uuid,
        lease_expires_at: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        Box::pin(async move {
            let result = sqlx::query(
                "UPDATE workers SET heartbeat_at = $3, lease_expires_at = $2 \
                 WHERE worker_id = $1 AND released_at IS NULL",
            )
            .bind(worker_id.to_string())
            .bind(micros(lease_expires_at))
            .bind(micros(Utc::now()))
            .execute(&self.pool)
            .await
            .map_err(database_error)?;
            Ok(result.rows_affected() == 1)
        })
    }

    fn release_worker(
        &self,
        worker_id: Uuid,
        now: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            sqlx::query(
                "UPDATE workers SET released_at = $2, lease_expires_at = $2 WHERE worker_id = $1",
            )
            .bind(worker_id.to_string())
            .bind(micros(now))
            .execute(&self.pool)
            .await
            .map_err(database_error)?;
            Ok(())
        })
    }

    fn worker(&self, worker_id: Uuid) -> BoxFuture<'_, Result<Option<WorkerLease>, StoreError>> {
        Box::pin(async move {
            let row = sqlx::query(
                "SELECT worker_id, node, started_at, lease_expires_at FROM workers WHERE worker_id = $1",
            )
            .bind(worker_id.to_string())
            .fetch_optional(&self.pool)
            .await
            .map_err(database_error)?;
            row.map(|row| {
                Ok(WorkerLease {
                    worker_id: uuid(&row, "worker_id")?,
                    node: get(&row, "node")?,
                    started_at: time(&row, "started_at")?,
                    lease_expires_at: time(&row, "lease_expires_at")?,
                })
            })
            .transpose()
        })
    }

    fn insert_invocation<'a>(
        &'a self,
        new: &'a NewInvocation,
        claim: Claim,
        events: &'a [ToolEvent],
    ) -> BoxFuture<'a, Result<InsertOutcome, StoreError>> {
        Box::pin(async move {
            let principal = serde_json::to_string(&new.principal)
                .map_err(|e| StoreError::Decode(e.to_string()))?;
            let mut tx = self.begin().await?;
            let inserted = sqlx::query(concat!(
                "INSERT INTO tool_invocations (id, tenant_id, session_id, run_id, step_number, call_id, tool_name, \
                 tool_version, tool_source, server_id, arguments, arguments_hash, idempotency_key, status, \
                 idempotency_class, side_effect, principal, origin_trust, parallel_group, deadline_at, approval_id, \
                 reason_code, outcome_status, worker_id, lease_epoch, created_at, completed_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, \
                 $21, $22, $23, $24, 0, $25, $26) \
                 ON CONFLICT (idempotency_key) DO NOTHING RETURNING ",
                invocation_columns!()
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
            .fetch_optional(&mut *tx)
            .await
            .map_err(database_error)?;
            let Some(row) = inserted else {
                let existing = sqlx::query(concat!(
                    "SELECT ",
                    invocation_columns!(),
                    " FROM tool_invocations WHERE idempotency_key = $1"
                ))
                .bind(&new.idempotency_key)
                .fetch_optional(&mut *tx)
                .await
                .map_err(database_error)?;
                tx.commit().await.map_err(database_error)?;
                let existing = existing.as_ref().map(invocation).transpose()?;
                return match existing {
                    Some(record) if record.tenant_id == new.tenant_id => {
                        Ok(InsertOutcome::Existing(record))
                    }
                    // Another tenant's key: neither its row nor its existence is told.
                    _ => Err(StoreError::KeyConflict),
                };
            };
            let record = invocation(&row)?;
            if let (Some(approval_id), Some(reason_code)) = (new.approval_id, new.reason_code) {
                sqlx::query(
                    "INSERT INTO approvals (id, tenant_id, invocation_id, tool_name, reason_code, status, requested_at) \
                     VALUES ($1, $2, $3, $4, $5, 'pending', $6)",
                )
                .bind(approval_id.to_string())
                .bind(&new.tenant_id)
                .bind(new.id.to_string())
                .bind(&new.tool_name)
                .bind(reason_code.as_str())
                .bind(micros(claim.now))
                .execute(&mut *tx)
                .await
                .map_err(database_error)?;
            }
            append_events(&mut tx, &new.tenant_id, events, claim.now).await?;
            tx.commit().await.map_err(database_error)?;
            Ok(InsertOutcome::Inserted(record))
        })
    }

    fn authorize_waiting<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        claim: Claim,
        events: &'a [ToolEvent],
    ) -> BoxFuture<'a, Result<Option<InvocationRecord>, StoreError>> {
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
            Ok(record)
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
    ) -> BoxFuture<'a, Result<Option<InvocationRecord>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let row = sqlx::query(concat!(
                "UPDATE tool_invocations SET status = 'running', lease_epoch = lease_epoch + 1, started_at = $4, \
                 attempt_number = CASE WHEN started_at IS NULL THEN attempt_number ELSE attempt_number + 1 END \
                 WHERE id = $1 AND status = 'authorized' AND worker_id = $2 AND lease_epoch = $3 \
                 AND tenant_id = $5 RETURNING ",
                invocation_columns!()
            ))
            .bind(id.to_string())
            .bind(fence.worker_id.to_string())
            .bind(fence.lease_epoch)
            .bind(micros(now))
            .bind(tenant_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(database_error)?;
            let record = row.as_ref().map(invocation).transpose()?;
            if record.is_some() {
                append_events(&mut tx, tenant_id, events, now).await?;
            }
            tx.commit().await.map_err(database_error)?;
            Ok(record)
        })
    }

    fn mark_effect_sent<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let result = sqlx::query(
                "UPDATE tool_invocations SET effect_sent_at = COALESCE(effect_sent_at, $4) \
                 WHERE id = $1 AND status = 'running' AND worker_id = $2 AND lease_epoch = $3 AND tenant_id = $5",
            )
            .bind(id.to_string())
            .bind(fence.worker_id.to_string())
            .bind(fence.lease_epoch)
            .bind(micros(now))
            .bind(tenant_id)
            .execute(&mut *tx)
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            Ok(result.rows_affected() == 1)
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
            let mut tx = self.begin().await?;
            let result = terminal_update(
                &mut tx,
                "UPDATE tool_invocations SET status = $2, outcome_status = $3, reason_code = $4, result = $5, \
                 error = $6, output_bytes = $7, truncated = $8, artifact_id = $9, completed_at = $10 \
                 WHERE id = $1 AND status IN ('authorized', 'running') AND tenant_id = $11 \
                 AND worker_id = $12 AND lease_epoch = $13",
                id,
                tenant_id,
                terminal,
                now,
                Some(fence),
            )
            .await?;
            if result {
                if let Some(artifact) = &terminal.artifact {
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
            .fetch_optional(&self.pool)
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
            .fetch_all(&self.pool)
            .await
            .map_err(database_error)?;
            rows.iter().map(invocation).collect()
        })
    }

    fn claim_expired(
        &self,
        claim: Claim,
        limit: i64,
    ) -> BoxFuture<'_, Result<Vec<InvocationRecord>, StoreError>> {
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
            rows.iter().map(invocation).collect()
        })
    }

    fn take_over<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        claim: Claim,
    ) -> BoxFuture<'a, Result<Option<InvocationRecord>, StoreError>> {
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
            row.as_ref().map(invocation).transpose()
        })
    }

    fn approval<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, StoreError>> {
        Box::pin(async move {
            let row = sqlx::query(concat!(
                "SELECT ",
                approval_columns!(),
                " FROM approvals WHERE id = $1 AND tenant_id = $2"
            ))
            .bind(id.to_string())
            .bind(tenant_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(database_error)?;
            row.as_ref().map(approval).transpose()
        })
    }

    fn pending_approvals<'a>(
        &'a self,
        tenant_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ApprovalRecord>, StoreError>> {
        Box::pin(async move {
            let rows = sqlx::query(concat!(
                "SELECT ",
                approval_columns!(),
                " FROM approvals WHERE tenant_id = $1 AND status = 'pending' ORDER BY requested_at, id"
            ))
            .bind(tenant_id)
            .fetch_all(&self.pool)
            .await
            .map_err(database_error)?;
            rows.iter().map(approval).collect()
        })
    }

    fn decide_approval<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        status: ApprovalStatus,
        approver: &'a str,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let row = sqlx::query(concat!(
                "UPDATE approvals SET status = $3, approver = $4, decided_at = $5 \
                 WHERE id = $1 AND tenant_id = $2 AND status = 'pending' RETURNING ",
                approval_columns!()
            ))
            .bind(id.to_string())
            .bind(tenant_id)
            .bind(status.as_str())
            .bind(approver)
            .bind(micros(now))
            .fetch_optional(&mut *tx)
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            row.as_ref().map(approval).transpose()
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
            let mut tx = self.begin().await?;
            let rows = sqlx::query(
                "SELECT outcome_status, reason_code, count(*) AS n FROM tool_invocations \
                 WHERE tenant_id = $1 AND run_id = $2 AND tool_name = $3 AND arguments_hash = $4 \
                   AND outcome_status IS NOT NULL \
                 GROUP BY outcome_status, reason_code",
            )
            .bind(tenant_id)
            .bind(run_id.to_string())
            .bind(tool_name)
            .bind(arguments_hash)
            .fetch_all(&mut *tx)
            .await
            .map_err(database_error)?;
            let base: Option<i64> = sqlx::query_scalar(
                "SELECT base FROM breaker_evidence WHERE tenant_id = $1 AND run_id = $2 AND tool_name = $3 \
                 AND arguments_hash = $4",
            )
            .bind(tenant_id)
            .bind(run_id.to_string())
            .bind(tool_name)
            .bind(arguments_hash)
            .fetch_optional(&mut *tx)
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            let counts = rows
                .iter()
                .map(|row| {
                    Ok((
                        parse(&get::<String>(row, "outcome_status")?, "outcome_status")?,
                        parse_optional(get(row, "reason_code")?, "reason_code")?,
                        get::<i64>(row, "n")?,
                    ))
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            Ok(BreakerTally {
                counts,
                evidence_base: base.unwrap_or(0),
            })
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
                             ON CONFLICT (run_id) DO UPDATE SET restarts = breaker_runs.restarts + 1 \
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
    ) -> BoxFuture<'a, Result<Option<StoredArtifact>, StoreError>> {
        Box::pin(async move {
            let row = sqlx::query("SELECT id, media_type, bytes, trust FROM artifacts WHERE id = $1 AND tenant_id = $2")
                .bind(id.to_string())
                .bind(tenant_id)
                .fetch_optional(&self.pool)
                .await
                .map_err(database_error)?;
            row.map(|row| {
                Ok(StoredArtifact {
                    id: uuid(&row, "id")?,
                    media_type: get(&row, "media_type")?,
                    bytes: get(&row, "bytes")?,
                    trust: parse(&get::<String>(&row, "trust")?, "trust")?,
                })
            })
            .transpose()
        })
    }

    fn record_preparation<'a>(
        &'a self,
        tenant_id: &'a str,
        record: &'a PreparationRecord,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            for server in &record.servers {
                upsert_server(&mut tx, tenant_id, server, now).await?;
            }
            let mut written = Vec::with_capacity(record.generations.len());
            for generation in &record.generations {
                written.push(write_generation(&mut tx, tenant_id, generation, now).await?);
            }
            for event in &record.events {
                insert_platform_event(&mut tx, Some(tenant_id), event, now).await?;
            }
            tx.commit().await.map_err(database_error)?;
            Ok(written)
        })
    }

    fn record_event<'a>(
        &'a self,
        tenant_id: Option<&'a str>,
        event: &'a PlatformEvent,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            insert_platform_event(&mut tx, tenant_id, event, now).await?;
            tx.commit().await.map_err(database_error)
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

    fn open_session<'a>(
        &'a self,
        session: &'a SessionRecord,
    ) -> BoxFuture<'a, Result<SessionRecord, StoreError>> {
        Box::pin(async move {
            let principal = serde_json::to_string(&session.principal)
                .map_err(|e| StoreError::Decode(e.to_string()))?;
            let agent = serde_json::to_string(&session.agent)
                .map_err(|e| StoreError::Decode(e.to_string()))?;
            let mut tx = self.begin().await?;
            sqlx::query(
                "INSERT INTO sessions (session_id, tenant_id, principal, agent, tool_schema_sha256, \
                 tool_contract_sha256, opened_at, last_used_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
                 ON CONFLICT (session_id) DO NOTHING",
            )
            .bind(session.session_id.to_string())
            .bind(&session.tenant_id)
            .bind(principal)
            .bind(agent)
            .bind(&session.tool_schema_sha256)
            .bind(&session.tool_contract_sha256)
            .bind(micros(session.opened_at))
            .bind(micros(session.last_used_at))
            .execute(&mut *tx)
            .await
            .map_err(database_error)?;
            let row = sqlx::query(SESSION_BY_ID)
                .bind(session.session_id.to_string())
                .fetch_one(&mut *tx)
                .await
                .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            session_row(&row)
        })
    }

    fn session(
        &self,
        session_id: Uuid,
    ) -> BoxFuture<'_, Result<Option<SessionRecord>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let row = sqlx::query(SESSION_BY_ID)
                .bind(session_id.to_string())
                .fetch_optional(&mut *tx)
                .await
                .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            row.map(|row| session_row(&row)).transpose()
        })
    }

    fn touch_session(
        &self,
        session_id: Uuid,
        now: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            sqlx::query(
                "UPDATE sessions SET last_used_at = $2 WHERE session_id = $1 AND last_used_at < $2",
            )
            .bind(session_id.to_string())
            .bind(micros(now))
            .execute(&mut *tx)
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)
        })
    }

    fn forget_sessions(&self, before: DateTime<Utc>) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let deleted = sqlx::query("DELETE FROM sessions WHERE last_used_at < $1")
                .bind(micros(before))
                .execute(&mut *tx)
                .await
                .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            Ok(deleted.rows_affected())
        })
    }

    fn put_mcp_server<'a>(
        &'a self,
        tenant_id: &'a str,
        server: &'a McpServerRow,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            upsert_server(&mut tx, tenant_id, server, now).await?;
            tx.commit().await.map_err(database_error)
        })
    }

    fn mcp_server<'a>(
        &'a self,
        tenant_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<McpServerRow>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let row = sqlx::query(
                "SELECT server_id, transport, endpoint, auth_scheme, auth_name, credential_ref, token_endpoint, \
                 token_scopes, side_effect, risk, idempotency, required_scopes, timeout_seconds, \
                 maximum_output_bytes, enabled FROM mcp_servers WHERE tenant_id = $1 AND server_id = $2",
            )
            .bind(tenant_id)
            .bind(server_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            row.map(|row| server_row(&row)).transpose()
        })
    }

    fn delete_mcp_server<'a>(
        &'a self,
        tenant_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
            let deleted =
                sqlx::query("DELETE FROM mcp_servers WHERE tenant_id = $1 AND server_id = $2")
                    .bind(tenant_id)
                    .bind(server_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(database_error)?
                    .rows_affected();
            tx.commit().await.map_err(database_error)?;
            Ok(deleted == 1)
        })
    }

    fn review_queue<'a>(
        &'a self,
        tenant_id: &'a str,
        limit: i64,
    ) -> BoxFuture<'a, Result<Vec<InvocationRecord>, StoreError>> {
        Box::pin(async move {
            let rows = sqlx::query(concat!(
                "SELECT ",
                invocation_columns!(),
                " FROM tool_invocations WHERE tenant_id = $1 AND outcome_status = 'uncertain' \
                 AND NOT EXISTS (SELECT 1 FROM review_resolutions r \
                 WHERE r.tenant_id = tool_invocations.tenant_id AND r.invocation_id = tool_invocations.id) \
                 ORDER BY completed_at, id LIMIT $2"
            ))
            .bind(tenant_id)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(database_error)?;
            rows.iter().map(invocation).collect()
        })
    }

    fn resolve_review<'a>(
        &'a self,
        tenant_id: &'a str,
        review: &'a ReviewRecord,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let written = sqlx::query(
                "INSERT INTO review_resolutions (id, tenant_id, invocation_id, resolution, resolver, note, resolved_at) \
                 SELECT $1, $2, $3, $4, $5, $6, $7 WHERE EXISTS (SELECT 1 FROM tool_invocations \
                 WHERE tenant_id = $2 AND id = $3 AND outcome_status = 'uncertain') \
                 ON CONFLICT (invocation_id) DO NOTHING",
            )
            .bind(Uuid::new_v4().to_string())
            .bind(tenant_id)
            .bind(review.invocation_id.to_string())
            .bind(review.resolution.as_str())
            .bind(&review.resolver)
            .bind(&review.note)
            .bind(micros(review.resolved_at))
            .execute(&self.pool)
            .await
            .map_err(database_error)?
            .rows_affected();
            Ok(written == 1)
        })
    }

    fn catalog_history<'a>(
        &'a self,
        tenant_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<CatalogRow>, StoreError>> {
        Box::pin(async move {
            let rows = sqlx::query(
                "SELECT catalog_hash, remote_name, registry_name, input_schema, discovered_at, withdrawn_at \
                 FROM mcp_tool_catalog WHERE tenant_id = $1 AND server_id = $2 ORDER BY discovered_at, remote_name",
            )
            .bind(tenant_id)
            .bind(server_id)
            .fetch_all(&self.pool)
            .await
            .map_err(database_error)?;
            rows.iter()
                .map(|row| {
                    Ok(CatalogRow {
                        catalog_hash: get(row, "catalog_hash")?,
                        entry: CatalogEntry {
                            remote_name: get(row, "remote_name")?,
                            registry_name: get(row, "registry_name")?,
                            input_schema: json(row, "input_schema")?,
                        },
                        discovered_at: time(row, "discovered_at")?,
                        withdrawn_at: optional_time(row, "withdrawn_at")?,
                    })
                })
                .collect()
        })
    }

    fn events_after(
        &self,
        after: i64,
        limit: i64,
    ) -> BoxFuture<'_, Result<Vec<EventRecord>, StoreError>> {
        Box::pin(async move {
            let rows = sqlx::query(
                "SELECT id, tenant_id, event_type, payload, created_at FROM events \
                 WHERE id > $1 ORDER BY id LIMIT $2",
            )
            .bind(after)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(database_error)?;
            rows.iter()
                .map(|row| {
                    Ok(EventRecord {
                        id: get(row, "id")?,
                        tenant_id: get(row, "tenant_id")?,
                        event_type: get(row, "event_type")?,
                        payload: get(row, "payload")?,
                        created_at: time(row, "created_at")?,
                    })
                })
                .collect()
        })
    }
}

/// The terminal columns of an UPDATE, fenced when `fence` is given.
async fn terminal_update(
    tx: &mut Transaction<'static, Sqlite>,
    sql: &'static str,
    id: Uuid,
    tenant_id: &str,
    terminal: &TerminalRecord,
    now: DateTime<Utc>,
    fence: Option<Fence>,
) -> Result<bool, StoreError> {
    let mut query = sqlx::query(sql)
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
    if let Some(fence) = fence {
        query = query
            .bind(fence.worker_id.to_string())
            .bind(fence.lease_epoch);
    }
    let result = query.execute(&mut **tx).await.map_err(database_error)?;
    Ok(result.rows_affected() == 1)
}

/// Writes one catalog generation unless its hash is already written for the
/// server; earlier names it lacks get `withdrawn_at`. Nothing is updated in
/// place otherwise.
async fn write_generation(
    tx: &mut Transaction<'static, Sqlite>,
    tenant_id: &str,
    generation: &CatalogGeneration,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let written: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM mcp_tool_catalog WHERE tenant_id = $1 AND server_id = $2 AND catalog_hash = $3 LIMIT 1",
    )
    .bind(tenant_id)
    .bind(&generation.server_id)
    .bind(&generation.catalog_hash)
    .fetch_optional(&mut **tx)
    .await
    .map_err(database_error)?;
    if written.is_some() {
        return Ok(false);
    }
    for entry in &generation.entries {
        sqlx::query(
            "INSERT INTO mcp_tool_catalog (id, tenant_id, server_id, catalog_hash, remote_name, registry_name, \
             input_schema, discovered_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(Uuid::new_v4().to_string())
        .bind(tenant_id)
        .bind(&generation.server_id)
        .bind(&generation.catalog_hash)
        .bind(&entry.remote_name)
        .bind(&entry.registry_name)
        .bind(text(&entry.input_schema))
        .bind(micros(now))
        .execute(&mut **tx)
        .await
        .map_err(database_error)?;
    }
    // Names an earlier generation had and this one lacks are withdrawn.
    let current: Vec<&str> = generation
        .entries
        .iter()
        .map(|entry| entry.remote_name.as_str())
        .collect();
    let earlier: Vec<(String, String)> = sqlx::query_as(
        "SELECT id, remote_name FROM mcp_tool_catalog \
         WHERE tenant_id = $1 AND server_id = $2 AND catalog_hash <> $3 AND withdrawn_at IS NULL",
    )
    .bind(tenant_id)
    .bind(&generation.server_id)
    .bind(&generation.catalog_hash)
    .fetch_all(&mut **tx)
    .await
    .map_err(database_error)?;
    for (id, remote_name) in earlier {
        if !current.contains(&remote_name.as_str()) {
            sqlx::query("UPDATE mcp_tool_catalog SET withdrawn_at = $1 WHERE id = $2")
                .bind(micros(now))
                .bind(id)
                .execute(&mut **tx)
                .await
                .map_err(database_error)?;
        }
    }
    Ok(true)
}

async fn insert_platform_event(
    tx: &mut Transaction<'static, Sqlite>,
    tenant_id: Option<&str>,
    event: &PlatformEvent,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO events (tenant_id, event_type, payload, created_at) VALUES ($1, $2, $3, $4)",
    )
    .bind(tenant_id)
    .bind(event.event_type())
    .bind(text(&event.payload()))
    .bind(micros(now))
    .execute(&mut **tx)
    .await
    .map_err(database_error)?;
    Ok(())
}

/// Inserts or replaces a server row, by (tenant, server id).
async fn upsert_server(
    tx: &mut Transaction<'static, Sqlite>,
    tenant_id: &str,
    server: &McpServerRow,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO mcp_servers (id, tenant_id, server_id, transport, endpoint, auth_scheme, auth_name, \
         credential_ref, token_endpoint, token_scopes, side_effect, risk, idempotency, required_scopes, \
         timeout_seconds, maximum_output_bytes, enabled, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18) \
         ON CONFLICT (tenant_id, server_id) DO UPDATE SET transport = excluded.transport, \
         endpoint = excluded.endpoint, auth_scheme = excluded.auth_scheme, auth_name = excluded.auth_name, \
         credential_ref = excluded.credential_ref, token_endpoint = excluded.token_endpoint, \
         token_scopes = excluded.token_scopes, side_effect = excluded.side_effect, risk = excluded.risk, \
         idempotency = excluded.idempotency, required_scopes = excluded.required_scopes, \
         timeout_seconds = excluded.timeout_seconds, maximum_output_bytes = excluded.maximum_output_bytes, \
         enabled = excluded.enabled",
    )
    .bind(Uuid::new_v4().to_string())
    .bind(tenant_id)
    .bind(&server.server_id)
    .bind(server.transport.as_str())
    .bind(&server.endpoint)
    .bind(server.auth_scheme.as_str())
    .bind(&server.auth_name)
    .bind(&server.credential_ref)
    .bind(&server.token_endpoint)
    .bind(
        server
            .token_scopes
            .as_ref()
            .map(|scopes| text(&serde_json::json!(scopes))),
    )
    .bind(server.side_effect.as_str())
    .bind(server.risk.as_str())
    .bind(server.idempotency.as_str())
    .bind(text(&serde_json::json!(server.required_scopes)))
    .bind(i64::from(server.timeout_seconds))
    .bind(i64::try_from(server.maximum_output_bytes).unwrap_or(i64::MAX))
    .bind(server.enabled)
    .bind(micros(now))
    .execute(&mut **tx)
    .await
    .map_err(database_error)?;
    Ok(())
}

fn server_row(row: &SqliteRow) -> Result<McpServerRow, StoreError> {
    let text =
        |name: &str| -> Result<String, StoreError> { row.try_get(name).map_err(database_error) };
    let scopes = |value: Option<String>| -> Vec<String> {
        value
            .and_then(|value| serde_json::from_str(&value).ok())
            .unwrap_or_default()
    };
    Ok(McpServerRow {
        server_id: text("server_id")?,
        transport: parse(&text("transport")?, "transport")?,
        endpoint: text("endpoint")?,
        auth_scheme: parse(&text("auth_scheme")?, "auth_scheme")?,
        auth_name: row.try_get("auth_name").map_err(database_error)?,
        credential_ref: row.try_get("credential_ref").map_err(database_error)?,
        token_endpoint: row.try_get("token_endpoint").map_err(database_error)?,
        token_scopes: row
            .try_get::<Option<String>, _>("token_scopes")
            .map_err(database_error)?
            .map(|value| scopes(Some(value))),
        side_effect: parse(&text("side_effect")?, "side_effect")?,
        risk: parse(&text("risk")?, "risk")?,
        idempotency: parse(&text("idempotency")?, "idempotency")?,
        required_scopes: scopes(row.try_get("required_scopes").map_err(database_error)?),
        timeout_seconds: u32::try_from(
            row.try_get::<i64, _>("timeout_seconds")
                .map_err(database_error)?,
        )
        .unwrap_or_default(),
        maximum_output_bytes: u64::try_from(
            row.try_get::<i64, _>("maximum_output_bytes")
                .map_err(database_error)?,
        )
        .unwrap_or_default(),
        enabled: row.try_get("enabled").map_err(database_error)?,
    })
}
