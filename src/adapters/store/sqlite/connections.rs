//! The store's SQLite connections, held without sqlx's pool. The pool pings
//! a connection when it is taken from idle and again when it is given back
//! (on a task of its own); on SQLite each ping is one more round trip to the
//! connection's thread, and a read-only call's three commits paid six of
//! them on top of their statements. A set here opens its connections once
//! and hands them out and takes them back with no round trip.
//!
//! Transactions are begun and ended by their SQL. A slot is marked from
//! before its BEGIN until its COMMIT has returned, so one left open (an
//! error on the way, a caller that stopped waiting) is rolled back at once,
//! before anyone else uses the connection.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;

use sqlx::query::Query;
use sqlx::sqlite::{SqliteArguments, SqliteConnectOptions, SqliteRow};
use sqlx::{Connection as _, Sqlite, SqliteConnection};
use tokio::sync::{Mutex, OwnedMutexGuard, OwnedSemaphorePermit, Semaphore};

use super::database_error;
use crate::ports::StoreError;

/// How long a caller waits for a connection before the store reports itself
/// unavailable (sqlx's pool waited as long).
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// A fixed set of connections opened with the same options.
pub(super) struct Connections {
    slots: Vec<Arc<Mutex<Slot>>>,
    /// One per slot: whoever holds one finds a free slot.
    permits: Arc<Semaphore>,
}

impl Connections {
    /// Opens `size` connections.
    pub(super) async fn open(
        options: &SqliteConnectOptions,
        size: usize,
    ) -> Result<Arc<Self>, StoreError> {
        let mut slots = Vec::with_capacity(size.max(1));
        for _ in 0..size.max(1) {
            let connection = SqliteConnection::connect_with(options)
                .await
                .map_err(database_error)?;
            slots.push(Arc::new(Mutex::new(Slot {
                connection,
                unfinished: false,
            })));
        }
        Ok(Arc::new(Connections {
            permits: Arc::new(Semaphore::new(slots.len())),
            slots,
        }))
    }

    /// A connection, waiting while all are held, for at most
    /// [`ACQUIRE_TIMEOUT`].
    pub(super) async fn acquire(&self) -> Result<Held, StoreError> {
        let permit = tokio::time::timeout(ACQUIRE_TIMEOUT, self.permits.clone().acquire_owned())
            .await
            .map_err(|_| {
                StoreError::Unavailable("no database connection came free in time".into())
            })?
            .map_err(|_| StoreError::Unavailable("the store is closed".into()))?;
        // A permit leaves at least one slot unlocked: a holder gives its
        // slot back before its permit (field order in `Held`).
        let mut slot = self
            .slots
            .iter()
            .find_map(|slot| slot.clone().try_lock_owned().ok())
            .ok_or_else(|| StoreError::Unavailable("no free connection".into()))?;
        slot.finish().await?;
        Ok(Held { slot, permit })
    }

    /// Runs a script (`BEGIN IMMEDIATE; …; COMMIT`) as one command: one
    /// round trip to the connection's thread where a transaction of single
    /// statements takes one per statement. Returns the rows its statements
    /// return. A script that fails or is abandoned midway (the connection's
    /// thread stops at the first error, or when nobody reads its rows)
    /// leaves its transaction open: its slot stays marked until it
    /// finishes, for the next holder to roll back.
    pub(super) async fn script(
        &self,
        script: Query<'_, Sqlite, SqliteArguments>,
    ) -> Result<Vec<SqliteRow>, StoreError> {
        let mut held = self.acquire().await?;
        held.slot.unfinished = true;
        let rows = script.fetch_all(&mut *held).await.map_err(database_error)?;
        held.slot.unfinished = false;
        Ok(rows)
    }

    /// A transaction begun with `statement` (`BEGIN` or `BEGIN IMMEDIATE`).
    pub(super) async fn begin(&self, statement: &'static str) -> Result<Tx, StoreError> {
        self.acquire().await?.begin(statement).await
    }

    /// Closes every connection no one else holds, waiting until each has
    /// ended on its thread.
    pub(super) async fn close(self) {
        for slot in self.slots {
            if let Ok(slot) = Arc::try_unwrap(slot) {
                let _ = slot.into_inner().connection.close().await;
            }
        }
    }
}

/// A connection and whether a transaction was left open on it.
struct Slot {
    connection: SqliteConnection,
    unfinished: bool,
}

impl Slot {
    /// Rolls back a transaction left open. A ROLLBACK refused because
    /// SQLite already ended the transaction itself is done too; any other
    /// failure leaves the slot marked and is the holder's error, so no
    /// statement ever runs inside a transaction someone else left.
    async fn finish(&mut self) -> Result<(), StoreError> {
        if self.unfinished {
            match sqlx::raw_sql("ROLLBACK")
                .execute(&mut self.connection)
                .await
            {
                Ok(_) => {}
                Err(sqlx::Error::Database(error))
                    if error.message().contains("no transaction is active") => {}
                Err(error) => return Err(database_error(error)),
            }
            self.unfinished = false;
        }
        Ok(())
    }
}

/// One connection of a set, given back when dropped.
pub(super) struct Held {
    slot: OwnedMutexGuard<Slot>,
    permit: OwnedSemaphorePermit,
}

impl Held {
    /// A transaction on this connection, begun with `statement`.
    pub(super) async fn begin(mut self, statement: &'static str) -> Result<Tx, StoreError> {
        self.slot.unfinished = true;
        sqlx::raw_sql(statement)
            .execute(&mut *self)
            .await
            .map_err(database_error)?;
        Ok(Tx { held: self })
    }
}

impl Deref for Held {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        &self.slot.connection
    }
}

impl DerefMut for Held {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.slot.connection
    }
}

impl Drop for Held {
    /// A transaction left open holds the database lock (writers) or an old
    /// snapshot (readers) until it is rolled back, so that is done at once,
    /// on a task that waits for the slot as any holder would.
    fn drop(&mut self) {
        if !self.slot.unfinished {
            return;
        }
        let slot = OwnedMutexGuard::mutex(&self.slot).clone();
        let permits = self.permit.semaphore().clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Ok(_permit) = permits.acquire_owned().await {
                    // A failure stays marked for the next holder to retry.
                    let _ = slot.lock_owned().await.finish().await;
                }
            });
        }
    }
}

/// A transaction on a held connection: committed by [`Tx::commit`], rolled
/// back as soon as it is dropped otherwise.
pub(super) struct Tx {
    held: Held,
}

impl Tx {
    /// Commits; the connection goes back to its set.
    pub(super) async fn commit(mut self) -> Result<(), sqlx::Error> {
        sqlx::raw_sql("COMMIT").execute(&mut *self.held).await?;
        self.held.slot.unfinished = false;
        Ok(())
    }
}

impl Deref for Tx {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        &self.held
    }
}

impl DerefMut for Tx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.held
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr as _;
    use std::time::Duration;

    use sqlx::sqlite::SqliteJournalMode;

    use super::*;

    async fn two_writers(folder: &std::path::Path) -> (Arc<Connections>, Arc<Connections>) {
        let options =
            SqliteConnectOptions::from_str(&format!("sqlite://{}", folder.join("db").display()))
                .expect("options")
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_millis(200));
        let one = Connections::open(&options, 1).await.expect("opens");
        let other = Connections::open(&options, 1).await.expect("opens");
        sqlx::raw_sql("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
            .execute(&mut *one.acquire().await.expect("held"))
            .await
            .expect("table");
        (one, other)
    }

    /// Begins and commits a write on `connections`: the database lock is
    /// free well within the busy timeout.
    async fn takes_the_lock(connections: &Connections) {
        let tx = connections
            .begin("BEGIN IMMEDIATE")
            .await
            .expect("the lock is free");
        tx.commit().await.expect("commits");
    }

    async fn count(connections: &Connections) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM t")
            .fetch_one(&mut *connections.acquire().await.expect("held"))
            .await
            .expect("counts")
    }

    #[tokio::test]
    async fn a_transaction_dropped_without_its_commit_is_rolled_back_at_once() {
        let folder = tempfile::tempdir().expect("folder");
        let (one, other) = two_writers(folder.path()).await;
        {
            let mut tx = one.begin("BEGIN IMMEDIATE").await.expect("begins");
            sqlx::query("INSERT INTO t (id, v) VALUES (1, 'a')")
                .execute(&mut *tx)
                .await
                .expect("inserts");
        }
        // The other writer gets the lock well within its busy timeout: the
        // dropped one did not keep it until its connection's next use.
        takes_the_lock(&other).await;
        assert_eq!(count(&other).await, 0);
        let tx = one.begin("BEGIN IMMEDIATE").await.expect("reused cleanly");
        tx.commit().await.expect("commits");
    }

    #[tokio::test]
    async fn a_script_that_fails_midway_commits_nothing_and_frees_the_lock() {
        let folder = tempfile::tempdir().expect("folder");
        let (one, other) = two_writers(folder.path()).await;
        let failed = one
            .script(sqlx::query(
                "BEGIN IMMEDIATE; INSERT INTO t (id, v) VALUES (1, 'a'); \
                 INSERT INTO t (id, v) VALUES (2, NULL); COMMIT",
            ))
            .await;
        assert!(
            failed.is_err(),
            "the NOT NULL column refuses the second row"
        );
        takes_the_lock(&other).await;
        assert_eq!(count(&other).await, 0, "the first row went with it");
        let rows = one
            .script(sqlx::query(
                "BEGIN IMMEDIATE; INSERT INTO t (id, v) VALUES (3, 'c') RETURNING id; COMMIT",
            ))
            .await
            .expect("the connection is usable");
        assert_eq!(rows.len(), 1);
        assert_eq!(count(&one).await, 1);
    }

    #[tokio::test]
    async fn an_abandoned_script_does_not_keep_the_lock() {
        let folder = tempfile::tempdir().expect("folder");
        let (one, other) = two_writers(folder.path()).await;
        // Abandoned while its rows stream: the connection's thread stops
        // sending them, before the COMMIT, with the lock held.
        let script = one.script(sqlx::query(
            "BEGIN IMMEDIATE; INSERT INTO t (id, v) VALUES (1, 'a'); \
             WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 5000000) \
             SELECT x FROM c; COMMIT",
        ));
        assert!(
            tokio::time::timeout(Duration::from_millis(20), script)
                .await
                .is_err(),
            "abandoned midway"
        );
        takes_the_lock(&other).await;
        assert_eq!(count(&other).await, 0);
    }

    #[tokio::test]
    async fn a_transaction_sqlite_already_ended_leaves_the_connection_usable() {
        let folder = tempfile::tempdir().expect("folder");
        let (one, _) = two_writers(folder.path()).await;
        {
            // Ended behind the slot's back: the ROLLBACK the next holder
            // sends finds no transaction, which is not an error.
            let mut tx = one.begin("BEGIN IMMEDIATE").await.expect("begins");
            sqlx::raw_sql("INSERT INTO t (id, v) VALUES (1, 'a'); COMMIT")
                .execute(&mut *tx)
                .await
                .expect("commits");
        }
        let tx = one.begin("BEGIN IMMEDIATE").await.expect("usable");
        tx.commit().await.expect("commits");
        assert_eq!(count(&one).await, 1);
    }
}
