//! Workers and their leases: who may hold a row, and until when.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::StoreError;
use crate::ports::tool::BoxFuture;

/// A worker process and its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerLease {
    /// The worker.
    pub worker_id: Uuid,
    /// The node it runs on: the identity kept in the node's state folder,
    /// which one process at a time holds.
    pub node: String,
    /// Start of the process.
    pub started_at: DateTime<Utc>,
    /// Its rows are in flight until this moment; recovery takes them after.
    pub lease_expires_at: DateTime<Utc>,
}

/// The `workers` table: registration, heartbeats and release.
pub trait WorkerStore: Send + Sync {
    /// Registers a worker and its first lease.
    fn register_worker<'a>(
        &'a self,
        lease: &'a WorkerLease,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Extends a worker's lease; `false` when the worker is unknown or
    /// released, and the worker must stop claiming.
    fn heartbeat(
        &self,
        worker_id: Uuid,
        lease_expires_at: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<bool, StoreError>>;

    /// Ends a worker's lease now, so its unfinished rows become recoverable.
    fn release_worker(
        &self,
        worker_id: Uuid,
        now: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<(), StoreError>>;

    /// The lease of a worker, if registered.
    fn worker(&self, worker_id: Uuid) -> BoxFuture<'_, Result<Option<WorkerLease>, StoreError>>;

    /// Ends the leases of `node`'s other workers now: earlier incarnations
    /// of a node that holds its identity's lock, so dead ones. Their
    /// unfinished rows become recoverable at once. Returns how many.
    fn release_node_workers<'a>(
        &'a self,
        node: &'a str,
        except: Uuid,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<u64, StoreError>>;
}
