//! The store on PostgreSQL: shared by every node; `UNIQUE(idempotency_key)`,
//! fenced writes and `FOR UPDATE SKIP LOCKED` make several sidecars on one
//! database safe. Each transaction sets the tenant (or the system scope) that
//! row-level security checks.

use super::invocations::Events;
use super::rows::{catalog_row, server_row};
use chrono::{DateTime, Utc};
use std::str::FromStr;
use std::sync::Arc;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{PgPool, Postgres, Row};
use uuid::Uuid;

use super::{POSTGRES_MIGRATIONS, database_error, plan};
use crate::ports::{
    BoxFuture, CatalogGeneration, CatalogRow, CatalogStore, McpServerRow, PreparationRecord,
    Registration, Renewal, Schema, StoreError, WorkerLease, WorkerRegistration, WorkerStore,
};
use connections::{
    DEFAULT_CONNECTIONS, HotConnections, Scoped, Split, TenantShares, pooled_per_transaction, reach,
};

/// Serializes concurrent `toolgate migrate` runs across nodes.
const MIGRATION_LOCK: i64 = 0x746f_6f6c_6761_7465;

/// Whether an error says the connection failed rather than the statement:
/// what a server restart does to every connection it had.
fn connection_lost(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => true,
        // Class 08 (connection exception) and 57P01-57P03 (shut down).
        sqlx::Error::Database(database) => database.code().is_some_and(|code| {
            code.starts_with("08") || matches!(&*code, "57P01" | "57P02" | "57P03")
        }),
        _ => false,
    }
}

/// Whose rows a transaction may see.
enum Scope<'a> {
    Tenant(&'a str),
    System,
}

/// The PostgreSQL store.
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    hot: Arc<HotConnections>,
    lease: Arc<HotConnections>,
    /// Each tenant's share of the pool, as the hot set keeps its own.
    pooled: Arc<TenantShares>,
    /// Statements are prepared unnamed, each within a transaction: the
    /// server sits behind a pooler per transaction.
    unnamed: bool,
}

/// How a node connects to PostgreSQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PostgresSettings {
    /// The connections it holds at most (at least three).
    pub connections: u32,
    /// Whether the server sits behind a pooler that shares its connections
    /// between clients per transaction (PgBouncer's `pool_mode =
    /// transaction`).
    pub transaction_pooling: bool,
}

impl Default for PostgresSettings {
    fn default() -> Self {
        PostgresSettings {
            connections: DEFAULT_CONNECTIONS,
            transaction_pooling: false,
        }
    }
}

impl PostgresStore {
    /// Connects with the default settings; does not migrate.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        PostgresStore::connect_with(url, PostgresSettings::default()).await
    }

    /// Connects as `settings` say; does not migrate. A server found shared
    /// per transaction that the settings do not declare is refused: its
    /// prepared statements would go astray.
    pub async fn connect_with(url: &str, settings: PostgresSettings) -> Result<Self, StoreError> {
        let split = Split::of(settings.connections);
        let unnamed = settings.transaction_pooling;
        // sqlx's one startup parameter a pooler refuses unless told to
        // ignore it; the server's default serves toolgate as well (its
        // values travel in binary).
        let options = PgConnectOptions::from_str(url)
            .map_err(database_error)?
            .extra_float_digits(None);
        let first = reach(&options).await?;
        if !unnamed && pooled_per_transaction(&options, first).await? {
            return Err(StoreError::Unsupported(
                "the store's connections are shared between clients per transaction (PgBouncer's \
                 pool_mode = transaction, or another such pooler): set store.transaction_pooling = \
                 true, or pool per session"
                    .into(),
            ));
        }
        let pool = PgPoolOptions::new()
            .max_connections(split.pooled)
            // No ping before each use: it would add a round trip to every
            // commit, and a broken connection fails its query cleanly anyway.
            .test_before_acquire(false)
            .connect_with(options.clone())
            .await
            .map_err(database_error)?;
        Ok(PostgresStore {
            pool,
            hot: Arc::new(HotConnections::new(
                options.clone(),
                split.hot as usize,
                unnamed,
            )),
            lease: Arc::new(HotConnections::new(options, 1, unnamed)),
            pooled: Arc::new(TenantShares::of(split.pooled as usize)),
            unnamed,
        })
    }

    /// Opens a transaction scoped for row-level security. The scope is a
    /// bound parameter, never text spliced into SQL. A pooled connection the
    /// server ended (a restart ends them all) fails here, before anything
    /// of the caller's ran, and is dropped; another is tried.
    async fn begin(&self, scope: Scope<'_>) -> Result<Scoped, StoreError> {
        let (tenant, system) = match scope {
            Scope::Tenant(tenant) => (tenant, ""),
            Scope::System => ("", "system"),
        };
        // A tenant waits for its share before it waits for a connection.
        let share = match scope {
            Scope::Tenant(tenant) => Some(self.pooled.take(tenant).await?),
            Scope::System => None,
        };
        let mut attempt = 0;
        loop {
            let begun = async {
                let mut tx = Scoped::new(self.pool.begin().await?, self.unnamed);
                sqlx::query(
                    "SELECT set_config('toolgate.tenant_id', $1, true), set_config('toolgate.scope', $2, true)",
                )
                .bind(tenant)
                .bind(system)
                .execute(tx.statements())
                .await?;
                Ok::<_, sqlx::Error>(tx)
            }
            .await;
            match begun {
                Ok(tx) => return Ok(tx.within(share)),
                Err(error)
                    if connection_lost(&error)
                        && attempt < self.pool.options().get_max_connections() =>
                {
                    attempt += 1;
                }
                Err(error) => return Err(database_error(error)),
            }
        }
    }

    async fn applied(&self) -> Result<Vec<(i64, String)>, StoreError> {
        let mut tx = self.begin(Scope::System).await?;
        // Created only when missing: a role that may only use the tables
        // (as `serve` should run) can still read what is applied.
        let exists: bool =
            sqlx::query_scalar("SELECT to_regclass('toolgate_migrations') IS NOT NULL")
                .fetch_one(tx.statements())
                .await
                .map_err(database_error)?;
        if !exists {
            sqlx::raw_sql(
                "CREATE TABLE IF NOT EXISTS toolgate_migrations (\
                    version BIGINT PRIMARY KEY, description TEXT NOT NULL, \
                    checksum TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
            )
            .execute(tx.statements())
            .await
            .map_err(database_error)?;
        }
        let rows =
            sqlx::query("SELECT version, checksum FROM toolgate_migrations ORDER BY version")
                .fetch_all(tx.statements())
                .await
                .map_err(database_error)?;
        tx.commit().await.map_err(database_error)?;
        rows.iter()
            .map(|row| Ok((get(row, "version")?, get(row, "checksum")?)))
            .collect()
    }
}

fn get<'r, T>(row: &'r PgRow, column: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
{
    row.try_get(column)
        .map_err(|error| StoreError::Decode(format!("{column}: {error}")))
}

impl super::rows::Columns for PgRow {
    fn text(&self, column: &str) -> Result<String, StoreError> {
        get(self, column)
    }

    fn optional_text(&self, column: &str) -> Result<Option<String>, StoreError> {
        get(self, column)
    }

    fn integer(&self, column: &str) -> Result<i64, StoreError> {
        // INTEGER columns (the attempt number) read as 32 bits.
        get::<i64>(self, column).or_else(|_| get::<i32>(self, column).map(i64::from))
    }

    fn optional_integer(&self, column: &str) -> Result<Option<i64>, StoreError> {
        get::<Option<i64>>(self, column)
            .or_else(|_| get::<Option<i32>>(self, column).map(|value| value.map(i64::from)))
    }

    fn optional_float(&self, column: &str) -> Result<Option<f64>, StoreError> {
        get(self, column)
    }

    fn flag(&self, column: &str) -> Result<bool, StoreError> {
        get(self, column)
    }

    fn uuid(&self, column: &str) -> Result<Uuid, StoreError> {
        get(self, column)
    }

    fn optional_uuid(&self, column: &str) -> Result<Option<Uuid>, StoreError> {
        get(self, column)
    }

    fn time(&self, column: &str) -> Result<DateTime<Utc>, StoreError> {
        get(self, column)
    }

    fn optional_time(&self, column: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
        get(self, column)
    }

    fn json(&self, column: &str) -> Result<serde_json::Value, StoreError> {
        get(self, column)
    }

    fn optional_json(&self, column: &str) -> Result<Option<serde_json::Value>, StoreError> {
        get(self, column)
    }
}

/// Appends a commit's events, given as their kinds and bodies, in order:
/// one round trip for all of them.
async fn append_events(
    tx: &mut Scoped,
    tenant_id: Option<&str>,
    events: &Events,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    if events.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO events (tenant_id, event_type, payload, created_at) \
         SELECT $1, kind, COALESCE(body, $3[cardinality($3)]), $4 \
         FROM UNNEST($2::text[], $3::jsonb[]) AS e(kind, body)",
    )
    .bind(tenant_id)
    .bind(&events.kinds)
    .bind(&events.bodies)
    .bind(now)
    .execute(tx.statements())
    .await
    .map_err(database_error)?;
    Ok(())
}

mod catalog;
mod connections;
mod invocations;
mod workers;

impl Schema for PostgresStore {
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
            let mut tx = self.begin(Scope::System).await?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(MIGRATION_LOCK)
                .execute(tx.statements())
                .await
                .map_err(database_error)?;
            // Read again under the lock: another node may have just migrated.
            let rows =
                sqlx::query("SELECT version, checksum FROM toolgate_migrations ORDER BY version")
                    .fetch_all(tx.statements())
                    .await
                    .map_err(database_error)?;
            let applied = rows
                .iter()
                .map(|row| Ok((get(row, "version")?, get(row, "checksum")?)))
                .collect::<Result<Vec<(i64, String)>, StoreError>>()?;
            let pending = plan(POSTGRES_MIGRATIONS, &applied)?;
            for migration in &pending {
                sqlx::raw_sql(migration.sql)
                    .execute(tx.statements())
                    .await
                    .map_err(|error| StoreError::Migration {
                        version: migration.version,
                        reason: database_error(error).to_string(),
                    })?;
                sqlx::query("INSERT INTO toolgate_migrations (version, description, checksum) VALUES ($1, $2, $3)")
                    .bind(migration.version)
                    .bind(migration.description)
                    .bind(migration.checksum())
                    .execute(tx.statements())
                    .await
                    .map_err(database_error)?;
            }
            tx.commit().await.map_err(database_error)?;
            Ok(pending.iter().map(|m| m.version).collect())
        })
    }

    fn row_security_bypassed(&self) -> BoxFuture<'_, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::System).await?;
            let bypassed = sqlx::query_scalar(
                "SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user",
            )
            .fetch_one(tx.statements())
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            Ok(bypassed)
        })
    }
}
