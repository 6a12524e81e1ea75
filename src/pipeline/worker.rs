//! This process as a worker: its lease, the heartbeat that keeps it, and
//! the recovery sweep that runs at start-up and on a period.
//!
//! The lease is renewed on a task of its own (and, on PostgreSQL, a
//! connection of its own), so no sweep, discovery or slow call can starve
//! it. Every lease is judged by the store's clock; this process only keeps a
//! conservative local view of it ([`Lease`]): live until one heartbeat
//! before the store's expiry could fall, counted from when the renewal was
//! sent. A process whose lease is not live claims nothing and is not ready;
//! one whose lease was lost (released, or run out before it was renewed)
//! stops for good, and the composition root drains it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::call::{RecoveryReport, SweepBounds};
use super::executor::Pipeline;
use crate::ports::{Clock, Registration, Renewal, StoreError, WorkerRegistration, WorkerStore};

/// How the lease and the sweep are paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerSettings {
    /// How long the lease lasts past each renewal, on the store's clock.
    pub lease: Duration,
    /// How often the heartbeat renews it. The process stops claiming one
    /// heartbeat before the lease could run out, so a third of the lease
    /// leaves a renewal's worth of retries before that.
    pub heartbeat: Duration,
    /// How often the recovery sweep runs after the one at start-up.
    pub sweep: Duration,
    /// Rows taken over per sweep round.
    pub sweep_batch: i64,
    /// Rounds per sweep: what one sweep takes is bounded; the next one
    /// takes the rest.
    pub sweep_rounds: usize,
    /// How far this host's clock may be from the store's.
    pub maximum_clock_skew: Duration,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        WorkerSettings {
            lease: Duration::from_secs(30),
            heartbeat: Duration::from_secs(10),
            sweep: Duration::from_secs(30),
            sweep_batch: 100,
            sweep_rounds: 10,
            maximum_clock_skew: Duration::from_secs(5),
        }
    }
}

/// A failed heartbeat is tried again this soon (or sooner, with a shorter
/// heartbeat).
const RENEWAL_RETRY: Duration = Duration::from_secs(1);

/// Why a worker could not start.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A live worker registered from another host or folder holds the
    /// node's identity: this folder is a copy of a running node's.
    #[error(
        "this node's identity is held by a live worker registered from another host or folder \
         (a copy of this node folder?); that worker keeps it: give this process a node folder of \
         its own, or start it again after that lease ends ({lease_expires_at})"
    )]
    NodeHeldElsewhere {
        /// When the holder's lease ends unless renewed.
        lease_expires_at: DateTime<Utc>,
    },
    /// This host's clock and the store's disagree by more than allowed.
    #[error(
        "this host's clock is {skew_ms} ms from the store's, more than node.maximum_clock_skew_seconds \
         allows ({bound_ms} ms): correct the clock (NTP) before starting"
    )]
    ClockSkew {
        /// How far apart, in milliseconds.
        skew_ms: i64,
        /// The bound, in milliseconds.
        bound_ms: i64,
    },
}

/// This process's view of its lease.
#[derive(Debug)]
pub struct Lease {
    /// Until when (monotonic) the lease certainly holds, less a heartbeat.
    valid_until: Mutex<Instant>,
    lost: CancellationToken,
}

impl Lease {
    /// A lease known to hold until `valid_until`.
    pub fn until(valid_until: Instant) -> Lease {
        Lease {
            valid_until: Mutex::new(valid_until),
            lost: CancellationToken::new(),
        }
    }

    /// Whether this process may claim rows and serve calls now.
    pub fn is_live(&self) -> bool {
        !self.lost.is_cancelled() && Instant::now() < self.valid_until()
    }

    /// Fires once the lease is lost for good.
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    fn valid_until(&self) -> Instant {
        *self
            .valid_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn extend(&self, valid_until: Instant) {
        let mut current = self
            .valid_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *current = (*current).max(valid_until);
    }

    fn lose(&self) {
        self.lost.cancel();
    }
}

/// Where a node's identity lives: its id, and a fingerprint of the place
/// its folder is (the host's boot and the folder itself), which tells a copy
/// of the folder from the original.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePlace {
    /// The node's id.
    pub node: String,
    /// The fingerprint of where its folder is.
    pub host: String,
}

/// A registered worker.
pub struct Worker {
    id: Uuid,
    store: Arc<dyn WorkerStore>,
    clock: Arc<dyn Clock>,
    settings: WorkerSettings,
    lease: Arc<Lease>,
}

/// How far apart two instants are, in whole milliseconds.
fn apart(one: DateTime<Utc>, other: DateTime<Utc>) -> i64 {
    (one - other).num_milliseconds().abs()
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

impl Worker {
    /// Registers a new worker on `place` with its first lease, after
    /// checking this host's clock against the store's. The node's earlier
    /// workers are released; a live one registered from another place (a
    /// copied node folder) keeps the node, and this registration is
    /// refused. The caller must hold the node folder's lock.
    pub async fn register(
        store: Arc<dyn WorkerStore>,
        clock: Arc<dyn Clock>,
        place: &NodePlace,
        settings: WorkerSettings,
    ) -> Result<Worker, WorkerError> {
        let before = clock.now();
        let store_now = store.store_now().await?;
        let after = clock.now();
        // The store read its clock somewhere within the round trip.
        let here = before + (after - before) / 2;
        let uncertainty = (after - before).num_milliseconds() / 2;
        let skew = apart(here, store_now).saturating_sub(uncertainty);
        if skew > millis(settings.maximum_clock_skew) {
            return Err(WorkerError::ClockSkew {
                skew_ms: skew,
                bound_ms: millis(settings.maximum_clock_skew),
            });
        }
        let id = Uuid::new_v4();
        let sent = Instant::now();
        let registration = WorkerRegistration {
            worker_id: id,
            node: place.node.clone(),
            host: place.host.clone(),
            lease: settings.lease,
        };
        match store.register_worker(&registration).await? {
            Registration::HeldElsewhere {
                lease_expires_at, ..
            } => return Err(WorkerError::NodeHeldElsewhere { lease_expires_at }),
            Registration::Registered { released, moved } => {
                if moved {
                    tracing::warn!(
                        "this node folder was last used from another host or folder (copied or \
                         moved): its earlier worker's lease had ended, so this process holds the \
                         node now; a copy left running elsewhere stops at its next heartbeat"
                    );
                }
                if released > 0 {
                    tracing::info!(
                        released,
                        "leases of this node's earlier process released; its calls recover now"
                    );
                }
            }
        }
        Ok(Worker {
            id,
            store,
            clock,
            settings,
            lease: Arc::new(Lease::until(
                sent + settings.lease.saturating_sub(settings.heartbeat),
            )),
        })
    }

    /// The worker's id, which the pipeline claims rows under.
    pub fn id(&self) -> Uuid {
        self.id
    }

    /// This process's view of the lease, which the pipeline and readiness
    /// read.
    pub fn lease(&self) -> Arc<Lease> {
        self.lease.clone()
    }

    /// Renews the lease once: `false` when it was lost (and the worker must
    /// stop). A renewal that fails leaves the view as it was.
    pub async fn heartbeat(&self) -> Result<bool, StoreError> {
        let sent = Instant::now();
        match self.store.heartbeat(self.id, self.settings.lease).await? {
            Renewal::Renewed { store_now } => {
                self.lease
                    .extend(sent + self.settings.lease.saturating_sub(self.settings.heartbeat));
                let skew = apart(self.clock.now(), store_now);
                if skew > millis(self.settings.maximum_clock_skew) {
                    tracing::warn!(
                        skew_ms = skew,
                        "this host's clock has drifted from the store's past node.maximum_clock_skew_seconds; \
                         leases are judged by the store's clock, but recorded times are this host's"
                    );
                }
                Ok(true)
            }
            Renewal::Lost => {
                self.lease.lose();
                Ok(false)
            }
        }
    }

    /// Runs the lease and the sweeps, each on a task of its own, until
    /// `shutdown` fires; returns once both have stopped. A lost lease ends
    /// both: the worker must not claim rows it no longer owns.
    pub fn spawn(
        self: Arc<Self>,
        pipeline: Arc<Pipeline>,
        shutdown: CancellationToken,
    ) -> JoinHandle<()> {
        let lease = tokio::spawn(self.clone().keep_lease(shutdown.clone()));
        let sweeps = tokio::spawn(self.sweeps(pipeline, shutdown));
        tokio::spawn(async move {
            let _ = lease.await;
            let _ = sweeps.await;
        })
    }

    async fn keep_lease(self: Arc<Self>, shutdown: CancellationToken) {
        let retry = RENEWAL_RETRY.min(self.settings.heartbeat / 4);
        let mut next = Instant::now() + self.settings.heartbeat;
        let mut was_live = true;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep_until(next) => {}
            }
            let attempt = tokio::time::timeout(self.settings.heartbeat, self.heartbeat()).await;
            next = match attempt {
                Ok(Ok(true)) => Instant::now() + self.settings.heartbeat,
                Ok(Ok(false)) => {
                    tracing::error!(
                        worker = %self.id,
                        "worker lease lost (released by another process, or run out before it was \
                         renewed): this process stops claiming and stops"
                    );
                    return;
                }
                Ok(Err(error)) => {
                    tracing::warn!(worker = %self.id, error = %error, "heartbeat failed");
                    Instant::now() + retry
                }
                Err(_) => {
                    tracing::warn!(worker = %self.id, "heartbeat timed out");
                    Instant::now() + retry
                }
            };
            let live = self.lease.is_live();
            if was_live && !live {
                tracing::error!(
                    worker = %self.id,
                    "the lease was not renewed in time: this process claims nothing and is not \
                     ready until it is"
                );
            } else if !was_live && live {
                tracing::info!(worker = %self.id, "the lease is renewed again");
            }
            was_live = live;
        }
    }

    /// The start-up sweep, then one per period, while the lease lives.
    async fn sweeps(self: Arc<Self>, pipeline: Arc<Pipeline>, shutdown: CancellationToken) {
        let lost = self.lease.lost();
        self.sweep(&pipeline).await;
        let mut period = tokio::time::interval(self.settings.sweep);
        period.tick().await;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = lost.cancelled() => return,
                _ = period.tick() => self.sweep(&pipeline).await,
            }
        }
    }

    async fn sweep(&self, pipeline: &Pipeline) {
        if !self.lease.is_live() {
            return;
        }
        // A sweep never runs into the next one's time.
        let bounds = SweepBounds {
            batch: self.settings.sweep_batch,
            rounds: self.settings.sweep_rounds,
            time: self.settings.sweep,
        };
        match pipeline.recover(bounds).await {
            Ok(RecoveryReport { taken, uncertain }) if taken > 0 => {
                tracing::info!(taken, uncertain, "recovery sweep");
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(error = %error, "recovery sweep failed"),
        }
    }

    /// Ends the lease now, so another worker can recover what is left.
    pub async fn release(&self) -> Result<(), StoreError> {
        self.store.release_worker(self.id).await
    }
}
