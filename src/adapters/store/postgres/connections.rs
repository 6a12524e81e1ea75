//! A node's connections to PostgreSQL: how many, how they are split
//! between the hot path, the pool and the lease, and each tenant's share of
//! them.
//!
//! A node holds at most `store.connections` (8 by default), so many nodes
//! fit one server's `max_connections`. A call waiting for a connection
//! queues (first come, first served) rather than timing out; a tenant
//! queues first for its share, at most three quarters of a set, so one
//! tenant's load always leaves connections for the others.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection, Postgres, Transaction};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{connection_lost, database_error};
use crate::ports::StoreError;

/// Connections a node holds by default: five such nodes and room to spare
/// fit PostgreSQL's default `max_connections` of 100.
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
    pub fn new(options: PgConnectOptions, size: usize) -> HotConnections {
        HotConnections {
            options,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(size),
            shares: TenantShares::of(size),
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
    pub fn connection(&mut self) -> Result<&mut PgConnection, StoreError> {
        self.connection
            .as_mut()
            .ok_or_else(|| StoreError::Unavailable("the connection was already returned".into()))
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
}

impl Scoped {
    pub fn new(tx: Transaction<'static, Postgres>, share: Option<OwnedSemaphorePermit>) -> Scoped {
        Scoped { tx, _share: share }
    }

    pub async fn commit(self) -> Result<(), sqlx::Error> {
        self.tx.commit().await
    }
}

impl std::ops::Deref for Scoped {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.tx
    }
}

impl std::ops::DerefMut for Scoped {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.tx
    }
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
