//! The store on embedded SQLite: the single-node default. Writes take the
//! database lock at `BEGIN IMMEDIATE`, so there is one writer at a time and
//! event ids are assigned in commit order. UUIDs and JSON are TEXT and
//! timestamps INTEGER microseconds, converted here.

use super::rows::{held, invocation};
use chrono::{DateTime, Utc};
use std::str::FromStr;
use std::time::Duration;

use std::sync::Arc;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteRow, SqliteSynchronous};
use sqlx::{Row, Sqlite};
use uuid::Uuid;

use connections::{Connections, Held, Tx};

use super::{SQLITE_MIGRATIONS, database_error, event_body, parse, parse_optional, plan};
use crate::domain::{ApprovalStatus, Durability, ReasonCode};
use crate::ports::{
    ApprovalRecord, ApprovalStore, ArtifactRecord, BoxFuture, BreakerTally, CatalogEntry,
    CatalogGeneration, CatalogRow, CatalogStore, Claim, EventRecord, EventStore, Fence,
    Held as HeldRow, InsertOutcome, InvocationRecord, InvocationStore, McpServerRow, NewInvocation,
    PlatformEvent, PreparationRecord, QueueDepths, Registration, Renewal, ReviewRecord,
    ReviewStore, Schema, SessionRecord, SessionStore, StoreError, StoredArtifact, TerminalRecord,
    ToolEvent, WorkerLease, WorkerRegistration, WorkerStore,
};

/// Readers run beside the one writer (WAL).
const READERS: usize = 8;

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
    /// Readers (WAL lets them run beside the writer), and migrations.
    readers: Arc<Connections>,
    /// The one connection flushed writes go through (`synchronous = FULL`).
    /// Writes are serialized by the database lock anyway; going through one
    /// connection keeps its page cache, which a write from any other
    /// connection would throw away.
    writer: Arc<Connections>,
    /// The one connection relaxed writes go through (`synchronous =
    /// NORMAL`): the commits of reads ([`Durability`]).
    relaxed: Arc<Connections>,
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
        let readers = Connections::open(&options, READERS).await?;
        // An in-memory database is one connection's own: every write goes
        // through the one set.
        if url.contains(":memory:") || url.contains("mode=memory") {
            return Ok(SqliteStore {
                writer: readers.clone(),
                relaxed: readers.clone(),
                readers,
            });
        }
        let writer = Connections::open(&options, 1).await?;
        // WAL is the file's mode, set by the first connection: in NORMAL a
        // commit reaches the log at once and the disk at the next flushed
        // commit or checkpoint.
        let relaxed = Connections::open(&options.synchronous(SqliteSynchronous::Normal), 1).await?;
        Ok(SqliteStore {
            readers,
            writer,
            relaxed,
        })
    }

    /// Closes the store's connections and waits until they have ended. A
    /// store merely dropped closes them on their own threads a little later,
    /// and the last one to close checkpoints the log and removes its file:
    /// what a process about to replace the database's files must not race.
    /// Connections a clone still holds stay open.
    pub async fn close(self) {
        for set in [self.readers, self.writer, self.relaxed] {
            if let Ok(set) = Arc::try_unwrap(set) {
                set.close().await;
            }
        }
    }

    /// A write transaction holding the database lock from its first statement,
    /// so it never fails halfway on a lock upgrade.
    async fn begin(&self) -> Result<Tx, StoreError> {
        self.begin_as(Durability::Flushed).await
    }

    /// A read-only transaction on a reader: one snapshot (WAL) for its
    /// statements, without the database lock or the writer connection.
    async fn read(&self) -> Result<Tx, StoreError> {
        self.readers.begin("BEGIN").await
    }

    /// A reader for one statement, which is its own snapshot.
    async fn reader(&self) -> Result<Held, StoreError> {
        self.readers.acquire().await
    }

    /// The writer connection that commits as durably as `durability` says.
    fn writer_for(&self, durability: Durability) -> &Connections {
        match durability {
            Durability::Flushed => &self.writer,
            Durability::Relaxed => &self.relaxed,
        }
    }

    /// A script on the writer that `durability` names
    /// ([`Connections::script`]).
    async fn script_as(
        &self,
        durability: Durability,
        script: sqlx::query::Query<'_, Sqlite, sqlx::sqlite::SqliteArguments>,
    ) -> Result<Vec<SqliteRow>, StoreError> {
        self.writer_for(durability).script(script).await
    }

    /// [`Self::begin`], committing as durably as `durability` says.
    async fn begin_as(&self, durability: Durability) -> Result<Tx, StoreError> {
        self.writer_for(durability).begin("BEGIN IMMEDIATE").await
    }

    /// Applies the pending migrations in one transaction on `held`, whose
    /// foreign keys are off, checking them before the commit.
    async fn migrate_on(&self, held: Held) -> Result<Vec<i64>, StoreError> {
        let mut tx = held.begin("BEGIN IMMEDIATE").await?;
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
            sqlx::query(
                "INSERT INTO toolgate_migrations (version, description, checksum) VALUES ($1, $2, $3)",
            )
            .bind(migration.version)
            .bind(migration.description)
            .bind(migration.checksum())
            .execute(&mut *tx)
            .await
            .map_err(database_error)?;
        }
        let broken = sqlx::query("PRAGMA foreign_key_check")
            .fetch_all(&mut *tx)
            .await
            .map_err(database_error)?;
        if !broken.is_empty() {
            return Err(StoreError::Migration {
                version: pending.last().map_or(0, |m| m.version),
                reason: format!("{} row(s) would break a foreign key", broken.len()),
            });
        }
        tx.commit().await.map_err(database_error)?;
        Ok(pending.iter().map(|m| m.version).collect())
    }

    async fn applied(&self) -> Result<Vec<(i64, String)>, StoreError> {
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS toolgate_migrations (\
                version BIGINT PRIMARY KEY, description TEXT NOT NULL, \
                checksum TEXT NOT NULL, applied_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)",
        )
        .execute(&mut *self.writer.acquire().await?)
        .await
        .map_err(database_error)?;
        let rows =
            sqlx::query("SELECT version, checksum FROM toolgate_migrations ORDER BY version")
                .fetch_all(&mut *self.reader().await?)
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

impl super::rows::Columns for SqliteRow {
    fn text(&self, column: &str) -> Result<String, StoreError> {
        get(self, column)
    }

    fn optional_text(&self, column: &str) -> Result<Option<String>, StoreError> {
        get(self, column)
    }

    fn integer(&self, column: &str) -> Result<i64, StoreError> {
        get(self, column)
    }

    fn optional_integer(&self, column: &str) -> Result<Option<i64>, StoreError> {
        get(self, column)
    }

    fn flag(&self, column: &str) -> Result<bool, StoreError> {
        get(self, column)
    }

    fn uuid(&self, column: &str) -> Result<Uuid, StoreError> {
        uuid(self, column)
    }

    fn optional_uuid(&self, column: &str) -> Result<Option<Uuid>, StoreError> {
        optional_uuid(self, column)
    }

    fn time(&self, column: &str) -> Result<DateTime<Utc>, StoreError> {
        time(self, column)
    }

    fn optional_time(&self, column: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
        optional_time(self, column)
    }

    fn json(&self, column: &str) -> Result<serde_json::Value, StoreError> {
        json(self, column)
    }

    fn optional_json(&self, column: &str) -> Result<Option<serde_json::Value>, StoreError> {
        optional_json(self, column)
    }
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

/// A commit's events as one JSON array of `[kind, payload]`, which one
/// statement inserts in order (each statement is a round trip to the
/// connection's thread).
fn events_json(events: &[ToolEvent]) -> Result<String, StoreError> {
    let rows = events
        .iter()
        .map(|event| {
            Ok(serde_json::json!([
                event.kind.as_str(),
                text(&event_body(event)?)
            ]))
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok(text(&serde_json::Value::Array(rows)))
}

/// Inserts the events of [`events_json`]'s `$N` parameter, the tenant's
/// `$T` and the time's `$C`, when `condition` holds.
macro_rules! insert_events {
    ($events:literal, $tenant:literal, $created:literal, $condition:literal) => {
        concat!(
            "INSERT INTO events (tenant_id, event_type, payload, created_at) SELECT ",
            $tenant,
            ", json_extract(value, '$[0]'), json_extract(value, '$[1]'), ",
            $created,
            " FROM json_each(",
            $events,
            ") WHERE ",
            $condition,
            " ORDER BY CAST(key AS INTEGER)"
        )
    };
}

async fn append_events(
    tx: &mut Tx,
    tenant_id: &str,
    events: &[ToolEvent],
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    if events.is_empty() {
        return Ok(());
    }
    sqlx::query(insert_events!("$2", "$1", "$3", "1"))
        .bind(tenant_id)
        .bind(events_json(events)?)
        .bind(micros(now))
        .execute(&mut **tx)
        .await
        .map_err(database_error)?;
    Ok(())
}

mod approvals;
mod catalog;
mod connections;
mod events;
mod invocations;
mod reviews;
mod sessions;
mod workers;

impl Schema for SqliteStore {
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
            // A migration may rebuild a table others reference, which SQLite
            // does with its foreign keys off (they cannot be turned off
            // inside a transaction); they are checked before the commit and
            // on again after it, on the same connection.
            let mut held = self.writer.acquire().await?;
            sqlx::raw_sql("PRAGMA foreign_keys = OFF")
                .execute(&mut *held)
                .await
                .map_err(database_error)?;
            let migrated = self.migrate_on(held).await;
            // On again whatever happened: the writer's next user expects it.
            sqlx::raw_sql("PRAGMA foreign_keys = ON")
                .execute(&mut *self.writer.acquire().await?)
                .await
                .map_err(database_error)?;
            migrated
        })
    }

    fn row_security_bypassed(&self) -> BoxFuture<'_, Result<bool, StoreError>> {
        // One node, one file: no row-level security to bypass.
        Box::pin(async { Ok(false) })
    }
}

async fn insert_platform_event(
    tx: &mut Tx,
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
