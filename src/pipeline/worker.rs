//! This process as a worker: its lease, the heartbeat that keeps it, and
//! the recovery sweep that runs at start-up and on a period.
//!
//! One owned task does both; it stops when the shutdown token fires, and
//! releasing the worker makes its unfinished rows recoverable at once.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::call::RecoveryReport;
use super::executor::Pipeline;
use crate::ports::{Clock, StoreError, WorkerLease, WorkerStore};

/// How the lease and the sweep are paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerSettings {
    /// How long the lease lasts past each heartbeat.
    pub lease: Duration,
    /// How often the heartbeat renews it; a third of the lease leaves two
    /// chances before it runs out.
    pub heartbeat: Duration,
    /// How often the recovery sweep runs after the one at start-up.
    pub sweep: Duration,
    /// Rows taken over per sweep round.
    pub sweep_batch: i64,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        WorkerSettings {
            lease: Duration::from_secs(30),
            heartbeat: Duration::from_secs(10),
            sweep: Duration::from_secs(30),
            sweep_batch: 100,
        }
    }
}

/// A registered worker.
pub struct Worker {
    id: Uuid,
    store: Arc<dyn WorkerStore>,
    clock: Arc<dyn Clock>,
    settings: WorkerSettings,
}

fn chrono(duration: Duration) -> chrono::Duration {
    chrono::Duration::from_std(duration).unwrap_or(chrono::Duration::MAX)
}

impl Worker {
    /// Registers a new worker with its first lease, on `node`, and ends the
    /// leases of that node's earlier workers. The caller must hold the
    /// node's identity (its state folder's lock).
    pub async fn register(
        store: Arc<dyn WorkerStore>,
        clock: Arc<dyn Clock>,
        node: &str,
        settings: WorkerSettings,
    ) -> Result<Worker, StoreError> {
        let id = Uuid::new_v4();
        let now = clock.now();
        store
            .register_worker(&WorkerLease {
                worker_id: id,
                node: node.to_owned(),
                started_at: now,
                lease_expires_at: now + chrono(settings.lease),
            })
            .await?;
        // The node's identity is held by one process at a time, so its
        // other workers are earlier incarnations, dead: their rows need not
        // wait out a lease nobody will renew.
        let released = store.release_node_workers(node, id, now).await?;
        if released > 0 {
            tracing::info!(
                released,
                "leases of this node's earlier process released; its calls recover now"
            );
        }
        Ok(Worker {
            id,
            store,
            clock,
            settings,
        })
    }

    /// The worker's id, which the pipeline claims rows under.
    pub fn id(&self) -> Uuid {
        self.id
    }

    /// Renews the lease once; `false` when it was lost (released).
    pub async fn heartbeat(&self) -> Result<bool, StoreError> {
        self.store
            .heartbeat(self.id, self.clock.now() + chrono(self.settings.lease))
            .await
    }

    /// Runs the start-up sweep, then heartbeats and sweeps on their periods
    /// until `shutdown` fires. A lost lease ends the task: the worker must
    /// not keep claiming rows it no longer owns.
    pub fn spawn(
        self: Arc<Self>,
        pipeline: Arc<Pipeline>,
        shutdown: CancellationToken,
    ) -> JoinHandle<()> {
        tokio::spawn(async move {
            self.sweep(&pipeline).await;
            let mut heartbeat = tokio::time::interval(self.settings.heartbeat);
            let mut sweep = tokio::time::interval(self.settings.sweep);
            heartbeat.tick().await;
            sweep.tick().await;
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = heartbeat.tick() => match self.heartbeat().await {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::error!(worker = %self.id, "worker lease lost; stopping");
                            return;
                        }
                        Err(error) => tracing::warn!(worker = %self.id, error = %error, "heartbeat failed"),
                    },
                    _ = sweep.tick() => {
                        self.sweep(&pipeline).await;
                    }
                }
            }
        })
    }

    async fn sweep(&self, pipeline: &Pipeline) -> RecoveryReport {
        match pipeline.recover(self.settings.sweep_batch).await {
            Ok(report) => {
                if report.taken > 0 {
                    tracing::info!(
                        taken = report.taken,
                        uncertain = report.uncertain,
                        "recovery sweep"
                    );
                }
                report
            }
            Err(error) => {
                tracing::warn!(error = %error, "recovery sweep failed");
                RecoveryReport::default()
            }
        }
    }

    /// Ends the lease now, so another worker can recover what is left.
    pub async fn release(&self) -> Result<(), StoreError> {
        self.store.release_worker(self.id, self.clock.now()).await
    }
}
