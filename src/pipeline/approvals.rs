//! Approval decisions, and waiting for one: a call held for an approval
//! (a script's on the bridge, a client's on the front door) is woken by the
//! decision itself, not by polling the store, and is held by one loop,
//! [`Approvals::call_held`], whichever edge holds it.
//!
//! A decision taken through this node wakes its waiters at once. One taken
//! on another node sharing the database is seen at the next re-check
//! ([`CROSS_NODE_RECHECK`]), since no notification crosses nodes.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{CallOutcome, CallRequest, Pipeline};
use crate::domain::ApprovalStatus;
use crate::ports::{ApprovalRecord, ApprovalStore, BoxFuture, Clock, StoreError};

/// How a call is held while its approval waits for a human.
pub struct Hold<'a> {
    /// When the hold ends, decided or not.
    pub until: Instant,
    /// The bridge turn holding it, recorded for the approver.
    pub turn_id: Option<Uuid>,
    /// How often the observer is told the call still waits.
    pub every: Duration,
    /// Cancelled when the caller takes the call back (a front door client
    /// that closed its request): the hold ends, the approval and its row
    /// stay.
    pub withdrawn: Option<CancellationToken>,
    /// Told when the call starts to wait, and every `every` after.
    pub observer: &'a (dyn HoldObserver + Sync),
}

/// What the edge holding a call says to its caller while it waits.
pub trait HoldObserver {
    /// The call waits for `approval_id`, and has waited `waited`.
    fn waiting(&self, approval_id: Uuid, waited: Duration) -> BoxFuture<'_, ()>;
}

/// What a held call came to.
#[derive(Debug)]
pub enum Held {
    /// It ended, or a control tool suspended it: what the pipeline
    /// answered once no approval held it.
    Outcome(CallOutcome),
    /// The hold ended undecided; the approval and the row stay, and the
    /// same call asked again resumes them.
    Undecided {
        /// The held row.
        invocation_id: Uuid,
        /// The approval it waits for.
        approval_id: Uuid,
    },
    /// The caller took it back while it was held.
    Withdrawn,
}

/// How often a waiter looks at the store itself, for a decision another node
/// took.
pub const CROSS_NODE_RECHECK: Duration = Duration::from_secs(2);

/// Approvals of this node.
pub struct Approvals {
    store: Arc<dyn ApprovalStore>,
    clock: Arc<dyn Clock>,
    /// Bumped on every decision this node records.
    decided: tokio::sync::watch::Sender<u64>,
}

impl Approvals {
    /// Approvals over their store.
    pub fn new(store: Arc<dyn ApprovalStore>, clock: Arc<dyn Clock>) -> Self {
        Approvals {
            store,
            clock,
            decided: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Records a decision on a pending approval and wakes whoever waits on
    /// it; `None` when it is not pending (decided already, or unknown).
    pub async fn decide(
        &self,
        tenant_id: &str,
        id: Uuid,
        status: ApprovalStatus,
        approver: &str,
    ) -> Result<Option<ApprovalRecord>, StoreError> {
        let decided = self
            .store
            .decide_approval(tenant_id, id, status, approver, self.clock.now())
            .await?;
        if decided.is_some() {
            self.decided.send_modify(|generation| *generation += 1);
        }
        Ok(decided)
    }

    /// One approval of a tenant, as recorded.
    pub async fn approval(
        &self,
        tenant_id: &str,
        id: Uuid,
    ) -> Result<Option<ApprovalRecord>, StoreError> {
        self.store.approval(tenant_id, id).await
    }

    /// Records that a caller holds the call of a pending approval for
    /// `hold` from now (in `turn_id`, when a bridge turn holds it), so an
    /// approver sees when the caller stops waiting. A record that fails is
    /// logged: the hold itself does not depend on it.
    pub async fn record_hold(
        &self,
        tenant_id: &str,
        id: Uuid,
        turn_id: Option<Uuid>,
        hold: Duration,
    ) {
        let hold = chrono::Duration::from_std(hold).unwrap_or(chrono::Duration::MAX);
        let ends_at = self.clock.now().checked_add_signed(hold);
        let Some(ends_at) = ends_at else {
            return;
        };
        if let Err(failure) = self
            .store
            .record_approval_hold(tenant_id, id, turn_id, ends_at)
            .await
        {
            tracing::warn!(error = %failure, "an approval's hold was not recorded");
        }
    }

    /// Runs `call` through `pipeline` and, while it waits for an approval,
    /// holds it as `hold` says: the hold is recorded for the approver, the
    /// observer is told, and once decided the same call is asked again
    /// (admitted past the rate limit it was already admitted by), which
    /// runs it or answers its outcome.
    pub async fn call_held(
        &self,
        pipeline: &Pipeline,
        mut call: CallRequest,
        hold: Hold<'_>,
    ) -> Held {
        let started = Instant::now();
        let withdrawn = hold.withdrawn.clone().unwrap_or_default();
        let mut outcome = pipeline.call(call.clone()).await;
        let mut recorded = None;
        while let CallOutcome::Pending {
            invocation_id,
            approval_id,
        } = outcome
        {
            if recorded != Some(approval_id) {
                self.record_hold(
                    &call.tenant_id,
                    approval_id,
                    hold.turn_id,
                    hold.until.saturating_duration_since(Instant::now()),
                )
                .await;
                recorded = Some(approval_id);
            }
            let decided = loop {
                hold.observer.waiting(approval_id, started.elapsed()).await;
                let until = hold.until.min(Instant::now() + hold.every);
                tokio::select! {
                    decided = self.wait_decided(&call.tenant_id, approval_id, until) => {
                        if decided {
                            break true;
                        }
                        if Instant::now() >= hold.until {
                            break false;
                        }
                    }
                    _ = withdrawn.cancelled() => return Held::Withdrawn,
                }
            };
            if !decided {
                return Held::Undecided {
                    invocation_id,
                    approval_id,
                };
            }
            call.caller.rate_admitted = true;
            outcome = pipeline.call(call.clone()).await;
        }
        Held::Outcome(outcome)
    }

    /// Waits until the approval is no longer pending or `until` passes;
    /// returns whether it was decided. A store that does not answer is asked
    /// again at the next re-check.
    pub async fn wait_decided(
        &self,
        tenant_id: &str,
        id: Uuid,
        until: tokio::time::Instant,
    ) -> bool {
        // Subscribed before the first look, so a decision between the look
        // and the wait still wakes it.
        let mut decisions = self.decided.subscribe();
        loop {
            match self.store.approval(tenant_id, id).await {
                Ok(approval)
                    if approval
                        .as_ref()
                        .is_none_or(|a| a.status != ApprovalStatus::Pending) =>
                {
                    return true;
                }
                Ok(_) => {}
                Err(failure) => {
                    tracing::warn!(error = %failure, "a held call could not read its approval");
                }
            }
            let recheck = tokio::time::Instant::now() + CROSS_NODE_RECHECK;
            tokio::select! {
                _ = tokio::time::sleep_until(until) => return false,
                changed = decisions.changed() => {
                    if changed.is_err() {
                        return false;
                    }
                }
                _ = tokio::time::sleep_until(recheck.min(until)) => {}
            }
        }
    }
}
