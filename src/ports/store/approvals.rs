//! Approvals: opened with a waiting row, decided by a human.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::StoreError;
use crate::domain::{ApprovalStatus, ReasonCode};
use crate::ports::tool::BoxFuture;

/// An `approvals` row.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRecord {
    /// The approval.
    pub id: Uuid,
    /// The tenant.
    pub tenant_id: String,
    /// The waiting invocation.
    pub invocation_id: Uuid,
    /// The tool asked about.
    pub tool_name: String,
    /// Why approval was required.
    pub reason_code: ReasonCode,
    /// Its state.
    pub status: ApprovalStatus,
    /// Who decided.
    pub approver: Option<String>,
    /// When it was opened.
    pub requested_at: DateTime<Utc>,
    /// When it was decided.
    pub decided_at: Option<DateTime<Utc>>,
}

/// The `approvals` table.
pub trait ApprovalStore: Send + Sync {
    /// An approval, within its tenant.
    fn approval<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, StoreError>>;

    /// Records a decision on a pending approval; `None` when it is not
    /// pending (decided already, or unknown).
    fn decide_approval<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        status: ApprovalStatus,
        approver: &'a str,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, StoreError>>;

    /// Records when the caller holding a pending approval stops waiting
    /// for it, and the turn it waits in; false when it is not pending.
    fn record_approval_hold<'a>(
        &'a self,
        tenant_id: &'a str,
        approval_id: Uuid,
        turn_id: Option<Uuid>,
        hold_ends_at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
}
