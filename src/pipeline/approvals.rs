//! Approval decisions, and waiting for one: a bridge call held for an
//! approval is woken by the decision itself, not by polling the store.
//!
//! A decision taken through this node wakes its waiters at once. One taken
//! on another node sharing the database is seen at the next re-check
//! ([`CROSS_NODE_RECHECK`]), since no notification crosses nodes.

use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use crate::domain::ApprovalStatus;
use crate::ports::{ApprovalRecord, ApprovalStore, Clock, StoreError};

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
