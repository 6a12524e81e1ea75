//! The store on PostgreSQL: shared by every node; `UNIQUE(idempotency_key)`,
//! fenced writes and `FOR UPDATE SKIP LOCKED` make several sidecars on one
//! database safe. Each transaction sets the tenant (or the system scope) that
//! row-level security checks.

use chrono::{DateTime, Utc};
use std::str::FromStr;
use std::sync::Arc;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{PgConnection, PgPool, Postgres, Row, Transaction};
use uuid::Uuid;

use super::{POSTGRES_MIGRATIONS, database_error, event_body, parse, parse_optional, plan};
use crate::domain::{ApprovalStatus, ReasonCode};
use crate::ports::{
    ApprovalRecord, BoxFuture, BreakerTally, CatalogEntry, CatalogGeneration, CatalogRow, Claim,
    EventRecord, Fence, InsertOutcome, InvocationRecord, McpServerRow, NewInvocation,
    PlatformEvent, PreparationRecord, ReviewRecord, SessionRecord, Store, StoreError,
    StoredArtifact, TerminalRecord, ToolEvent, WorkerLease,
};

/// Hot-path connections per node: the pipeline's commits are one short
/// statement each, so a few suffice.
const MAXIMUM_CONNECTIONS: u32 = 16;
/// Pooled connections per node for everything else (migrations, reads,
/// approvals, recovery sweeps).
const MAXIMUM_POOLED_CONNECTIONS: u32 = 8;

/// Serializes concurrent `toolgate migrate` runs across nodes.
const MIGRATION_LOCK: i64 = 0x746f_6f6c_6761_7465;

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

macro_rules! session_columns {
    () => {
        "session_id, tenant_id, principal, agent, tool_schema_sha256, tool_contract_sha256, opened_at, \
         last_used_at"
    };
}

/// Whose rows a transaction may see.
enum Scope<'a> {
    Tenant(&'a str),
    System,
}

/// The hot path's connections. sqlx's pool pings every connection it takes
/// back, one more round trip per statement; the pipeline's one-statement
/// commits use this set instead. A connection goes back only when its
/// statement completed (or the server answered it with an error, which
/// leaves the protocol in step); one dropped mid-statement, as a cancelled
/// call drops it, is closed rather than reused in an unknown state.
struct HotConnections {
    options: PgConnectOptions,
    idle: std::sync::Mutex<Vec<PgConnection>>,
    permits: tokio::sync::Semaphore,
}

/// One connection of the set, held for one statement.
struct Lease<'a> {
    set: &'a HotConnections,
    connection: Option<PgConnection>,
    _permit: tokio::sync::SemaphorePermit<'a>,
    reusable: bool,
}

impl HotConnections {
    async fn lease(&self) -> Result<Lease<'_>, StoreError> {
        let permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| StoreError::Unavailable("the connection set is closed".into()))?;
        let idle = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        let connection = match idle {
            Some(connection) => connection,
            None => PgConnection::connect_with(&self.options)
                .await
                .map_err(database_error)?,
        };
        Ok(Lease {
            set: self,
            connection: Some(connection),
            _permit: permit,
            reusable: false,
        })
    }
}

impl Lease<'_> {
    fn connection(&mut self) -> Result<&mut PgConnection, StoreError> {
        self.connection
            .as_mut()
            .ok_or_else(|| StoreError::Unavailable("the connection was already returned".into()))
    }

    /// Marks the connection reusable when the statement ended in a known
    /// protocol state, and passes the result on.
    fn settle<T>(&mut self, result: Result<T, sqlx::Error>) -> Result<T, StoreError> {
        self.reusable = matches!(&result, Ok(_) | Err(sqlx::Error::Database(_)));
        result.map_err(database_error)
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if self.reusable
            && let (Some(connection), Ok(mut idle)) = (self.connection.take(), self.set.idle.lock())
        {
            idle.push(connection);
        }
    }
}

/// The PostgreSQL store.
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    hot: Arc<HotConnections>,
}

impl PostgresStore {
    /// Connects; does not migrate.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(MAXIMUM_POOLED_CONNECTIONS)
            // No ping before each use: it would add a round trip to every
            // commit, and a broken connection fails its query cleanly anyway.
            .test_before_acquire(false)
            .connect(url)
            .await
            .map_err(database_error)?;
        let options = PgConnectOptions::from_str(url).map_err(database_error)?;
        let hot = Arc::new(HotConnections {
            options,
            idle: std::sync::Mutex::new(Vec::new()),
            permits: tokio::sync::Semaphore::new(MAXIMUM_CONNECTIONS as usize),
        });
        Ok(PostgresStore { pool, hot })
    }

    /// Opens a transaction scoped for row-level security. The scope is set
    /// in the same round trip as BEGIN (a simple-protocol batch), since
    /// every commit of the pipeline pays for it.
    async fn begin(&self, scope: Scope<'_>) -> Result<Transaction<'static, Postgres>, StoreError> {
        let (tenant, system) = match scope {
            Scope::Tenant(tenant) => (literal(tenant)?, "''"),
            Scope::System => ("''".to_owned(), "'system'"),
        };
        let begin = format!(
            "BEGIN; SELECT set_config('toolgate.tenant_id', {tenant}, true), set_config('toolgate.scope', {system}, true)"
        );
        self.pool
            .begin_with(sqlx::AssertSqlSafe(begin))
            .await
            .map_err(database_error)
    }

    async fn applied(&self) -> Result<Vec<(i64, String)>, StoreError> {
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS toolgate_migrations (\
                version BIGINT PRIMARY KEY, description TEXT NOT NULL, \
                checksum TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
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

/// A string as a SQL literal. `standard_conforming_strings` (on since
/// PostgreSQL 9.1) makes doubling quotes the whole escape; NUL cannot be sent.
fn literal(text: &str) -> Result<String, StoreError> {
    if text.contains('\0') {
        return Err(StoreError::Query("a tenant id may not contain NUL".into()));
    }
    Ok(format!("'{}'", text.replace('\'', "''")))
}

fn get<'r, T>(row: &'r PgRow, column: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
{
    row.try_get(column)
        .map_err(|error| StoreError::Decode(format!("{column}: {error}")))
}

fn invocation(row: &PgRow) -> Result<InvocationRecord, StoreError> {
    let principal: serde_json::Value = get(row, "principal")?;
    Ok(InvocationRecord {
        id: get(row, "id")?,
        tenant_id: get(row, "tenant_id")?,
        session_id: get(row, "session_id")?,
        run_id: get(row, "run_id")?,
        step_number: get(row, "step_number")?,
        call_id: get(row, "call_id")?,
        tool_name: get(row, "tool_name")?,
        tool_version: get(row, "tool_version")?,
        tool_source: parse(&get::<String>(row, "tool_source")?, "tool_source")?,
        server_id: get(row, "server_id")?,
        arguments: get(row, "arguments")?,
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
        parallel_group: get(row, "parallel_group")?,
        deadline_at: get(row, "deadline_at")?,
        approval_id: get(row, "approval_id")?,
        effect_sent_at: get(row, "effect_sent_at")?,
        attempt_number: get(row, "attempt_number")?,
        worker_id: get(row, "worker_id")?,
        lease_epoch: get(row, "lease_epoch")?,
        suspended_kind: get(row, "suspended_kind")?,
        suspended_ref: get(row, "suspended_ref")?,
        outcome_status: parse_optional(get(row, "outcome_status")?, "outcome_status")?,
        reason_code: parse_optional(get(row, "reason_code")?, "reason_code")?,
        result: get(row, "result")?,
        error: get(row, "error")?,
        output_bytes: get(row, "output_bytes")?,
        truncated: get(row, "truncated")?,
        artifact_id: get(row, "artifact_id")?,
        created_at: get(row, "created_at")?,
        started_at: get(row, "started_at")?,
        completed_at: get(row, "completed_at")?,
    })
}

fn session_row(row: &PgRow) -> Result<SessionRecord, StoreError> {
    let principal: serde_json::Value = get(row, "principal")?;
    let agent: serde_json::Value = get(row, "agent")?;
    Ok(SessionRecord {
        session_id: get(row, "session_id")?,
        tenant_id: get(row, "tenant_id")?,
        principal: serde_json::from_value(principal)
            .map_err(|e| StoreError::Decode(format!("principal: {e}")))?,
        agent: serde_json::from_value(agent)
            .map_err(|e| StoreError::Decode(format!("agent: {e}")))?,
        tool_schema_sha256: get(row, "tool_schema_sha256")?,
        tool_contract_sha256: get(row, "tool_contract_sha256")?,
        opened_at: get(row, "opened_at")?,
        last_used_at: get(row, "last_used_at")?,
    })
}

fn approval(row: &PgRow) -> Result<ApprovalRecord, StoreError> {
    Ok(ApprovalRecord {
        id: get(row, "id")?,
        tenant_id: get(row, "tenant_id")?,
        invocation_id: get(row, "invocation_id")?,
        tool_name: get(row, "tool_name")?,
        reason_code: parse::<ReasonCode>(&get::<String>(row, "reason_code")?, "reason_code")?,
        status: parse::<ApprovalStatus>(&get::<String>(row, "status")?, "status")?,
        approver: get(row, "approver")?,
        requested_at: get(row, "requested_at")?,
        decided_at: get(row, "decided_at")?,
    })
}

/// A commit's events as the two arrays the database functions take.
fn event_arrays(
    events: &[ToolEvent],
) -> Result<(Vec<&'static str>, Vec<serde_json::Value>), StoreError> {
    let kinds = events.iter().map(|event| event.kind.as_str()).collect();
    let bodies = events
        .iter()
        .map(event_body)
        .collect::<Result<Vec<_>, _>>()?;
    Ok((kinds, bodies))
}

async fn append_events(
    tx: &mut Transaction<'static, Postgres>,
    tenant_id: &str,
    events: &[ToolEvent],
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    if events.is_empty() {
        return Ok(());
    }
    // One round trip for all of a commit's events.
    let kinds: Vec<&str> = events.iter().map(|event| event.kind.as_str()).collect();
    let bodies = events
        .iter()
        .map(event_body)
        .collect::<Result<Vec<_>, _>>()?;
    sqlx::query(
        "INSERT INTO events (tenant_id, event_type, payload, created_at) \
         SELECT $1, kind, body, $4 FROM UNNEST($2::text[], $3::jsonb[]) WITH ORDINALITY AS e(kind, body, n) ORDER BY n",
    )
    .bind(tenant_id)
    .bind(kinds)
    .bind(bodies)
    .bind(now)
    .execute(&mut **tx)
    .await
    .map_err(database_error)?;
    Ok(())
}

impl Store for PostgresStore {
    fn pending_migrations(&self) -> BoxFuture<'_, Result<Vec<i64>, StoreError>> {
        Box::pin(async move {
            let applied = self.applied().await?;
            Ok(plan(POSTGRES_MIGRATIONS, &applied)?
                .iter()
                .map(|m| m.version)
                .collect())
        })
    }

    fn migrate(&self) -> BoxFuture<'_, Result<Vec<i64>, StoreError>> {
        Box::pin(async move {
            self.applied().await?;
            let mut tx = self.pool.begin().await.map_err(database_error)?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(MIGRATION_LOCK)
                .execute(&mut *tx)
                .await
                .map_err(database_error)?;
            // Read again under the lock: another node may have just migrated.
            let rows =
                sqlx::query("SELECT version, checksum FROM toolgate_migrations ORDER BY version")
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(database_error)?;
            let applied = rows
                .iter()
                .map(|row| Ok((get(row, "version")?, get(row, "checksum")?)))
                .collect::<Result<Vec<(i64, String)>, StoreError>>()?;
            let pending = plan(POSTGRES_MIGRATIONS, &applied)?;
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
            .bind(lease.worker_id)
            .bind(&lease.node)
            .bind(lease.started_at)
            .bind(lease.lease_expires_at)
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
                "UPDATE workers SET heartbeat_at = now(), lease_expires_at = $2 \
                 WHERE worker_id = $1 AND released_at IS NULL",
            )
            .bind(worker_id)
            .bind(lease_expires_at)
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
            .bind(worker_id)
            .bind(now)
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
            .bind(worker_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(database_error)?;
            row.map(|row| {
                Ok(WorkerLease {
                    worker_id: get(&row, "worker_id")?,
                    node: get(&row, "node")?,
                    started_at: get(&row, "started_at")?,
                    lease_expires_at: get(&row, "lease_expires_at")?,
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
            let mut lease = self.hot.lease().await?;
            let principal = serde_json::to_value(&new.principal)
                .map_err(|e| StoreError::Decode(e.to_string()))?;
            let (kinds, bodies) = event_arrays(events)?;
            let result = sqlx::query(
                "SELECT * FROM toolgate_insert($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, \
                 $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28)",
            )
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
            .bind(new.status.outcome_status(new.reason_code).map(|s| s.as_str()))
            .bind(claim.worker_id)
            .bind(claim.now)
            .bind(new.status.is_terminal().then_some(claim.now))
            .bind(kinds)
            .bind(bodies)
            .fetch_optional(lease.connection()?)
                .await;
            let row = lease.settle(result)?;
            let record = row.as_ref().map(invocation).transpose()?;
            // The function returns the new row, or the one already holding the
            // key. Another tenant's key (invisible under row-level security, or
            // visible to a role that bypasses it) is neither shown nor told.
            match record {
                Some(record) if record.id == new.id => Ok(InsertOutcome::Inserted(record)),
                Some(record) if record.tenant_id == new.tenant_id => {
                    Ok(InsertOutcome::Existing(record))
                }
                _ => Err(StoreError::KeyConflict),
            }
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
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let row = sqlx::query(concat!(
                "UPDATE tool_invocations SET status = 'authorized', worker_id = $2, lease_epoch = lease_epoch + 1 \
                 WHERE id = $1 AND status = 'waiting_for_approval' AND tenant_id = $3 RETURNING ",
                invocation_columns!()
            ))
            .bind(id)
            .bind(claim.worker_id)
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
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
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
            let mut lease = self.hot.lease().await?;
            let (kinds, bodies) = event_arrays(events)?;
            let result = sqlx::query("SELECT * FROM toolgate_claim($1, $2, $3, $4, $5, $6, $7)")
                .bind(tenant_id)
                .bind(id)
                .bind(fence.worker_id)
                .bind(fence.lease_epoch)
                .bind(now)
                .bind(kinds)
                .bind(bodies)
                .fetch_optional(lease.connection()?)
                .await;
            let row = lease.settle(result)?;
            row.as_ref().map(invocation).transpose()
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
            let mut lease = self.hot.lease().await?;
            let result = sqlx::query_scalar("SELECT toolgate_mark_effect_sent($1, $2, $3, $4, $5)")
                .bind(tenant_id)
                .bind(id)
                .bind(fence.worker_id)
                .bind(fence.lease_epoch)
                .bind(now)
                .fetch_one(lease.connection()?)
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
            let mut lease = self.hot.lease().await?;
            let (kinds, bodies) = event_arrays(events)?;
            let artifact = terminal.artifact.as_ref();
            let result = sqlx::query_scalar(
                "SELECT toolgate_complete($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
                 $17, $18)",
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
            .fetch_one(lease.connection()?)
                .await;
            lease.settle(result)
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
            .fetch_optional(&mut *tx)
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            row.as_ref().map(invocation).transpose()
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
            .fetch_all(&mut *tx)
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            rows.iter().map(invocation).collect()
        })
    }

    fn claim_expired(
        &self,
        claim: Claim,
        limit: i64,
    ) -> BoxFuture<'_, Result<Vec<InvocationRecord>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::System).await?;
            let rows = sqlx::query(concat!(
                // The candidates are chosen once (a materialized CTE) and
                // locked with SKIP LOCKED. The lease test names the dead
                // workers positively: when a row another sweeper just took
                // is rechecked against its new version, its new owner is not
                // among them. (A NOT EXISTS over live workers would pass that
                // recheck vacuously and steal the row.)
                "WITH candidates AS MATERIALIZED (\
                    SELECT i.id AS candidate_id FROM tool_invocations i \
                    WHERE i.status IN ('authorized', 'running') AND i.suspended_kind IS NULL \
                      AND i.worker_id IN (SELECT w.worker_id FROM workers w \
                                          WHERE w.released_at IS NOT NULL OR w.lease_expires_at < $2) \
                    ORDER BY i.created_at LIMIT $3 FOR UPDATE SKIP LOCKED) \
                 UPDATE tool_invocations t SET worker_id = $1, lease_epoch = t.lease_epoch + 1, \
                 attempt_number = CASE WHEN t.started_at IS NULL THEN t.attempt_number ELSE t.attempt_number + 1 END \
                 FROM candidates c WHERE t.id = c.candidate_id \
                 RETURNING ",
                invocation_columns!()
            ))
            .bind(claim.worker_id)
            .bind(claim.now)
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
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let row = sqlx::query(concat!(
                "UPDATE tool_invocations SET worker_id = $3, lease_epoch = lease_epoch + 1, \
                 attempt_number = CASE WHEN started_at IS NULL THEN attempt_number ELSE attempt_number + 1 END \
                 WHERE id = $1 AND tenant_id = $2 AND status IN ('authorized', 'running') \
                   AND suspended_kind IS NULL \
                   AND worker_id IN (SELECT w.worker_id FROM workers w \
                                     WHERE w.released_at IS NOT NULL OR w.lease_expires_at < $4) \
                 RETURNING ",
                invocation_columns!()
            ))
            .bind(id)
            .bind(tenant_id)
            .bind(claim.worker_id)
            .bind(claim.now)
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
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let row = sqlx::query(concat!(
                "SELECT ",
                approval_columns!(),
                " FROM approvals WHERE id = $1 AND tenant_id = $2"
            ))
            .bind(id)
            .bind(tenant_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            row.as_ref().map(approval).transpose()
        })
    }

    fn pending_approvals<'a>(
        &'a self,
        tenant_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ApprovalRecord>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let rows = sqlx::query(concat!(
                "SELECT ",
                approval_columns!(),
                " FROM approvals WHERE tenant_id = $1 AND status = 'pending' ORDER BY requested_at, id"
            ))
            .bind(tenant_id)
            .fetch_all(&mut *tx)
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
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
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let row = sqlx::query(concat!(
                "UPDATE approvals SET status = $3, approver = $4, decided_at = $5 \
                 WHERE id = $1 AND tenant_id = $2 AND status = 'pending' RETURNING ",
                approval_columns!()
            ))
            .bind(id)
            .bind(tenant_id)
            .bind(status.as_str())
            .bind(approver)
            .bind(now)
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
            let mut lease = self.hot.lease().await?;
            let result = sqlx::query(
                "SELECT t_status, t_code, t_count, t_base FROM toolgate_tally($1, $2, $3, $4)",
            )
            .bind(tenant_id)
            .bind(run_id)
            .bind(tool_name)
            .bind(arguments_hash)
            .fetch_all(lease.connection()?)
            .await;
            let rows = lease.settle(result)?;
            let mut tally = BreakerTally::default();
            for row in &rows {
                if let Some(base) = get::<Option<i64>>(row, "t_base")? {
                    tally.evidence_base = base;
                    continue;
                }
                tally.counts.push((
                    parse(&get::<String>(row, "t_status")?, "outcome_status")?,
                    parse_optional(get(row, "t_code")?, "reason_code")?,
                    get::<i64>(row, "t_count")?,
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
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let successes: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM tool_invocations WHERE tenant_id = $1 AND run_id = $2 AND tool_name = $3 \
                 AND arguments_hash = $4 AND outcome_status = 'succeeded'",
            )
            .bind(tenant_id)
            .bind(run_id)
            .bind(tool_name)
            .bind(arguments_hash)
            .fetch_one(&mut *tx)
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
                    .bind(run_id)
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
                        .bind(run_id)
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
                    .bind(run_id)
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
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let row = sqlx::query("SELECT id, media_type, bytes, trust FROM artifacts WHERE id = $1 AND tenant_id = $2")
                .bind(id)
                .bind(tenant_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            row.map(|row| {
                Ok(StoredArtifact {
                    id: get(&row, "id")?,
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
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
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
            let scope = match tenant_id {
                Some(tenant) => Scope::Tenant(tenant),
                None => Scope::System,
            };
            let mut tx = self.begin(scope).await?;
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
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            // The lease is released with the row: a suspended call is not a
            // dead worker's, and no sweep may take it.
            let result = sqlx::query(
                "UPDATE tool_invocations SET suspended_kind = $1, suspended_ref = $2, worker_id = $3 \
                 WHERE id = $4 AND tenant_id = $5 AND status = 'running' AND suspended_kind IS NULL \
                 AND worker_id = $6 AND lease_epoch = $7",
            )
            .bind(kind)
            .bind(reference)
            .bind(Option::<Uuid>::None)
            .bind(id)
            .bind(tenant_id)
            .bind(fence.worker_id)
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
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
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
            let principal = serde_json::to_value(&session.principal)
                .map_err(|e| StoreError::Decode(e.to_string()))?;
            let agent = serde_json::to_value(&session.agent)
                .map_err(|e| StoreError::Decode(e.to_string()))?;
            // The system scope: an id another tenant holds must be seen to be
            // refused, not inserted beside it.
            let mut tx = self.begin(Scope::System).await?;
            sqlx::query(
                "INSERT INTO sessions (session_id, tenant_id, principal, agent, tool_schema_sha256, \
                 tool_contract_sha256, opened_at, last_used_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
                 ON CONFLICT (session_id) DO NOTHING",
            )
            .bind(session.session_id)
            .bind(&session.tenant_id)
            .bind(principal)
            .bind(agent)
            .bind(&session.tool_schema_sha256)
            .bind(&session.tool_contract_sha256)
            .bind(session.opened_at)
            .bind(session.last_used_at)
            .execute(&mut *tx)
            .await
            .map_err(database_error)?;
            let row = sqlx::query(concat!(
                "SELECT ",
                session_columns!(),
                " FROM sessions WHERE session_id = $1"
            ))
            .bind(session.session_id)
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
            let mut tx = self.begin(Scope::System).await?;
            let row = sqlx::query(concat!(
                "SELECT ",
                session_columns!(),
                " FROM sessions WHERE session_id = $1"
            ))
            .bind(session_id)
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
            let mut tx = self.begin(Scope::System).await?;
            sqlx::query(
                "UPDATE sessions SET last_used_at = $2 WHERE session_id = $1 AND last_used_at < $2",
            )
            .bind(session_id)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)
        })
    }

    fn forget_sessions(&self, before: DateTime<Utc>) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::System).await?;
            let deleted = sqlx::query("DELETE FROM sessions WHERE last_used_at < $1")
                .bind(before)
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
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
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
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
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
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
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
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
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
            .fetch_all(&mut *tx)
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            rows.iter().map(invocation).collect()
        })
    }

    fn resolve_review<'a>(
        &'a self,
        tenant_id: &'a str,
        review: &'a ReviewRecord,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let written = sqlx::query(
                "INSERT INTO review_resolutions (id, tenant_id, invocation_id, resolution, resolver, note, resolved_at) \
                 SELECT $1, $2, $3, $4, $5, $6, $7 WHERE EXISTS (SELECT 1 FROM tool_invocations \
                 WHERE tenant_id = $2 AND id = $3 AND outcome_status = 'uncertain') \
                 ON CONFLICT (invocation_id) DO NOTHING",
            )
            .bind(Uuid::new_v4())
            .bind(tenant_id)
            .bind(review.invocation_id)
            .bind(review.resolution.as_str())
            .bind(&review.resolver)
            .bind(&review.note)
            .bind(review.resolved_at)
            .execute(&mut *tx)
            .await
            .map_err(database_error)?
            .rows_affected();
            tx.commit().await.map_err(database_error)?;
            Ok(written == 1)
        })
    }

    fn catalog_history<'a>(
        &'a self,
        tenant_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<CatalogRow>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let rows = sqlx::query(
                "SELECT catalog_hash, remote_name, registry_name, input_schema, discovered_at, withdrawn_at \
                 FROM mcp_tool_catalog WHERE tenant_id = $1 AND server_id = $2 ORDER BY discovered_at, remote_name",
            )
            .bind(tenant_id)
            .bind(server_id)
            .fetch_all(&mut *tx)
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            rows.iter()
                .map(|row| {
                    Ok(CatalogRow {
                        catalog_hash: get(row, "catalog_hash")?,
                        entry: CatalogEntry {
                            remote_name: get(row, "remote_name")?,
                            registry_name: get(row, "registry_name")?,
                            input_schema: get(row, "input_schema")?,
                        },
                        discovered_at: get(row, "discovered_at")?,
                        withdrawn_at: get(row, "withdrawn_at")?,
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
            let mut tx = self.begin(Scope::System).await?;
            let rows = sqlx::query(
                "SELECT id, tenant_id, event_type, payload, created_at FROM events \
                 WHERE id > $1 AND txid < pg_snapshot_xmin(pg_current_snapshot()) ORDER BY id LIMIT $2",
            )
            .bind(after)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            rows.iter()
                .map(|row| {
                    Ok(EventRecord {
                        id: get(row, "id")?,
                        tenant_id: get(row, "tenant_id")?,
                        event_type: get(row, "event_type")?,
                        payload: get(row, "payload")?,
                        created_at: get(row, "created_at")?,
                    })
                })
                .collect()
        })
    }
}

/// The terminal columns of an UPDATE, fenced when `fence` is given.
async fn terminal_update(
    tx: &mut Transaction<'static, Postgres>,
    sql: &'static str,
    id: Uuid,
    tenant_id: &str,
    terminal: &TerminalRecord,
    now: DateTime<Utc>,
    fence: Option<Fence>,
) -> Result<bool, StoreError> {
    let mut query = sqlx::query(sql)
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
        .bind(tenant_id.to_owned());
    if let Some(fence) = fence {
        query = query.bind(fence.worker_id).bind(fence.lease_epoch);
    }
    let result = query.execute(&mut **tx).await.map_err(database_error)?;
    Ok(result.rows_affected() == 1)
}

/// Writes one catalog generation unless its hash is already written for the
/// server; earlier names it lacks get `withdrawn_at`. Nothing is updated in
/// place otherwise.
async fn write_generation(
    tx: &mut Transaction<'static, Postgres>,
    tenant_id: &str,
    generation: &CatalogGeneration,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let written: Option<i64> = sqlx::query_scalar(
        "SELECT 1::bigint FROM mcp_tool_catalog WHERE tenant_id = $1 AND server_id = $2 AND catalog_hash = $3 LIMIT 1",
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
        .bind(Uuid::new_v4())
        .bind(tenant_id)
        .bind(&generation.server_id)
        .bind(&generation.catalog_hash)
        .bind(&entry.remote_name)
        .bind(&entry.registry_name)
        .bind(&entry.input_schema)
        .bind(now)
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
        "SELECT CAST(id AS TEXT), remote_name FROM mcp_tool_catalog \
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
            sqlx::query(
                "UPDATE mcp_tool_catalog SET withdrawn_at = $1 WHERE CAST(id AS TEXT) = $2",
            )
            .bind(now)
            .bind(id)
            .execute(&mut **tx)
            .await
            .map_err(database_error)?;
        }
    }
    Ok(true)
}

async fn insert_platform_event(
    tx: &mut Transaction<'static, Postgres>,
    tenant_id: Option<&str>,
    event: &PlatformEvent,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO events (tenant_id, event_type, payload, created_at) VALUES ($1, $2, $3, $4)",
    )
    .bind(tenant_id)
    .bind(event.event_type())
    .bind(event.payload())
    .bind(now)
    .execute(&mut **tx)
    .await
    .map_err(database_error)?;
    Ok(())
}

/// Inserts or replaces a server row, by (tenant, server id).
async fn upsert_server(
    tx: &mut Transaction<'static, Postgres>,
    tenant_id: &str,
    server: &McpServerRow,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO mcp_servers (id, tenant_id, server_id, transport, endpoint, auth_scheme, auth_name, \
         credential_ref, token_endpoint, token_scopes, side_effect, risk, idempotency, required_scopes, \
         timeout_seconds, maximum_output_bytes, enabled, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18) \
         ON CONFLICT (tenant_id, server_id) DO UPDATE SET transport = EXCLUDED.transport, \
         endpoint = EXCLUDED.endpoint, auth_scheme = EXCLUDED.auth_scheme, auth_name = EXCLUDED.auth_name, \
         credential_ref = EXCLUDED.credential_ref, token_endpoint = EXCLUDED.token_endpoint, \
         token_scopes = EXCLUDED.token_scopes, side_effect = EXCLUDED.side_effect, risk = EXCLUDED.risk, \
         idempotency = EXCLUDED.idempotency, required_scopes = EXCLUDED.required_scopes, \
         timeout_seconds = EXCLUDED.timeout_seconds, maximum_output_bytes = EXCLUDED.maximum_output_bytes, \
         enabled = EXCLUDED.enabled",
    )
    .bind(Uuid::new_v4())
    .bind(tenant_id)
    .bind(&server.server_id)
    .bind(server.transport.as_str())
    .bind(&server.endpoint)
    .bind(server.auth_scheme.as_str())
    .bind(&server.auth_name)
    .bind(&server.credential_ref)
    .bind(&server.token_endpoint)
    .bind(server.token_scopes.as_ref().map(|scopes| serde_json::json!(scopes)))
    .bind(server.side_effect.as_str())
    .bind(server.risk.as_str())
    .bind(server.idempotency.as_str())
    .bind(serde_json::json!(server.required_scopes))
    .bind(i32::try_from(server.timeout_seconds).unwrap_or(i32::MAX))
    .bind(i64::try_from(server.maximum_output_bytes).unwrap_or(i64::MAX))
    .bind(server.enabled)
    .bind(now)
    .execute(&mut **tx)
    .await
    .map_err(database_error)?;
    Ok(())
}

fn server_row(row: &PgRow) -> Result<McpServerRow, StoreError> {
    let text =
        |name: &str| -> Result<String, StoreError> { row.try_get(name).map_err(database_error) };
    let scopes = |value: Option<serde_json::Value>| -> Vec<String> {
        value
            .and_then(|value| serde_json::from_value(value).ok())
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
            .try_get::<Option<serde_json::Value>, _>("token_scopes")
            .map_err(database_error)?
            .map(|value| scopes(Some(value))),
        side_effect: parse(&text("side_effect")?, "side_effect")?,
        risk: parse(&text("risk")?, "risk")?,
        idempotency: parse(&text("idempotency")?, "idempotency")?,
        required_scopes: scopes(row.try_get("required_scopes").map_err(database_error)?),
        timeout_seconds: u32::try_from(
            row.try_get::<i32, _>("timeout_seconds")
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
