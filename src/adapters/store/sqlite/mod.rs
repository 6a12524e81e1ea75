//! The store on embedded SQLite (rusqlite, bundled): the single-node
//! default. Commits run where their durability says ([`Durability`]): a
//! relaxed one (a read's two, the watermark of the classes that do not read
//! it) on the calling task, against a connection held under a lock, with
//! `synchronous = NORMAL` — a WAL commit of microseconds, cheaper than
//! handing it to another thread and back; a flushed one on the one writer
//! thread, which commits what is queued together under one fsync
//! ([`writer`]). Reads use connections of their own (WAL lets them run
//! beside the writer). Writes take the database lock at `BEGIN IMMEDIATE`,
//! so there is one writer at a time and event ids are assigned in commit
//! order. UUIDs and JSON are TEXT and timestamps INTEGER microseconds,
//! converted here.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OpenFlags};
use uuid::Uuid;

use db::{Row, get, query, sqlite_error};
use writer::GroupWriter;

use super::invocations::Events;
use super::rows::{catalog_row, server_row};
use super::{SQLITE_MIGRATIONS, plan};
use crate::domain::Durability;
use crate::ports::{
    BoxFuture, CatalogGeneration, CatalogRow, CatalogStore, McpServerRow, PreparationRecord,
    Registration, Renewal, Schema, StoreError, WorkerLease, WorkerRegistration, WorkerStore,
};

/// Reader connections kept open between reads; more are opened while more
/// read at once, and closed after.
const KEPT_READERS: usize = 8;

/// How long a writer waits for the database lock before the store reports
/// busy.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

// After the column macros, which they use.
mod catalog;
mod db;
mod invocations;
mod log;
mod workers;
mod writer;

/// The SQLite store. Clones share its connections; the last one dropped
/// closes them, the writer's after what is queued to it is written.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// The database file.
    path: PathBuf,
    /// The node's clock, which leases are renewed and judged by: one node,
    /// so the node's clock is the store's.
    clock: Arc<dyn crate::ports::Clock>,
    /// The relaxed commits' connection, used on the calling task.
    relaxed: Mutex<Connection>,
    /// Relaxed commits so far, which time their checkpoints.
    relaxed_commits: AtomicU64,
    /// The log has grown past its bound: relaxed commits start it over
    /// until one succeeds.
    restart_due: std::sync::atomic::AtomicBool,
    /// Reader connections not in use.
    readers: Mutex<Vec<Connection>>,
    /// The flushed commits' writer. Declared last: the other connections
    /// close before it, so the writer's is the last one, which checkpoints
    /// the log.
    writer: GroupWriter,
}

/// What a connection is for, which sets how it commits and what it keeps.
#[derive(Debug, Clone, Copy)]
enum Role {
    /// The flushed commits' writer (`synchronous = FULL`: a commit survives
    /// power loss, not only a crash), which also checkpoints the log.
    Writer,
    /// The relaxed commits' connection (`synchronous = NORMAL`: a commit
    /// reaches the log at once and the disk at the next flushed commit or
    /// checkpoint). It leaves checkpoints to the writer (one would put two
    /// fsyncs on the calling task), but for the one that starts the log
    /// over past its bound ([`restart_log`]).
    Relaxed,
    /// A reader, or a migration's own connection.
    Other,
}

/// Pages each writing connection keeps (in KiB, as SQLite's negative
/// `cache_size` counts). Not more: a commit after a page split that
/// reordered the new pages (SQLite moves one through a page number far past
/// the file's end) walks the whole cache to drop pages past the end, and
/// with 32 MiB that walk was 8% of a call's CPU. The pages a call's row
/// goes into are spread over indexes keyed by random ids, which a cache of
/// any size this side of the whole file mostly misses; the operating
/// system's cache serves them.
const WRITER_CACHE_KIB: i64 = 4 << 10;

/// Relaxed commits between the checkpoints they ask the writer for (some
/// five thousand log pages, 20 MiB): a page that every call writes (a
/// table's last) is copied once for all the calls between two checkpoints.
const RELAXED_COMMITS_PER_CHECKPOINT: u64 = 500;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The size the log may reach (64 MiB) before relaxed commits have it
/// started over.
const LOG_BYTES_BOUND: u64 = 64 << 20;

/// The size the log's file is cut back to when the log starts over: the
/// bound itself. The log is written again from its head over the blocks
/// the file keeps, and the file grows past the bound (what the relaxed
/// commits' check looks for) only once the log's own pages do.
const LOG_FILE_LIMIT: u64 = LOG_BYTES_BOUND;

/// Starts the log over at its head. SQLite does that by itself only when a
/// write begins with every page of the log copied, which calls that never
/// pause never give it: the log would grow by every call's pages for as
/// long as they last. This checkpoint waits (the busy timeout) for the
/// writes, reads and checkpoint under way to end and copies the rest; the
/// next commit then writes the log from its head, over the file's blocks
/// (cut back to [`LOG_FILE_LIMIT`]), rather than growing a file truncated
/// to nothing, which made the kernel allocate a block for every page of
/// every commit. Run while the relaxed connection is held, no relaxed
/// commit slips in before it. Whether it did (when a reader or the
/// writer's own checkpoint outlasted the wait, the next relaxed commit
/// tries again).
fn restart_log(connection: &Connection) -> bool {
    match connection.query_row("PRAGMA wal_checkpoint(RESTART)", [], |row| {
        row.get::<_, i64>(0)
    }) {
        Ok(busy) => busy == 0,
        Err(error) => {
            tracing::debug!(error = %error, "the store's log was not started over");
            false
        }
    }
}

/// Whether the log at `database`'s side has grown past [`LOG_BYTES_BOUND`].
fn log_past_bound(database: &Path) -> bool {
    let mut log = database.as_os_str().to_owned();
    log.push("-wal");
    std::fs::metadata(log).is_ok_and(|log| log.len() > LOG_BYTES_BOUND)
}

/// Runs `work`, a read that may take long (an operator's list over a
/// million rows), with the runtime's worker handed to another thread while
/// it does: on the default runtime of one worker (two cores) a read that
/// held it would hold up every call and probe until it ended. A call's own
/// commits stay on the worker; handing it over costs more than they take.
fn off_the_worker<T>(work: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

/// The path a `sqlite://path` (or `sqlite:path`) URL names.
fn database_path(url: &str) -> Result<PathBuf, StoreError> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or_else(|| StoreError::Unavailable("a SQLite URL is sqlite://path".into()))?;
    let path = rest.split('?').next().unwrap_or_default();
    if path.is_empty() || path.contains(":memory:") {
        return Err(StoreError::Unavailable(
            "a SQLite URL names the database file: sqlite://path".into(),
        ));
    }
    Ok(PathBuf::from(path))
}

fn open(path: &Path, role: Role) -> Result<Connection, StoreError> {
    let registered = log::register();
    if registered != rusqlite::ffi::SQLITE_OK {
        return Err(StoreError::Unavailable(format!(
            "the store's log writer could not be registered with SQLite (code {registered})"
        )));
    }
    let connection = Connection::open_with_flags_and_vfs(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        log::NAME,
    )
    .map_err(sqlite_error)?;
    connection
        .busy_timeout(BUSY_TIMEOUT)
        .map_err(sqlite_error)?;
    connection.set_prepared_statement_cache_capacity(db::STATEMENT_CACHE);
    connection
        .execute_batch("PRAGMA journal_mode = WAL; PRAGMA foreign_keys = ON")
        .map_err(sqlite_error)?;
    let settings = match role {
        Role::Writer => format!(
            "PRAGMA synchronous = FULL; PRAGMA cache_size = -{WRITER_CACHE_KIB}; \
             PRAGMA journal_size_limit = {LOG_FILE_LIMIT}"
        ),
        Role::Relaxed => format!(
            "PRAGMA synchronous = NORMAL; PRAGMA cache_size = -{WRITER_CACHE_KIB}; \
             PRAGMA wal_autocheckpoint = 0; PRAGMA journal_size_limit = {LOG_FILE_LIMIT}"
        ),
        Role::Other => "PRAGMA synchronous = FULL".to_owned(),
    };
    connection.execute_batch(&settings).map_err(sqlite_error)?;
    Ok(connection)
}

/// Runs `work` in one transaction begun with `begin` on `connection`:
/// committed when it succeeds, rolled back otherwise. A transaction some
/// earlier holder left open (it panicked) is rolled back first.
fn transaction<T>(
    connection: &Connection,
    begin: &str,
    work: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    if !connection.is_autocommit() {
        let _ = connection.execute_batch("ROLLBACK");
    }
    db::run(connection, begin)?;
    let done = work(connection).and_then(|value| db::run(connection, "COMMIT").map(|()| value));
    if done.is_err() && !connection.is_autocommit() {
        let _ = connection.execute_batch("ROLLBACK");
    }
    done
}

impl SqliteStore {
    /// Opens (creating if missing) the database file a `sqlite://path` URL
    /// names, on the system clock; does not migrate.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        SqliteStore::connect_on(url, Arc::new(crate::ports::SystemClock)).await
    }

    /// As [`SqliteStore::connect`], its leases kept by `clock`.
    pub async fn connect_on(
        url: &str,
        clock: Arc<dyn crate::ports::Clock>,
    ) -> Result<Self, StoreError> {
        let path = database_path(url)?;
        if let Some(parent) = path.parent()
            && !parent.as_os_str().is_empty()
        {
            std::fs::create_dir_all(parent)
                .map_err(|e| StoreError::Unavailable(format!("database folder: {}", e.kind())))?;
        }
        // The first connection sets the file's WAL mode.
        let writer = GroupWriter::start(open(&path, Role::Writer)?)?;
        let relaxed = Mutex::new(open(&path, Role::Relaxed)?);
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                readers: Mutex::new(Vec::new()),
                relaxed,
                relaxed_commits: AtomicU64::new(0),
                restart_due: std::sync::atomic::AtomicBool::new(false),
                writer,
                path,
                clock,
            }),
        })
    }

    /// Closes the store's connections now, waiting until each has ended
    /// (the writer's after what is queued to it is written): what a process
    /// about to replace the database's files must wait for, since the last
    /// connection to close checkpoints the log and removes it. A store whose
    /// clones live on closes with the last of them.
    pub async fn close(self) {
        drop(self);
    }

    /// A write transaction committed as durably as `durability` says: on
    /// this task when relaxed, by the writer thread (with the writes queued
    /// beside it) when flushed.
    async fn write<T, F>(&self, durability: Durability, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        match durability {
            Durability::Relaxed => self.relaxed(work),
            Durability::Flushed => self.flushed(work).await,
        }
    }

    /// A flushed write transaction.
    async fn flushed<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.inner.writer.write(work).await
    }

    /// A relaxed write transaction, on this task.
    fn relaxed<T>(
        &self,
        work: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let connection = lock(&self.inner.relaxed);
        let committed = transaction(&connection, "BEGIN IMMEDIATE", work);
        let commits = self.inner.relaxed_commits.fetch_add(1, Ordering::Relaxed) + 1;
        if commits.is_multiple_of(RELAXED_COMMITS_PER_CHECKPOINT) {
            self.inner.writer.checkpoint();
            if log_past_bound(&self.inner.path) {
                self.inner.restart_due.store(true, Ordering::Relaxed);
            }
        }
        if self.inner.restart_due.load(Ordering::Relaxed) && restart_log(&connection) {
            self.inner.restart_due.store(false, Ordering::Relaxed);
        }
        committed
    }

    /// A read on a reader connection, one snapshot for its statements, run
    /// off the runtime's worker ([`off_the_worker`]).
    fn read<T>(
        &self,
        work: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        off_the_worker(|| {
            let kept = lock(&self.inner.readers).pop();
            let connection = match kept {
                Some(connection) => connection,
                None => open(&self.inner.path, Role::Other)?,
            };
            let read = transaction(&connection, "BEGIN", work);
            let mut readers = lock(&self.inner.readers);
            if readers.len() < KEPT_READERS {
                readers.push(connection);
            }
            read
        })
    }

    /// Applies the pending migrations in one transaction on a connection of
    /// their own, with foreign keys off (a migration may rebuild a table
    /// others reference, which SQLite does with them off, and they cannot be
    /// turned off inside a transaction), checking them before the commit.
    fn migrate_now(&self) -> Result<Vec<i64>, StoreError> {
        let connection = open(&self.inner.path, Role::Other)?;
        create_migrations_table(&connection)?;
        connection
            .execute_batch("PRAGMA foreign_keys = OFF")
            .map_err(sqlite_error)?;
        transaction(&connection, "BEGIN IMMEDIATE", |connection| {
            // Read under the lock: another process may have just migrated.
            let pending = plan(SQLITE_MIGRATIONS, &applied(connection)?)?;
            for migration in &pending {
                connection
                    .execute_batch(migration.sql)
                    .map_err(|error| StoreError::Migration {
                        version: migration.version,
                        reason: sqlite_error(error).to_string(),
                    })?;
                query(
                    "INSERT INTO toolgate_migrations (version, description, checksum) VALUES ($1, $2, $3)",
                )
                .bind(migration.version)
                .bind(migration.description)
                .bind(migration.checksum())
                .execute(connection)?;
            }
            let broken = query("PRAGMA foreign_key_check").fetch_all(connection)?;
            if !broken.is_empty() {
                return Err(StoreError::Migration {
                    version: pending.last().map_or(0, |m| m.version),
                    reason: format!("{} row(s) would break a foreign key", broken.len()),
                });
            }
            Ok(pending.iter().map(|m| m.version).collect())
        })
    }
}

fn create_migrations_table(connection: &Connection) -> Result<(), StoreError> {
    connection
        .execute_batch(
            "CREATE TABLE IF NOT EXISTS toolgate_migrations (\
                version BIGINT PRIMARY KEY, description TEXT NOT NULL, \
                checksum TEXT NOT NULL, applied_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)",
        )
        .map_err(sqlite_error)
}

fn applied(connection: &Connection) -> Result<Vec<(i64, String)>, StoreError> {
    query("SELECT version, checksum FROM toolgate_migrations ORDER BY version")
        .fetch_all(connection)?
        .iter()
        .map(|row| Ok((get(row, "version")?, get(row, "checksum")?)))
        .collect()
}

impl Schema for SqliteStore {
    fn pending_migrations(&self) -> BoxFuture<'_, Result<Vec<i64>, StoreError>> {
        Box::pin(async move {
            let applied = self.relaxed(|connection| {
                create_migrations_table(connection)?;
                applied(connection)
            })?;
            Ok(plan(SQLITE_MIGRATIONS, &applied)?
                .iter()
                .map(|m| m.version)
                .collect())
        })
    }

    fn migrate(&self) -> BoxFuture<'_, Result<Vec<i64>, StoreError>> {
        Box::pin(async move { self.migrate_now() })
    }

    fn row_security_bypassed(&self) -> BoxFuture<'_, Result<bool, StoreError>> {
        // One node, one file: no row-level security to bypass.
        Box::pin(async { Ok(false) })
    }
}

fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

fn time(row: &Row, column: &str) -> Result<DateTime<Utc>, StoreError> {
    let micros: i64 = get(row, column)?;
    DateTime::from_timestamp_micros(micros)
        .ok_or_else(|| StoreError::Decode(format!("{column}: out of range")))
}

fn optional_time(row: &Row, column: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
    get::<Option<i64>>(row, column)?
        .map(|micros| {
            DateTime::from_timestamp_micros(micros)
                .ok_or_else(|| StoreError::Decode(format!("{column}: out of range")))
        })
        .transpose()
}

fn uuid(row: &Row, column: &str) -> Result<Uuid, StoreError> {
    let text: String = get(row, column)?;
    Uuid::parse_str(&text).map_err(|_| StoreError::Decode(format!("{column}: not a UUID")))
}

fn optional_uuid(row: &Row, column: &str) -> Result<Option<Uuid>, StoreError> {
    get::<Option<String>>(row, column)?
        .map(|text| {
            Uuid::parse_str(&text).map_err(|_| StoreError::Decode(format!("{column}: not a UUID")))
        })
        .transpose()
}

fn json(row: &Row, column: &str) -> Result<serde_json::Value, StoreError> {
    let text: String = get(row, column)?;
    serde_json::from_str(&text).map_err(|_| StoreError::Decode(format!("{column}: not JSON")))
}

fn optional_json(row: &Row, column: &str) -> Result<Option<serde_json::Value>, StoreError> {
    get::<Option<String>>(row, column)?
        .map(|text| {
            serde_json::from_str(&text)
                .map_err(|_| StoreError::Decode(format!("{column}: not JSON")))
        })
        .transpose()
}

/// `value` as the TEXT it is stored as: written straight into a buffer
/// (`Display` would hand the formatter one token at a time, a dynamic call
/// each), which a `Value` cannot fail.
fn text(value: &serde_json::Value) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| value.to_string())
}

impl super::rows::Columns for Row {
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

    fn optional_float(&self, column: &str) -> Result<Option<f64>, StoreError> {
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

/// One event row. Written for every event, so what SQLite tests on the
/// way in must stay plain: no constant list in a condition (0030).
pub(super) const INSERT_EVENT: &str =
    "INSERT INTO events (tenant_id, event_type, payload, created_at) VALUES ($1, $2, $3, $4)";

/// Appends a commit's events, in order (a platform event may belong to no
/// tenant).
fn append_events(
    connection: &Connection,
    tenant_id: Option<&str>,
    events: &Events,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    for (kind, body) in events.kinds.iter().zip(&events.bodies) {
        query(INSERT_EVENT)
            .bind(tenant_id)
            .bind(*kind)
            .bind(text(body).as_str())
            .bind(micros(now))
            .execute(connection)?;
    }
    Ok(())
}

/// A store migrated in a folder of its own, closed, and a connection to
/// its file: what the tests of the store's statements explain them on.
#[cfg(test)]
pub(super) async fn migrated() -> (tempfile::TempDir, Connection) {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("toolgate.db");
    let store = SqliteStore::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    store.migrate_now().unwrap();
    store.close().await;
    let connection = Connection::open(&path).unwrap();
    (folder, connection)
}

/// Column `column` of each row `EXPLAIN {statement}` (or `EXPLAIN QUERY
/// PLAN`, as `explain` says) gives on `connection`: what the tests of the
/// store's statements read their opcodes and plans from.
#[cfg(test)]
pub(super) fn explained(
    connection: &Connection,
    explain: &str,
    statement: &str,
    column: usize,
) -> Vec<String> {
    let mut explained = connection
        .prepare(&format!("{explain} {statement}"))
        .unwrap_or_else(|error| panic!("{error}: {statement}"));
    let mut rows = explained.raw_query();
    let mut values = Vec::new();
    while let Some(row) = rows.next().unwrap() {
        values.push(row.get(column).unwrap());
    }
    values
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_file() {
        assert_eq!(
            database_path("sqlite://var/toolgate.db").unwrap(),
            PathBuf::from("var/toolgate.db")
        );
        assert_eq!(
            database_path("sqlite:///var/lib/toolgate/toolgate.db?mode=rwc").unwrap(),
            PathBuf::from("/var/lib/toolgate/toolgate.db")
        );
        assert_eq!(
            database_path("sqlite:toolgate.db").unwrap(),
            PathBuf::from("toolgate.db")
        );
        for refused in ["sqlite::memory:", "sqlite://", "postgres://x"] {
            assert!(database_path(refused).is_err(), "{refused}");
        }
    }

    /// A store in a folder of its own with a table `pages` of blobs, and
    /// its file's path.
    async fn store_with_pages() -> (tempfile::TempDir, PathBuf, SqliteStore) {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("toolgate.db");
        let store = SqliteStore::connect(&format!("sqlite://{}", path.display()))
            .await
            .unwrap();
        store
            .relaxed(|connection| {
                connection
                    .execute_batch("CREATE TABLE pages (body BLOB)")
                    .map_err(sqlite_error)
            })
            .unwrap();
        (folder, path, store)
    }

    /// A row of `pages`: three pages of the log.
    fn insert_page(connection: &Connection) -> Result<(), StoreError> {
        query("INSERT INTO pages (body) VALUES (zeroblob(8192))")
            .execute(connection)
            .map(|_| ())
    }

    /// Commits that never pause never let SQLite start its log over by
    /// itself; a relaxed commit has it started over once the writer's
    /// checkpoint finds it past its bound, so the file stays bounded under
    /// load however long it lasts. It is started over in place: the file
    /// keeps the blocks the next commits write over.
    #[tokio::test]
    async fn the_log_stays_bounded_under_commits_that_never_pause() {
        let (folder, _, store) = store_with_pages().await;
        // Three pages a row: some 72,000 pages through the log in all,
        // four times its bound.
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    for _ in 0..12_000 {
                        store.relaxed(insert_page).unwrap();
                    }
                });
            }
        });
        let log = std::fs::metadata(folder.path().join("toolgate.db-wal"))
            .unwrap()
            .len();
        assert!(log < 3 * LOG_BYTES_BOUND, "the log grew to {log} bytes");
        assert!(
            log >= LOG_BYTES_BOUND,
            "the log's file was cut to {log} bytes when it started over"
        );
    }

    /// A read, however long, leaves the runtime's one worker to the other
    /// tasks: the read below ends only once a task spawned beside it on
    /// that worker has run.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_read_leaves_the_runtimes_one_worker_to_other_tasks() {
        let (_folder, _path, store) = store_with_pages().await;
        let on_the_worker = tokio::spawn(async move {
            let (ran, has_run) = std::sync::mpsc::channel();
            let beside = tokio::spawn(async move { ran.send(()).unwrap() });
            let read = store.read(|connection| {
                has_run
                    .recv_timeout(Duration::from_secs(30))
                    .map_err(|_| StoreError::Unavailable("the task beside never ran".into()))?;
                query("SELECT count(*) AS n FROM pages").fetch_one(connection)
            });
            beside.await.unwrap();
            read
        });
        let rows = on_the_worker.await.unwrap().unwrap();
        assert_eq!(get::<i64>(&rows, "n").unwrap(), 0);
    }

    /// A relaxed commit never checkpoints on its calling task, even past
    /// the log size SQLite would checkpoint at by itself; the writer thread
    /// does, when relaxed commits ask.
    #[tokio::test]
    async fn relaxed_commits_leave_their_checkpoints_to_the_writer() {
        let (_folder, path, store) = store_with_pages().await;
        let size = || std::fs::metadata(&path).unwrap().len();
        let before = size();
        // Three pages a row: some 1,500 in the log, past SQLite's 1,000.
        for _ in 2..RELAXED_COMMITS_PER_CHECKPOINT {
            store.relaxed(insert_page).unwrap();
        }
        assert_eq!(size(), before, "a relaxed commit checkpointed the log");
        store.relaxed(insert_page).unwrap();
        for _ in 0..200 {
            if size() > before {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(size() > before, "the writer did not checkpoint the log");
        let rows = store
            .read(|connection| query("SELECT count(*) AS n FROM pages").fetch_one(connection))
            .unwrap();
        assert_eq!(
            get::<i64>(&rows, "n").unwrap(),
            i64::try_from(RELAXED_COMMITS_PER_CHECKPOINT - 1).unwrap()
        );
    }
}
