//! This process as a worker: its lease, the heartbeat that keeps it, and
//! the recovery sweep that runs at start-up and on a period.
//!
//! The lease is renewed on a task of its own (and, on PostgreSQL, a
//! connection of its own), so no sweep, discovery or slow call can starve
//! it. Every lease is judged by the store's clock; this process only keeps a
//! conservative local view of it ([`Lease`]): live until one heartbeat
//! before the store's expiry could fall, counted from when the renewal was
//! sent. A process whose lease is not live claims nothing and is not ready.
//! One whose lease was lost (released, or run out before it was renewed, as
//! a store outage or a pause past the lease makes it) registers a new
//! incarnation of its node as soon as the store answers: a new worker id,
//! so its old claims are fenced as a restart's would be, and recovery
//! settles them. Only a node whose identity another place holds (a copied
//! node folder) stops for good, and the composition root drains it.

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

/// This process's view of its lease: which worker holds it (the node's
/// current incarnation) and until when.
#[derive(Debug)]
pub struct Lease {
    held: Mutex<Held>,
    lost: CancellationToken,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    worker_id: Uuid,
    /// Until when (monotonic) the lease certainly holds, less a heartbeat.
    valid_until: Instant,
}

impl Lease {
    /// `worker_id`'s lease, known to hold until `valid_until`.
    pub fn until(worker_id: Uuid, valid_until: Instant) -> Lease {
        Lease {
            held: Mutex::new(Held {
                worker_id,
                valid_until,
            }),
            lost: CancellationToken::new(),
        }
    }

    /// Whether this process may claim rows and serve calls now.
    pub fn is_live(&self) -> bool {
        !self.lost.is_cancelled() && Instant::now() < self.held().valid_until
    }

    /// The worker new claims are made under: the node's current
    /// incarnation.
    pub fn worker_id(&self) -> Uuid {
        self.held().worker_id
    }

    /// Fires once the lease is lost for good: the node's identity is held
    /// from another place.
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    fn held(&self) -> Held {
        *self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn extend(&self, worker_id: Uuid, valid_until: Instant) {
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // A renewal sent by an incarnation already replaced extends nothing.
        if held.worker_id == worker_id {
            held.valid_until = held.valid_until.max(valid_until);
        }
    }

    /// A new incarnation holds the lease from now on.
    fn pass_to(&self, worker_id: Uuid, valid_until: Instant) {
        *self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Held {
            worker_id,
            valid_until,
        };
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

/// A registered worker: the node's current incarnation, and the next
/// ones when a lease is lost.
pub struct Worker {
    place: NodePlace,
    store: Arc<dyn WorkerStore>,
    clock: Arc<dyn Clock>,
    settings: WorkerSettings,
    lease: Arc<Lease>,
    /// Told when a new incarnation holds the lease, so recovery settles
    /// what the old one held at once.
    incarnated: tokio::sync::Notify,
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
        let (id, valid_until) = incarnate(store.as_ref(), clock.as_ref(), place, settings).await?;
        Ok(Worker {
            place: place.clone(),
            store,
            clock,
            settings,
            lease: Arc::new(Lease::until(id, valid_until)),
            incarnated: tokio::sync::Notify::new(),
        })
    }

    /// The current incarnation's worker id, which the pipeline claims rows
    /// under.
    pub fn id(&self) -> Uuid {
        self.lease.worker_id()
    }

    /// This process's view of the lease, which the pipeline and readiness
    /// read.
    pub fn lease(&self) -> Arc<Lease> {
        self.lease.clone()
    }

    /// Renews the lease once: `false` when it was lost (and the worker must
    /// not claim under it again). A renewal that fails leaves the view as it
    /// was.
    pub async fn heartbeat(&self) -> Result<bool, StoreError> {
        let sent = Instant::now();
        let id = self.lease.worker_id();
        match self.store.heartbeat(id, self.settings.lease).await? {
            Renewal::Renewed { store_now } => {
                self.lease.extend(
                    id,
                    sent + self.settings.lease.saturating_sub(self.settings.heartbeat),
                );
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
            Renewal::Lost => Ok(false),
        }
    }

    /// Registers the node's next incarnation after its lease was lost: the
    /// old worker is released (its claims fenced, its rows recoverable) and
    /// the new one holds the lease. Refused, and the lease lost for good,
    /// when another place holds the node now.
    pub async fn incarnate_again(&self) -> Result<(), WorkerError> {
        match incarnate(
            self.store.as_ref(),
            self.clock.as_ref(),
            &self.place,
            self.settings,
        )
        .await
        {
            Ok((id, valid_until)) => {
                self.lease.pass_to(id, valid_until);
                self.incarnated.notify_one();
                Ok(())
            }
            Err(error @ WorkerError::NodeHeldElsewhere { .. }) => {
                self.lease.lose();
                Err(error)
            }
            Err(error) => Err(error),
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
        let mut state = LeaseState::Renewing;
        let mut was_live = true;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep_until(next) => {}
            }
            let attempt = tokio::time::timeout(self.settings.heartbeat, self.renew()).await;
            let now = match attempt {
                Ok(Ok(renewed)) => renewed,
                Ok(Err(Refusal::HeldElsewhere(error))) => {
                    tracing::error!(
                        error = %error,
                        "this node's lease is lost for good: this process claims nothing and stops"
                    );
                    return;
                }
                Ok(Err(Refusal::Failed(error))) => LeaseState::Failing(error),
                Err(_) => LeaseState::Failing("the store did not answer in time".into()),
            };
            next = Instant::now()
                + match now {
                    LeaseState::Failing(_) => retry,
                    _ => self.settings.heartbeat,
                };
            // Said once per change of state, never once a retry.
            let live = self.lease.is_live();
            match (&state, &now) {
                (LeaseState::Failing(_), LeaseState::Failing(_)) => {}
                (_, LeaseState::Failing(error)) => tracing::warn!(
                    worker = %self.lease.worker_id(),
                    error = %error,
                    live,
                    "the lease cannot be renewed; calls are refused (retryable) once it is not live, \
                     and this process serves again when the store answers"
                ),
                (_, LeaseState::Incarnated) => tracing::warn!(
                    worker = %self.lease.worker_id(),
                    "the lease had ended (a store outage or a pause outlasted it): this node \
                     serves again as a new worker; recovery settles what the old one held"
                ),
                (LeaseState::Failing(_), LeaseState::Renewing) => {
                    tracing::info!(worker = %self.lease.worker_id(), "the lease is renewed again")
                }
                (_, LeaseState::Renewing) => {}
            }
            if was_live && !live {
                tracing::error!(
                    worker = %self.lease.worker_id(),
                    "the lease was not renewed in time: this process claims nothing and is not \
                     ready until the store answers"
                );
            }
            was_live = live;
            state = now;
        }
    }

    /// One renewal, or a new incarnation when the lease had ended.
    async fn renew(&self) -> Result<LeaseState, Refusal> {
        match self.heartbeat().await {
            Ok(true) => Ok(LeaseState::Renewing),
            Ok(false) => match self.incarnate_again().await {
                Ok(()) => Ok(LeaseState::Incarnated),
                Err(error @ WorkerError::NodeHeldElsewhere { .. }) => {
                    Err(Refusal::HeldElsewhere(error))
                }
                Err(error) => Err(Refusal::Failed(error.to_string())),
            },
            Err(error) => Err(Refusal::Failed(error.to_string())),
        }
    }

    /// The start-up sweep, then one per period and one as each new
    /// incarnation begins, until the lease is lost for good.
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
                _ = self.incarnated.notified() => self.sweep(&pipeline).await,
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
        self.store.release_worker(self.lease.worker_id()).await
    }
}

/// Where the lease stands after a renewal.
enum LeaseState {
    /// Renewed.
    Renewing,
    /// It had ended; a new incarnation holds the lease now.
    Incarnated,
    /// Neither: the store failed or did not answer.
    Failing(String),
}

/// Why a renewal did not renew.
enum Refusal {
    /// Another place holds the node: this process stops for good.
    HeldElsewhere(WorkerError),
    /// The store failed; the next retry may succeed.
    Failed(String),
}

/// Registers a new worker on `place` after checking this host's clock
/// against the store's: its id, and until when its first lease certainly
/// holds.
async fn incarnate(
    store: &dyn WorkerStore,
    clock: &dyn Clock,
    place: &NodePlace,
    settings: WorkerSettings,
) -> Result<(Uuid, Instant), WorkerError> {
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
                    "leases of this node's earlier workers released; their calls recover now"
                );
            }
        }
    }
    Ok((id, sent + settings.lease.saturating_sub(settings.heartbeat)))
}
