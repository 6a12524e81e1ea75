//! A node's connections to PostgreSQL: how many, how they are split
//! between the hot path, the pool and the lease, and each tenant's share of
//! them.
//!
//! A node holds at most `store.connections` (8 by default), so many nodes
//! fit one server's `max_connections`. A call waiting for a connection
//! queues (first come, first served) rather than timing out; a tenant
//! queues first for its share, at most three quarters of a set, so one
//! tenant's load always leaves connections for the others.
//!
//! Behind a pooler that hands a server to another client between
//! transactions (PgBouncer's `pool_mode = transaction`), a statement
//! prepared by name on one server is missing, or another client's, on the
//! next. There every statement is prepared unnamed and runs inside a
//! transaction ([`Statements`]), so its parse and its execution meet the
//! same server. toolgate uses nothing else a session holds: its advisory
//! locks are the transaction's (`pg_advisory_xact_lock`), its settings are
//! the transaction's (`set_config(…, true)`), and it neither `LISTEN`s nor
//! keeps temporary tables or cursors.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use futures::stream::{BoxStream, StreamExt as _};
use sqlx::postgres::{
    PgArguments, PgConnectOptions, PgQueryResult, PgRow, PgStatement, PgTypeInfo,
};
use sqlx::{Connection, Either, Execute, Executor, PgConnection, Postgres, SqlStr, Transaction};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{connection_lost, database_error};
use crate::ports::StoreError;

/// Connections a node holds by default: eleven such nodes fit PostgreSQL's
/// default `max_connections` of 100, with room for the operators' own.
pub const DEFAULT_CONNECTIONS: u32 = 8;
/// The fewest that work: the lease's own, one for the hot path, one pooled.
pub const MINIMUM_CONNECTIONS: u32 = 3;

/// How a node's connections are split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Split {
    /// The pipeline's one-statement commits.
    pub hot: u32,
    /// Transactions: reads, approvals, sessions, sweeps, migrations.
    pub pooled: u32,
}

impl Split {
    /// `connections` less the lease's own, half (rounded up) to the hot path
    /// and the rest pooled.
    pub fn of(connections: u32) -> Split {
        let rest = connections.max(MINIMUM_CONNECTIONS) - 1;
        let hot = rest.div_ceil(2);
        Split {
            hot,
            pooled: rest - hot,
        }
    }
}

/// Tenants whose shares are remembered; past it, those that nobody holds
/// or waits for are forgotten.
const TRACKED_TENANTS: usize = 1024;

/// Each tenant's share of a set of `size` connections: at most three
/// quarters of them at once (one, of a set of one), taken in arrival order.
pub(super) struct TenantShares {
    share: usize,
    tenants: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl TenantShares {
    pub fn of(size: usize) -> TenantShares {
        TenantShares {
            share: size.saturating_sub((size / 4).max(1)).max(1),
            tenants: Mutex::new(HashMap::new()),
        }
    }

    /// Waits for a place in `tenant`'s share.
    pub async fn take(&self, tenant: &str) -> Result<OwnedSemaphorePermit, StoreError> {
        let semaphore = {
            let mut tenants = self
                .tenants
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if tenants.len() >= TRACKED_TENANTS && !tenants.contains_key(tenant) {
                // A permit holds its semaphore: one held by nobody else is
                // neither taken nor waited for.
                tenants.retain(|_, semaphore| Arc::strong_count(semaphore) > 1);
            }
            tenants
                .entry(tenant.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(self.share)))
                .clone()
        };
        semaphore
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Unavailable("the connection set is closed".into()))
    }
}

/// The hot path's connections. sqlx's pool pings every connection it takes
/// back, one more round trip per statement; the pipeline's one-statement
/// commits use this set instead. A connection goes back only when its
/// statement completed (or the server answered it with an error, which
/// leaves the protocol in step); one dropped mid-statement, as a cancelled
/// call drops it, is closed rather than reused in an unknown state.
pub(super) struct HotConnections {
    options: PgConnectOptions,
    idle: Mutex<Vec<PgConnection>>,
    permits: Semaphore,
    shares: TenantShares,
    unnamed: bool,
}

/// One connection of the set, held for one statement.
pub(super) struct Lease<'a> {
    set: &'a HotConnections,
    connection: Option<PgConnection>,
    _permit: tokio::sync::SemaphorePermit<'a>,
    _share: Option<OwnedSemaphorePermit>,
    reusable: bool,
}

impl HotConnections {
    /// `size` connections; `unnamed` behind a pooler per transaction.
    pub fn new(options: PgConnectOptions, size: usize, unnamed: bool) -> HotConnections {
        HotConnections {
            options,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(size),
            shares: TenantShares::of(size),
            unnamed,
        }
    }

    /// A connection for `tenant`'s statement, within its share.
    pub async fn lease_for(&self, tenant: &str) -> Result<Lease<'_>, StoreError> {
        let share = self.shares.take(tenant).await?;
        self.take(Some(share)).await
    }

    /// A connection for the node's own statement (the lease's renewal).
    pub async fn lease(&self) -> Result<Lease<'_>, StoreError> {
        self.take(None).await
    }

    async fn take(&self, share: Option<OwnedSemaphorePermit>) -> Result<Lease<'_>, StoreError> {
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
            _share: share,
            reusable: false,
        })
    }
}

impl Lease<'_> {
    /// What the connection's one statement runs on: a transaction of its
    /// own behind a pooler per transaction.
    pub fn statements(&mut self) -> Result<Statements<'_>, StoreError> {
        let unnamed = self.set.unnamed;
        let connection = self
            .connection
            .as_mut()
            .ok_or_else(|| StoreError::Unavailable("the connection was already returned".into()))?;
        Ok(Statements {
            connection,
            unnamed,
            own_transaction: unnamed,
        })
    }

    /// Marks the connection reusable when the statement ended in a known
    /// protocol state, and passes the result on.
    pub fn settle<T>(&mut self, result: Result<T, sqlx::Error>) -> Result<T, StoreError> {
        self.reusable = result.is_ok()
            || matches!(&result, Err(error @ sqlx::Error::Database(_)) if !connection_lost(error));
        if let Err(error) = &result
            && connection_lost(error)
            && let Ok(mut idle) = self.set.idle.lock()
        {
            // The server went away: the idle connections went with it, and
            // the next statements open fresh ones rather than each find one.
            idle.clear();
        }
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

/// A transaction of the pool, held within its tenant's share until it
/// ends.
pub(super) struct Scoped {
    tx: Transaction<'static, Postgres>,
    _share: Option<OwnedSemaphorePermit>,
    unnamed: bool,
}

impl Scoped {
    pub fn new(tx: Transaction<'static, Postgres>, unnamed: bool) -> Scoped {
        Scoped {
            tx,
            _share: None,
            unnamed,
        }
    }

    /// This transaction, holding its place in a tenant's share until it
    /// ends.
    pub fn within(mut self, share: Option<OwnedSemaphorePermit>) -> Scoped {
        self._share = share;
        self
    }

    /// What the transaction's statements run on.
    pub fn statements(&mut self) -> Statements<'_> {
        Statements {
            connection: &mut self.tx,
            unnamed: self.unnamed,
            own_transaction: false,
        }
    }

    pub async fn commit(self) -> Result<(), sqlx::Error> {
        self.tx.commit().await
    }
}

/// A connection as the store's statements use it: as it is, or behind a
/// pooler per transaction with every statement prepared unnamed, inside
/// a transaction (its own when the caller holds none).
#[derive(Debug)]
pub(super) struct Statements<'c> {
    connection: &'c mut PgConnection,
    unnamed: bool,
    own_transaction: bool,
}

/// A statement prepared unnamed: no server keeps it past its use.
struct Unnamed<E>(E);

impl<'q, E: Execute<'q, Postgres>> Execute<'q, Postgres> for Unnamed<E> {
    fn sql(self) -> SqlStr {
        self.0.sql()
    }

    fn statement(&self) -> Option<&PgStatement> {
        self.0.statement()
    }

    fn take_arguments(&mut self) -> Result<Option<PgArguments>, sqlx::error::BoxDynError> {
        self.0.take_arguments()
    }

    fn persistent(&self) -> bool {
        false
    }
}

type Step = Either<PgQueryResult, PgRow>;

impl<'c> Executor<'c> for Statements<'c> {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(self, query: E) -> BoxStream<'e, Result<Step, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        match (self.unnamed, self.own_transaction) {
            (false, _) => self.connection.fetch_many(query),
            (true, false) => self.connection.fetch_many(Unnamed(query)),
            (true, true) => {
                let connection = self.connection;
                // The steps are gathered within the transaction, then given.
                futures::stream::once(async move {
                    let mut tx = connection.begin().await?;
                    let steps: Vec<Step> =
                        futures::TryStreamExt::try_collect((&mut *tx).fetch_many(Unnamed(query)))
                            .await?;
                    tx.commit().await?;
                    Ok::<_, sqlx::Error>(steps)
                })
                .flat_map(|gathered| {
                    futures::stream::iter(match gathered {
                        Ok(steps) => steps.into_iter().map(Ok).collect::<Vec<_>>(),
                        Err(error) => vec![Err(error)],
                    })
                })
                .boxed()
            }
        }
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        match (self.unnamed, self.own_transaction) {
            (false, _) => self.connection.fetch_optional(query),
            (true, false) => self.connection.fetch_optional(Unnamed(query)),
            (true, true) => {
                let connection = self.connection;
                Box::pin(async move {
                    let mut tx = connection.begin().await?;
                    let row = (&mut *tx).fetch_optional(Unnamed(query)).await?;
                    tx.commit().await?;
                    Ok(row)
                })
            }
        }
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement, sqlx::Error>>
    where
        'c: 'e,
    {
        self.connection.prepare_with(sql, parameters)
    }
}

/// A first connection to the server `options` name. One that cannot be
/// made says at once where it was dialled and what to check, rather than
/// after a pool's wait.
pub(super) async fn reach(options: &PgConnectOptions) -> Result<PgConnection, StoreError> {
    PgConnection::connect_with(options).await.map_err(|error| {
        let cause = database_error(error);
        StoreError::Unavailable(format!(
            "cannot reach PostgreSQL at {}:{} ({cause}): check that the server runs and listens \
             there (listen_addresses, port, pg_hba.conf) and that store.url names it",
            options.get_host(),
            options.get_port()
        ))
    })
}

/// Whether the server behind `options` is shared between client
/// connections per transaction: two client connections open at once (`one`
/// and another) are served by one backend, which neither PostgreSQL nor a
/// pooler per session does. (Simple queries: nothing is prepared to find
/// this out.)
pub(super) async fn pooled_per_transaction(
    options: &PgConnectOptions,
    mut one: PgConnection,
) -> Result<bool, StoreError> {
    let mut two = reach(options).await?;
    let backend = async |connection: &mut PgConnection| {
        let row = sqlx::raw_sql("SELECT pg_backend_pid()")
            .fetch_one(&mut *connection)
            .await
            .map_err(database_error)?;
        sqlx::Row::try_get::<i32, _>(&row, 0).map_err(database_error)
    };
    let (first, second) = (backend(&mut one).await?, backend(&mut two).await?);
    let _ = one.close().await;
    let _ = two.close().await;
    Ok(first == second)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_holds_what_it_is_given_split_between_the_hot_path_and_the_pool() {
        assert_eq!(Split::of(8), Split { hot: 4, pooled: 3 });
        assert_eq!(Split::of(3), Split { hot: 1, pooled: 1 });
        assert_eq!(Split::of(0), Split::of(MINIMUM_CONNECTIONS));
        for connections in MINIMUM_CONNECTIONS..64 {
            let split = Split::of(connections);
            assert_eq!(split.hot + split.pooled + 1, connections);
            assert!(split.hot >= 1 && split.pooled >= 1);
        }
    }

    #[tokio::test]
    async fn a_tenant_takes_at_most_three_quarters_of_a_set_and_waits_for_the_rest() {
        let shares = TenantShares::of(4);
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(shares.take("greedy").await.unwrap());
        }
        let fourth =
            tokio::time::timeout(std::time::Duration::from_millis(50), shares.take("greedy"));
        assert!(fourth.await.is_err(), "a fourth waits");
        // Another tenant is not behind it.
        let other =
            tokio::time::timeout(std::time::Duration::from_millis(50), shares.take("other"));
        assert!(other.await.is_ok());
        held.pop();
        assert!(shares.take("greedy").await.is_ok());
        assert_eq!(TenantShares::of(1).share, 1);
        assert_eq!(TenantShares::of(3).share, 2);
    }

    #[tokio::test]
    async fn tenants_no_longer_in_use_are_forgotten_past_the_bound() {
        let shares = TenantShares::of(4);
        let kept = shares.take("kept").await.unwrap();
        for index in 0..TRACKED_TENANTS * 2 {
            drop(shares.take(&format!("tenant-{index}")).await.unwrap());
        }
        let tenants = shares.tenants.lock().unwrap();
        assert!(tenants.len() <= TRACKED_TENANTS);
        assert!(tenants.contains_key("kept"));
        drop(kept);
    }
}
