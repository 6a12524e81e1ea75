//! Refusals before step 8 and conflicts, each recorded as a terminal row.

use std::sync::Arc;

use serde_json::{Value, json};

use super::decide::ending_code;
use super::intent::{Intent, RecordedAs};
use super::{Pipeline, in_progress};
use crate::domain::names::bounded_name;
use crate::domain::{
    ApprovalStatus, Durability, ReasonCode, ToolKind, ToolOutcomeStatus, TrustLevel, canonicalize,
    sha256_hex,
};
use crate::pipeline::breaker;
use crate::pipeline::call::{CallOutcome, CallRequest, TOOL_CALL};
use crate::pipeline::output::RenderedPart;
use crate::pipeline::records::{ended_event, recorded, terminal_event_kind};
use crate::pipeline::registry::RegisteredTool;
use crate::ports::{
    Claim, Held, InsertOutcome, InvocationState, Start, StoreError, TerminalRecord,
};

/// Who an approval is recorded as expired by when its call was refused
/// before anyone decided it.
const REFUSED_APPROVER: &str = "toolgate";

/// The version tag of the key a recorded conflict is stored under.
const CONFLICT_KEY_TAG: &str = "veetbot.tool.v1.conflict";

impl Pipeline {
    /// ADR-0123: a `tool.call` is checked against its own schema, the tool
    /// it names must be pinned and must not be a control tool, and the call
    /// continues as that tool with the model's call id. Refusals are
    /// recorded under tool.call's name.
    pub(super) async fn unwrap_tool_call(
        &self,
        request: &CallRequest,
    ) -> Result<Unwrap, StoreError> {
        let Some(wrapper) = request
            .pinned
            .resolve(&request.name)
            .filter(|pinned| pinned.tool.spec.name == TOOL_CALL)
            .map(|pinned| pinned.tool.clone())
        else {
            return Ok(Unwrap::Plain);
        };
        let Ok(canonical) = wrapper.input.validate(request.arguments.clone()) else {
            let detail = vec![RenderedPart::Text {
                text: "tool.call takes {\"name\": string, \"arguments\": object}".to_owned(),
                trust: TrustLevel::Platform,
            }];
            let outcome = self
                .refuse(
                    request,
                    &wrapper,
                    ReasonCode::ToolArgumentsInvalid,
                    Some(detail),
                    None,
                )
                .await?;
            return Ok(Unwrap::Refused(outcome));
        };
        let name = canonical
            .value
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let offered = request
            .pinned
            .resolve(&name)
            .is_some_and(|pinned| pinned.tool.spec.kind != ToolKind::Control);
        if !offered {
            let outcome = self
                .refuse(
                    request,
                    &wrapper,
                    ReasonCode::ToolNotFoundNotOffered,
                    None,
                    Some((&canonical.value, &canonical.sha256)),
                )
                .await?;
            return Ok(Unwrap::Refused(outcome));
        }
        let mut inner = request.clone();
        inner.name = name;
        inner.arguments = canonical
            .value
            .get("arguments")
            .cloned()
            .unwrap_or_else(|| json!({}));
        Ok(Unwrap::Into(Box::new(inner)))
    }

    pub(super) async fn refuse(
        &self,
        request: &CallRequest,
        tool: &Arc<RegisteredTool>,
        code: ReasonCode,
        detail: Option<Vec<RenderedPart>>,
        canonical: Option<(&Value, &str)>,
    ) -> Result<CallOutcome, StoreError> {
        self.record_refusal(request, RecordedAs::of(&tool.spec), code, detail, canonical)
            .await
    }

    pub(super) async fn refuse_unresolved(
        &self,
        request: &CallRequest,
    ) -> Result<CallOutcome, StoreError> {
        // No spec: the most restrictive classification stands in, and the
        // caller's name is recorded bounded (it is anyone's text).
        let name = bounded_name(&request.name);
        self.record_refusal(
            request,
            RecordedAs::unresolved(&name),
            ReasonCode::PolicyMatrixUnknownTool,
            None,
            None,
        )
        .await
    }

    /// A denial or pipeline failure before step 8, recorded as a terminal
    /// row so the step's batch is complete and a replay finds it.
    async fn record_refusal(
        &self,
        request: &CallRequest,
        call: RecordedAs<'_>,
        code: ReasonCode,
        detail: Option<Vec<RenderedPart>>,
        validated: Option<(&Value, &str)>,
    ) -> Result<CallOutcome, StoreError> {
        if request.withdrawn() {
            return Ok(CallOutcome::Withdrawn);
        }
        // A call refused after validation is identified as the validated
        // call is (defaults applied); one refused before may have no
        // canonical form, and its raw hash still identifies it.
        let (arguments, arguments_hash) = match validated.map(|(v, h)| (v.clone(), h.to_owned())) {
            Some(validated) => validated,
            None => match canonicalize(request.arguments.clone()) {
                Ok(canonical) => (canonical.value, canonical.sha256),
                Err(_) => (
                    request.arguments.clone(),
                    sha256_hex(request.arguments.to_string().as_bytes()),
                ),
            },
        };
        let intent = Intent::new(request, call, arguments, arguments_hash, self.clock.now());
        // Every identical denial counts toward the run's breaker, wherever
        // in steps 1 to 6 it was decided.
        let code = if code.status() == ToolOutcomeStatus::Denied {
            let tally = self
                .invocations
                .breaker_tally(
                    &request.tenant_id,
                    request.run_id,
                    &intent.identity.tool_name,
                    &intent.identity.arguments_hash,
                )
                .await?;
            breaker::denial(&tally, code)
        } else {
            code
        };
        let row = match self.insert_ended(&intent, code).await? {
            InsertOutcome::Inserted(row) => row,
            // A refusal whose identity another principal's row holds is that
            // conflict, not the other row.
            InsertOutcome::Existing(row) if row.identity.principal.id != request.principal.id => {
                return self
                    .record_conflict(
                        request,
                        intent.call.clone(),
                        &intent.identity.arguments,
                        &intent.identity.arguments_hash,
                    )
                    .await;
            }
            InsertOutcome::Existing(row) => row,
        };
        if let InvocationState::Waiting { approval_id } = row.state {
            // The same call, waiting for its approval, is refused before
            // dispatch now: it ends so, and its approval is no one's to
            // decide any more.
            let now = self.clock.now();
            let terminal = TerminalRecord::without_result(code);
            self.invocations
                .settle_waiting(
                    &row.identity.tenant_id,
                    row.identity.id,
                    &terminal,
                    &[ended_event(&row, code)],
                    now,
                )
                .await?;
            self.approvals
                .decide_approval(
                    &row.identity.tenant_id,
                    approval_id,
                    ApprovalStatus::Expired,
                    REFUSED_APPROVER,
                    now,
                )
                .await?;
            return self.reread(request, row.identity.id).await;
        }
        if !row.status().is_terminal() {
            // Recovery re-checked authority and was refused: the row it holds
            // ends here, uncertain if its effect may have escaped.
            if let Some(fence) = request
                .recovering
                .filter(|fence| row.fence() == Some(*fence))
            {
                let code = ending_code(&row, code);
                return self.end_held(&Held { row, fence }, code).await;
            }
            return Ok(in_progress(&intent.identity.tool_name));
        }
        let mut outcome = recorded(&row);
        if let (CallOutcome::Finished(finished), Some(detail), true) =
            (&mut outcome, detail, row.identity.id == intent.identity.id)
        {
            finished.content = detail;
        }
        Ok(outcome)
    }

    /// Inserts `intent` ended with `code` before it ran, or finds the row its
    /// key already has. Its one event is its end: proposed and refused in one
    /// commit, a proposal event would say nothing the end does not.
    async fn insert_ended(
        &self,
        intent: &Intent<'_>,
        code: ReasonCode,
    ) -> Result<InsertOutcome, StoreError> {
        let status = code.status();
        let new = intent.row(Start::Ended(code), Durability::Flushed);
        let mut ended = intent.event(terminal_event_kind(status));
        ended.outcome_status = Some(status);
        ended.reason_code = Some(code);
        let events = [ended];
        let claim = Claim {
            worker_id: self.lease.worker_id(),
            now: self.clock.now(),
        };
        self.invocations
            .insert_invocation(&new, claim, &events)
            .await
    }

    /// A call whose idempotency key another principal's row of the tenant
    /// holds (keys are unique per tenant, so another tenant's never does):
    /// that row is never this call's answer. The conflict is recorded as a
    /// terminal row of its own, under a key derived from the call's key and
    /// who submitted it (so a repeated submission finds the same conflict),
    /// and its outcome is returned.
    pub(super) async fn record_conflict(
        &self,
        request: &CallRequest,
        call: RecordedAs<'_>,
        arguments: &Value,
        arguments_hash: &str,
    ) -> Result<CallOutcome, StoreError> {
        if request.withdrawn() {
            return Ok(CallOutcome::Withdrawn);
        }
        let mut intent = Intent::new(
            request,
            call,
            arguments.clone(),
            arguments_hash.to_owned(),
            self.clock.now(),
        );
        intent.identity.idempotency_key = sha256_hex(
            format!(
                "{CONFLICT_KEY_TAG}\0{}\0{}\0{}",
                intent.identity.idempotency_key, request.tenant_id, request.principal.id
            )
            .as_bytes(),
        );
        Ok(
            match self
                .insert_ended(&intent, ReasonCode::ToolIdempotencyConflict)
                .await?
            {
                InsertOutcome::Inserted(row) | InsertOutcome::Existing(row) => recorded(&row),
            },
        )
    }
}

/// What `tool.call` unwrapping decided.
pub(super) enum Unwrap {
    /// Not a tool.call.
    Plain,
    /// The call, as the tool it names.
    Into(Box<CallRequest>),
    /// The wrapper was refused; this is the recorded outcome.
    Refused(CallOutcome),
}
