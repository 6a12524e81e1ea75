//! Workers and their leases: who may hold a row, and until when.
//!
//! Every lease decision is made on the store's clock (`now()` on
//! PostgreSQL; the embedded store is one node and reads the process's):
//! a lease is written as "this long from now" and judged expired against
//! the same clock, so nodes whose clocks disagree never disagree about it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::StoreError;
use crate::ports::tool::BoxFuture;

/// A worker process and its lease, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerLease {
    /// The worker.
    pub worker_id: Uuid,
    /// The node it runs on: the identity kept in the node's state folder,
    /// which one process at a time holds.
    pub node: String,
    /// Where that folder is: a fingerprint of the host's boot and the
    /// folder itself, so a copy of the folder is told from its original.
    pub host: String,
    /// Start of the process.
    pub started_at: DateTime<Utc>,
    /// Its rows are in flight until this moment (the store's clock).
    pub lease_expires_at: DateTime<Utc>,
    /// When it was released, if it was.
    pub released_at: Option<DateTime<Utc>>,
}

/// A worker asking to be registered on its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerRegistration {
    /// The new worker.
    pub worker_id: Uuid,
    /// The node's identity.
    pub node: String,
    /// The fingerprint of the node folder's place (see [`WorkerLease::host`]).
    pub host: String,
    /// How long the first lease lasts.
    pub lease: Duration,
}

/// What registering found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registration {
    /// Registered; the node's earlier workers were released.
    Registered {
        /// Earlier workers of the node released now (dead incarnations,
        /// or a copy whose lease had run out).
        released: u64,
        /// Whether the node's newest earlier worker was registered from
        /// another place: the folder was copied or moved.
        moved: bool,
    },
    /// The node's identity is held by a live worker registered from
    /// another place (a copied node folder): nothing was written, and that
    /// worker keeps its lease.
    HeldElsewhere {
        /// The live worker.
        worker_id: Uuid,
        /// Its lease, on the store's clock.
        lease_expires_at: DateTime<Utc>,
    },
}

/// A heartbeat's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The lease was extended; the store's clock read at the renewal.
    Renewed {
        /// The store's `now`.
        store_now: DateTime<Utc>,
    },
    /// The lease had ended (released, or run out before this renewal):
    /// other workers may hold its rows, and this one must stop.
    Lost,
}

/// The `workers` table: registration, heartbeats and release.
pub trait WorkerStore: Send + Sync {
    /// The store's clock, which every lease is judged by.
    fn store_now(&self) -> BoxFuture<'_, Result<DateTime<Utc>, StoreError>>;

    /// Registers a worker on its node in one commit: refused (nothing
    /// written) when a live worker registered from another place holds the
    /// node; otherwise the node's other workers are released (they are
    /// earlier incarnations of a node whose folder lock the caller holds,
    /// or a copy whose lease ran out) and the new worker gets its first
    /// lease, `lease` long on the store's clock.
    fn register_worker<'a>(
        &'a self,
        registration: &'a WorkerRegistration,
    ) -> BoxFuture<'a, Result<Registration, StoreError>>;

    /// Extends a live lease to `lease` from the store's now. A lease that
    /// was released or has already run out is not revived: [`Renewal::Lost`].
    fn heartbeat(
        &self,
        worker_id: Uuid,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Renewal, StoreError>>;

    /// Ends a worker's lease now, so its unfinished rows become recoverable.
    fn release_worker(&self, worker_id: Uuid) -> BoxFuture<'_, Result<(), StoreError>>;

    /// The lease of a worker, if registered.
    fn worker(&self, worker_id: Uuid) -> BoxFuture<'_, Result<Option<WorkerLease>, StoreError>>;
}
