//! Deduplication on insert and the resumption of a waiting approval.

use std::sync::Arc;

use uuid::Uuid;

use super::decide::{Deduplication, deduplication};
use super::intent::RecordedAs;
use super::{Pipeline, in_progress};
use crate::domain::policy::PolicyDecision;
use crate::domain::{ApprovalStatus, ReasonCode, ToolEventKind, ToolOutcome};
use crate::pipeline::breaker;
use crate::pipeline::call::{CallOutcome, CallRequest, Finished};
use crate::pipeline::records::{ended_event, recorded, row_event, unrecorded};
use crate::pipeline::registry::RegisteredTool;
use crate::ports::{Claim, Held, InvocationRecord, StoreError, TerminalRecord};

/// How long a call whose row another worker took waits for that row's
/// outcome before it answers "in progress".
const REREAD_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl Pipeline {
    /// Deduplication on insert: the design document's five cases, as
    /// [`deduplication`] decides them.
    pub(super) async fn deduplicate(
        &self,
        request: &CallRequest,
        tool: &Arc<RegisteredTool>,
        row: InvocationRecord,
        arguments_hash: &str,
        decision: PolicyDecision,
    ) -> Result<CallOutcome, StoreError> {
        let case = deduplication(
            &row,
            &request.principal.id,
            arguments_hash,
            request.recovering,
        );
        match case {
            Deduplication::Conflict => {
                self.record_conflict(
                    request,
                    RecordedAs::of(&tool.spec),
                    &row.identity.arguments,
                    arguments_hash,
                )
                .await
            }
            Deduplication::Suspended(suspension) => Ok(CallOutcome::Suspended {
                invocation_id: row.identity.id,
                kind: suspension.kind,
                reference: suspension.reference.clone(),
            }),
            Deduplication::Recorded => Ok(recorded(&row)),
            Deduplication::ResumeApproval(approval_id) => {
                self.resume_approval(request, tool, &row, approval_id, decision)
                    .await
            }
            Deduplication::Recover(fence) => {
                self.recover_row(request, tool, Held { row, fence }, decision)
                    .await
            }
            Deduplication::TakeOver => {
                let claim = Claim {
                    worker_id: self.lease.worker_id(),
                    now: self.clock.now(),
                };
                match self
                    .invocations
                    .take_over(&request.tenant_id, row.identity.id, claim)
                    .await?
                {
                    Some(taken) => self.recover_row(request, tool, taken, decision).await,
                    None => Ok(in_progress(&tool.spec.name)),
                }
            }
        }
    }

    /// Case 5: a waiting row's approval, decided or not.
    pub(super) async fn resume_approval(
        &self,
        request: &CallRequest,
        tool: &Arc<RegisteredTool>,
        row: &InvocationRecord,
        approval_id: Uuid,
        decision: PolicyDecision,
    ) -> Result<CallOutcome, StoreError> {
        let approval = self
            .approvals
            .approval(&request.tenant_id, approval_id)
            .await?;
        let status = approval
            .map(|a| a.status)
            .unwrap_or(ApprovalStatus::Expired);
        let now = self.clock.now();
        let end = |code: ReasonCode| {
            (
                TerminalRecord::without_result(code),
                [ended_event(row, code)],
            )
        };
        match (status, decision) {
            (ApprovalStatus::Pending, _) => Ok(CallOutcome::Pending {
                invocation_id: row.identity.id,
                approval_id,
            }),
            // Resumed at step 6: the decision just made stands unless it
            // only asked for the approval that was given.
            (ApprovalStatus::Approved, PolicyDecision::Deny(code)) => {
                let (terminal, events) = end(code);
                self.invocations
                    .settle_waiting(&request.tenant_id, row.identity.id, &terminal, &events, now)
                    .await?;
                self.reread(request, row.identity.id).await
            }
            // Approved, but an earlier step has since left the run
            // synthesis-only: it answers instead.
            (ApprovalStatus::Approved, _) if self.synthesis_only_for(row).await? => {
                let (terminal, events) = end(ReasonCode::ToolLoopDetected);
                self.invocations
                    .settle_waiting(&request.tenant_id, row.identity.id, &terminal, &events, now)
                    .await?;
                self.reread(request, row.identity.id).await
            }
            (ApprovalStatus::Approved, _) => {
                let claim = Claim {
                    worker_id: self.lease.worker_id(),
                    now,
                };
                let events = [row_event(row, ToolEventKind::Authorized)];
                match self
                    .invocations
                    .authorize_waiting(&request.tenant_id, row.identity.id, claim, &events)
                    .await?
                {
                    Some(authorized) => self.claim_then_run(request, tool, authorized).await,
                    None => self.reread(request, row.identity.id).await,
                }
            }
            (ApprovalStatus::Denied | ApprovalStatus::Expired, _) => {
                let code = if status == ApprovalStatus::Denied {
                    ReasonCode::PolicyApprovalDenied
                } else {
                    ReasonCode::PolicyApprovalExpired
                };
                let (terminal, events) = end(code);
                self.invocations
                    .settle_waiting(&request.tenant_id, row.identity.id, &terminal, &events, now)
                    .await?;
                self.reread(request, row.identity.id).await
            }
        }
    }

    /// What the row says, after another writer moved it: its outcome once
    /// it has one (waited for a little, as its new owner may be settling
    /// it), else "in progress", which the same call asked again resolves.
    pub(super) async fn reread(
        &self,
        request: &CallRequest,
        id: Uuid,
    ) -> Result<CallOutcome, StoreError> {
        let deadline = tokio::time::Instant::now() + REREAD_WAIT;
        let mut wait = std::time::Duration::from_millis(20);
        let mut row = self.invocations.invocation(&request.tenant_id, id).await?;
        while row.as_ref().is_some_and(|row| !row.status().is_terminal())
            && tokio::time::Instant::now() + wait < deadline
        {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(std::time::Duration::from_millis(250));
            row = self.invocations.invocation(&request.tenant_id, id).await?;
        }
        match row {
            Some(row) if row.status().is_terminal() => Ok(recorded(&row)),
            Some(row) => Ok(CallOutcome::Finished(Finished {
                invocation_id: Some(row.identity.id),
                outcome: ToolOutcome::not_succeeded(
                    row.identity.tool_name.clone(),
                    ReasonCode::ToolConcurrencyConflict,
                ),
                content: Vec::new(),
                data: None,
                synthesis_only: false,
                retry_after_seconds: None,
                consent: None,
            })),
            None => Ok(unrecorded(
                request.name.clone(),
                ReasonCode::ToolInternalError,
            )),
        }
    }

    /// Whether the run is synthesis-only for `row`'s step.
    async fn synthesis_only_for(&self, row: &InvocationRecord) -> Result<bool, StoreError> {
        let tally = self
            .invocations
            .breaker_tally(
                &row.identity.tenant_id,
                row.identity.run_id,
                &row.identity.tool_name,
                &row.identity.arguments_hash,
            )
            .await?;
        Ok(breaker::synthesis_only_at(&tally, row.identity.step_number))
    }

    pub(super) async fn approved(&self, row: &InvocationRecord) -> Result<bool, StoreError> {
        let Some(approval_id) = row.approval_id else {
            return Ok(false);
        };
        let approval = self
            .approvals
            .approval(&row.identity.tenant_id, approval_id)
            .await?;
        Ok(approval.is_some_and(|a| a.status == ApprovalStatus::Approved))
    }
}
