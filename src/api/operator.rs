//! The operator's reads of one record and decisions: an invocation with its
//! events, a run's rows, deciding approvals, resolving review items, and
//! completing a suspended control tool. A decision names its tenant.

use hyper::StatusCode;
use serde_json::{Value, json};

use super::listen::Routed;
use super::lists::event_view;
use super::wire::{
    ApprovalDecision, CompleteSuspended, ReviewDecision, invocation_view, rendered_content,
};
use super::{ApiError, ControlApi};
use crate::domain::names::UPDATE_WORKING_STATE;
use crate::domain::{ApprovalStatus, valid_identifier};
use crate::edge::{Reply, reply};
use crate::pipeline::Completion;
use crate::ports::ReviewRecord;

/// The longest note a reviewer may leave.
const MAXIMUM_NOTE_BYTES: usize = 4096;

impl ControlApi {
    pub(super) async fn decide(&self, id: &str, routed: Routed) -> Result<Reply, ApiError> {
        let (tenant, id) = routed.query.tenant_and_id(id)?.ok_or(ApiError::NotFound)?;
        let decision: ApprovalDecision = self.body(routed.request).await?;
        if !valid_identifier(&decision.approver) {
            return Err(ApiError::Invalid(
                "approver must be 1 to 256 bytes without control characters".into(),
            ));
        }
        let status = match decision.decision.as_str() {
            "approve" => ApprovalStatus::Approved,
            "deny" => ApprovalStatus::Denied,
            _ => return Err(ApiError::Invalid("decision must be approve or deny".into())),
        };
        let approval = self
            .parts
            .approvals
            .decide(&tenant, id, status, &decision.approver)
            .await?
            .ok_or(ApiError::Conflict {
                code: "not_pending",
                message: "no pending approval has this id",
            })?;
        Ok(reply(
            StatusCode::OK,
            &json!({"approval_id": approval.id, "status": approval.status}),
        ))
    }

    /// `GET /v1/invocations/{id}`: the row and its events. Without
    /// `tenant_id` the operator's read of any tenant's row; with it, only
    /// that tenant's.
    pub(super) async fn invocation(&self, id: &str, routed: Routed) -> Result<Reply, ApiError> {
        let tenant = routed.query.optional_tenant()?;
        let id: uuid::Uuid = id.parse().map_err(|_| ApiError::NotFound)?;
        let story = self
            .parts
            .operator
            .invocation_with_events(id)
            .await?
            .filter(|story| {
                tenant
                    .as_ref()
                    .is_none_or(|tenant| *tenant == story.invocation.identity.tenant_id)
            })
            .ok_or(ApiError::NotFound)?;
        let mut view = invocation_view(&story.invocation);
        view["events"] = story.events.iter().map(event_view).collect();
        Ok(reply(StatusCode::OK, &view))
    }

    /// `GET /v1/artifacts/{id}?tenant_id=`: the bytes, streamed, when the
    /// artifact is that tenant's.
    pub(super) async fn artifact(&self, id: &str, routed: Routed) -> Result<Reply, ApiError> {
        let (tenant, id) = routed.query.tenant_and_id(id)?.ok_or(ApiError::NotFound)?;
        let open = self
            .parts
            .artifacts
            .open(&tenant, id)
            .await?
            .ok_or(ApiError::NotFound)?;
        Ok(crate::edge::artifact_reply(open))
    }

    pub(super) async fn run(&self, id: &str, routed: Routed) -> Result<Reply, ApiError> {
        let (tenant, id) = routed.query.tenant_and_id(id)?.ok_or(ApiError::NotFound)?;
        let rows = self.parts.invocations.run_invocations(&tenant, id).await?;
        let views: Vec<Value> = rows.iter().map(invocation_view).collect();
        Ok(reply(StatusCode::OK, &json!({"invocations": views})))
    }

    /// `GET /v1/runs/{id}/working_state?tenant_id=`: the state the run's
    /// latest succeeded `context.update_working_state` recorded, or null.
    pub(super) async fn working_state(&self, id: &str, routed: Routed) -> Result<Reply, ApiError> {
        let (tenant, id) = routed.query.tenant_and_id(id)?.ok_or(ApiError::NotFound)?;
        let latest = self
            .parts
            .invocations
            .latest_succeeded(&tenant, id, UPDATE_WORKING_STATE)
            .await?;
        let latest = latest.as_ref();
        Ok(reply(
            StatusCode::OK,
            &json!({
                "run_id": id,
                "working_state": latest.and_then(|row| row.identity.arguments.get("state")),
                "invocation_id": latest.map(|row| row.identity.id),
                "step_number": latest.map(|row| row.identity.step_number),
                "updated_at": latest.and_then(|row| row.ended()).map(|ended| ended.completed_at),
            }),
        ))
    }

    pub(super) async fn complete(&self, id: &str, routed: Routed) -> Result<Reply, ApiError> {
        let (tenant, id) = routed.query.tenant_and_id(id)?.ok_or(ApiError::NotFound)?;
        let body: CompleteSuspended = self.body(routed.request).await?;
        let completion = match (body.outcome.as_str(), body.text) {
            ("answered", Some(text)) => Completion::Answered { text },
            ("run_cancelled", None) => Completion::RunCancelled,
            _ => {
                return Err(ApiError::Invalid(
                    "outcome must be answered (with text) or run_cancelled (without)".into(),
                ));
            }
        };
        let finished = self
            .parts
            .pipeline
            .complete_suspended(&tenant, id, completion)
            .await?
            .ok_or(ApiError::Conflict {
                code: "not_suspended",
                message: "no suspended invocation has this id",
            })?;
        Ok(reply(
            StatusCode::OK,
            &json!({
                "invocation_id": id,
                "outcome": finished.outcome,
                "content": rendered_content(&finished.content),
            }),
        ))
    }

    pub(super) async fn resolve(&self, id: &str, routed: Routed) -> Result<Reply, ApiError> {
        let (tenant, invocation_id) = routed.query.tenant_and_id(id)?.ok_or(ApiError::NotFound)?;
        let decision: ReviewDecision = self.body(routed.request).await?;
        if !valid_identifier(&decision.resolver)
            || decision
                .note
                .as_ref()
                .is_some_and(|note| note.len() > MAXIMUM_NOTE_BYTES)
        {
            return Err(ApiError::Invalid(
                "resolver must be 1 to 256 bytes without control characters, a note at most 4 KiB"
                    .into(),
            ));
        }
        let review = ReviewRecord {
            invocation_id,
            resolution: decision.resolution,
            resolver: decision.resolver,
            note: decision.note,
            resolved_at: self.parts.clock.now(),
        };
        let recorded = self.parts.reviews.resolve_review(&tenant, &review).await?;
        if !recorded {
            return Err(ApiError::Conflict {
                code: "not_in_review",
                message: "no unresolved uncertain invocation has this id",
            });
        }
        Ok(reply(
            StatusCode::OK,
            &json!({"invocation_id": invocation_id, "resolution": review.resolution}),
        ))
    }
}
