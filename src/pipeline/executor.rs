//! The one pipeline function: every call, from every entry point, runs
//! through [`Pipeline::call`]. Fourteen steps in the design document's order,
//! with its four commits (intent, claim, result, and the watermark between),
//! and no transaction open across tool I/O.
//!
//! Recovery re-enters the same function with the row it took over, so
//! authority is re-checked by steps 1 to 6 and the recovery table is applied
//! where deduplication meets the row.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{Value, json};
use uuid::Uuid;

use super::breaker;
use super::call::{
    CallOutcome, CallRequest, CallerTerms, Completion, DataArtifact, DataPart, Finished,
    PipelineSettings, Point, RecoveryReport, ResultData, SUSPENDING, StepObserver, TOOL_CALL,
};
use super::guard::{Contained, RecordingResolver, StoreWatermark, contain, system_time};
use super::output::{self, Attribution, RenderedPart};
use super::preparation::register_discoveries;
use super::records::{
    Identity, content_text, denied_event, ended_event, nonce, recorded, render_text, row_event,
    terminal_event_kind, unrecorded,
};
use super::registry::{RegisteredTool, ToolRegistry};
use super::settlement::{Settlement, Settler};
use super::worker::Lease;
use crate::domain::names::bounded_name;
use crate::domain::policy::{PolicyDecision, ProposedAction};
use crate::domain::recovery::{self, RecoveryDecision, UnwrittenEnd};
use crate::domain::{
    AgentSpec, ApprovalStatus, ArgumentTrust, ContentPart, Durability, IdempotencyClass,
    InvocationStatus, ReasonCode, SecretValue, SideEffectClass, ToolEventKind, ToolFailure,
    ToolFailureKind, ToolKind, ToolOutcome, ToolOutcomeStatus, ToolResult, ToolSource, ToolSpec,
    TrustLevel, canonicalize, idempotency_key, sha256_hex,
};
use crate::ports::{
    ApprovalStore, ArtifactStore, BreakerTally, CancellationToken, Claim, Clock,
    CredentialResolver, ExecutionTarget, Fence, InsertOutcome, InvocationRecord, InvocationStore,
    McpServers, NewInvocation, PlatformEvent, PolicyEngine, StoreError, StoredArtifact,
    TerminalRecord, ToolExecutionContext,
};

/// The version tag of the key a recorded conflict is stored under.
const CONFLICT_KEY_TAG: &str = "veetbot.tool.v1.conflict";

/// What an excerpted result's whole is stored as.
const ARTIFACT_MEDIA_TYPE: &str = "text/plain; charset=utf-8";

/// How long a call whose row another worker took waits for that row's
/// outcome before it answers "in progress".
const REREAD_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The executor and what it stands on.
pub struct Pipeline {
    registry: Arc<ToolRegistry>,
    invocations: Arc<dyn InvocationStore>,
    approvals: Arc<dyn ApprovalStore>,
    policy: Arc<dyn PolicyEngine>,
    artifacts: Arc<dyn ArtifactStore>,
    credentials: Arc<dyn CredentialResolver>,
    clock: Arc<dyn Clock>,
    observer: Arc<dyn StepObserver>,
    mcp: Option<Arc<dyn McpServers>>,
    worker_id: Uuid,
    lease: Arc<Lease>,
    settler: Settler,
    settings: PipelineSettings,
}

/// The parts of a pipeline, as the composition root wires them.
pub struct PipelineParts {
    /// Resolution and specs.
    pub registry: Arc<ToolRegistry>,
    /// The invocation rows the four commits write.
    pub invocations: Arc<dyn InvocationStore>,
    /// Approvals, read when a waiting call resumes.
    pub approvals: Arc<dyn ApprovalStore>,
    /// Step 6.
    pub policy: Arc<dyn PolicyEngine>,
    /// Step 12's writer factory.
    pub artifacts: Arc<dyn ArtifactStore>,
    /// What tools resolve references with.
    pub credentials: Arc<dyn CredentialResolver>,
    /// Now.
    pub clock: Arc<dyn Clock>,
    /// Watches the steps.
    pub observer: Arc<dyn StepObserver>,
    /// The MCP servers recovery prepares, to re-run an MCP call whose tool
    /// no session has registered since the start; `None` without any.
    pub mcp: Option<Arc<dyn McpServers>>,
    /// This process's worker (registered with a lease).
    pub worker_id: Uuid,
    /// That worker's lease as this process sees it: nothing is claimed
    /// while it is not live.
    pub lease: Arc<Lease>,
    /// Settings.
    pub settings: PipelineSettings,
}

/// What step 10 did before its result is settled: whether the tool ran
/// (with the writer its artifacts go to and how long it took), and whether
/// the effect watermark is set.
struct Attempt {
    executed: Option<(Arc<dyn crate::ports::ArtifactWriter>, i64)>,
    effect_sent: bool,
}

/// How step 10 ended.
enum Execution {
    Returned(ToolResult),
    TimedOut,
    Panicked,
}

impl Pipeline {
    /// A pipeline over its parts.
    pub fn new(parts: PipelineParts) -> Self {
        Pipeline {
            registry: parts.registry,
            invocations: parts.invocations.clone(),
            approvals: parts.approvals,
            policy: parts.policy,
            artifacts: parts.artifacts,
            credentials: parts.credentials,
            clock: parts.clock,
            observer: parts.observer,
            mcp: parts.mcp,
            worker_id: parts.worker_id,
            lease: parts.lease,
            settler: Settler::new(parts.invocations.clone()),
            settings: parts.settings,
        }
    }

    /// The resumption path of a suspended control tool: completes the row
    /// with the user's reply or the child run's result (a child's output is
    /// a model's, so EXTERNAL_UNTRUSTED and enveloped), or ends it failed
    /// with `tool.run_cancelled`. `None` when the row is not a suspended
    /// call of this tenant (already completed, or never suspended).
    pub async fn complete_suspended(
        &self,
        tenant_id: &str,
        invocation_id: Uuid,
        completion: Completion,
    ) -> Result<Option<Finished>, StoreError> {
        let Some(row) = self
            .invocations
            .invocation(tenant_id, invocation_id)
            .await?
        else {
            return Ok(None);
        };
        let Some(kind) = row.suspended_kind.clone() else {
            return Ok(None);
        };
        if row.status != InvocationStatus::Running {
            return Ok(None);
        }
        let (terminal, outcome, content, data, event) = match completion {
            Completion::Answered { text } => {
                let trust = if kind == "user_input" {
                    TrustLevel::User
                } else {
                    TrustLevel::ExternalUntrusted
                };
                let data = ResultData {
                    content: vec![DataPart::Text {
                        text: text.clone(),
                        trust,
                    }],
                    structured: None,
                    artifacts: Vec::new(),
                };
                let text = if trust < TrustLevel::InternalTool {
                    let attribution = Attribution {
                        source: row.tool_source,
                        tool: &row.tool_name,
                    };
                    output::envelope(&text, &attribution, &nonce())
                } else {
                    text
                };
                let output_bytes = i64::try_from(text.len()).unwrap_or(i64::MAX);
                let content = vec![RenderedPart::Text { text, trust }];
                let terminal = TerminalRecord {
                    status: InvocationStatus::Succeeded,
                    outcome_status: ToolOutcomeStatus::Succeeded,
                    reason_code: None,
                    result: Some(json!({ "content": content, "data": data })),
                    error: None,
                    output_bytes: Some(output_bytes),
                    truncated: false,
                    artifact: None,
                    produced: Vec::new(),
                    durability: Durability::Flushed,
                };
                let mut event = row_event(&row, ToolEventKind::Completed);
                event.outcome_status = Some(ToolOutcomeStatus::Succeeded);
                event.output_bytes = Some(output_bytes);
                let outcome = ToolOutcome::Succeeded {
                    action: row.tool_name.clone(),
                };
                (terminal, outcome, content, Some(data), event)
            }
            Completion::RunCancelled => {
                let code = ReasonCode::ToolRunCancelled;
                (
                    TerminalRecord::without_result(code),
                    ToolOutcome::not_succeeded(row.tool_name.clone(), code),
                    Vec::new(),
                    None,
                    ended_event(&row, code),
                )
            }
        };
        let written = self
            .invocations
            .complete_suspended(
                tenant_id,
                invocation_id,
                &terminal,
                &[event],
                self.clock.now(),
            )
            .await?;
        Ok(written.then_some(Finished {
            invocation_id: Some(invocation_id),
            outcome,
            content,
            data,
            synthesis_only: false,
        }))
    }

    /// This pipeline's worker.
    pub fn worker_id(&self) -> Uuid {
        self.worker_id
    }

    /// Rows whose terminal write waits for the store to answer again.
    pub fn settlements_pending(&self) -> usize {
        self.settler.pending()
    }

    /// Waits up to `within` for the rows whose terminal write waits for the
    /// store; what is left is recovered by the table once the lease ends.
    pub async fn drain_settlements(&self, within: std::time::Duration) {
        self.settler.drain(within).await;
    }

    fn reached(&self, point: Point, request: &CallRequest) {
        self.observer.reached(point, &request.call_id);
    }

    /// The one pipeline function.
    pub async fn call(&self, request: CallRequest) -> CallOutcome {
        use tracing::Instrument as _;
        use tracing::field::Empty;
        // The document's span: identity and classification, never arguments
        // or results.
        let span = tracing::info_span!(
            "tool.execute",
            tool.name = %request.name,
            tool.source = Empty,
            tool.version = Empty,
            tool.idempotency_class = Empty,
            tool.outcome_status = Empty,
            tool.reason_code = Empty,
            tool.truncated = Empty,
            tool.parallel_group = ?request.parallel_group,
        );
        let started = std::time::Instant::now();
        let outcome = self.call_steps(&request).instrument(span.clone()).await;
        if let CallOutcome::Finished(finished) = &outcome {
            span.record("tool.outcome_status", finished.outcome.status().as_str());
            if let Some(code) = finished.outcome.reason_code() {
                span.record("tool.reason_code", code.as_str());
            }
            // One line per finished call: identity, status and time only.
            tracing::info!(
                invocation_id = ?finished.invocation_id,
                tool = %crate::domain::names::bounded_name(&request.name),
                status = finished.outcome.status().as_str(),
                reason_code = finished.outcome.reason_code().map(|code| code.as_str()),
                duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                "tool call finished"
            );
            let truncated = finished
                .content
                .iter()
                .any(|part| matches!(part, RenderedPart::Artifact { .. }));
            span.record("tool.truncated", truncated);
        }
        outcome
    }

    async fn call_steps(&self, request: &CallRequest) -> CallOutcome {
        // A worker whose lease is not live claims nothing: the call is not
        // started here, and the same call asked again (here once the lease
        // is renewed, or on another node) is served.
        if !self.lease.is_live() {
            return unrecorded(request.name.clone(), ReasonCode::ToolRecordUnavailable);
        }
        match self.steps(request).await {
            Ok(outcome) => outcome,
            // The store failed before the call's tool ran (a failure after
            // is answered where it happens): whatever it recorded, the same
            // call asked again reads it, and nothing it may hold runs twice.
            Err(error) => {
                tracing::error!(error = %error, call_id = %request.call_id, "store failure in the pipeline");
                unrecorded(request.name.clone(), ReasonCode::ToolRecordUnavailable)
            }
        }
    }

    async fn steps(&self, request: &CallRequest) -> Result<CallOutcome, StoreError> {
        use tracing::Instrument as _;
        // tool.call never executes: it is unwrapped into the deferred tool
        // it names before step 1, and the call goes on as that tool.
        let unwrapped = match self.unwrap_tool_call(request).await? {
            Unwrap::Plain => None,
            Unwrap::Into(inner) => Some(inner),
            Unwrap::Refused(outcome) => return Ok(outcome),
        };
        let request: &CallRequest = unwrapped.as_deref().unwrap_or(request);
        if request.withdrawn() {
            return Ok(CallOutcome::Withdrawn);
        }
        // 1. Resolve against the pinned set: unknown is denied before policy.
        self.reached(Point::Resolve, request);
        let Some(pinned) = request.pinned.resolve(&request.name) else {
            return self.refuse_unresolved(request).await;
        };
        let tool = pinned.tool.clone();
        let spec = &tool.spec;
        let span = tracing::Span::current();
        span.record("tool.name", spec.name.as_str());
        span.record("tool.source", spec.source.as_str());
        span.record("tool.version", spec.version.as_str());
        span.record("tool.idempotency_class", spec.idempotency.as_str());

        // 2. Enabled for this agent.
        self.reached(Point::Enabled, request);
        if !request.agent.enables(&spec.name) {
            return self
                .refuse(
                    request,
                    &tool,
                    ReasonCode::PolicyAgentToolDisabled,
                    None,
                    None,
                )
                .await;
        }

        // 3. Scopes.
        self.reached(Point::Scopes, request);
        if !request.principal.missing_scopes(spec).is_empty() {
            return self
                .refuse(request, &tool, ReasonCode::PolicyScopeMissing, None, None)
                .await;
        }

        // 4. Validate.
        self.reached(Point::Validate, request);
        let validated = tracing::info_span!("tool.validate")
            .in_scope(|| tool.input.validate(request.arguments.clone()));
        let canonical = match validated {
            Ok(canonical) => canonical,
            Err(error) => {
                let mut text = error.to_string();
                if unwrapped.is_some() {
                    // The deferred tool's definition never reached the
                    // provider; its schema is what the model needs.
                    text.push_str("\ninput_schema: ");
                    text.push_str(&spec.input_schema.to_string());
                }
                let detail = vec![RenderedPart::Text {
                    text,
                    trust: TrustLevel::Platform,
                }];
                return self
                    .refuse(
                        request,
                        &tool,
                        ReasonCode::ToolArgumentsInvalid,
                        Some(detail),
                        None,
                    )
                    .await;
            }
        };

        // 5. Normalize: the canonical form's hash keys everything after.
        self.reached(Point::Normalize, request);
        let key = idempotency_key(
            &request.run_id.to_string(),
            u64::try_from(request.step_number).unwrap_or_default(),
            &request.call_id,
            &spec.name,
            &spec.version,
            &canonical.sha256,
        );
        let now = self.clock.now();
        if request.recovering.is_none()
            && request.deadline_at.is_some_and(|deadline| deadline <= now)
        {
            // A call that cannot finish is refused before it starts.
            return self
                .refuse(
                    request,
                    &tool,
                    ReasonCode::ToolDeadlineExceeded,
                    None,
                    Some((&canonical.value, &canonical.sha256)),
                )
                .await;
        }

        // 6. Policy: the rules, then the breaker, whose counts are the run's
        // own record; a recovering call was counted when it was first
        // proposed. The rules read nothing from the store, so taking them
        // first changes no decision, and it lets an allowed call the breaker
        // has nothing to count for (the first with its arguments in the
        // run, as most calls are) show that and persist its intent in one
        // commit: the breaker's verdict on an empty tally is to proceed.
        self.reached(Point::Policy, request);
        let argument_names: Vec<&str> = canonical
            .value
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        let action = ProposedAction {
            tenant_id: &request.tenant_id,
            principal: &request.principal,
            tool: &spec.name,
            kind: spec.kind,
            source: spec.source,
            side_effect: spec.side_effect,
            risk: spec.risk,
            idempotency: spec.idempotency,
            origin_trust: request.origin_trust,
            argument_trust: request.argument_trust.minimum(argument_names),
        };
        let ruled = self
            .policy
            .evaluate(&action)
            .instrument(tracing::info_span!("policy.evaluate"))
            .await;
        let identity = Identity {
            request,
            id: Uuid::new_v4(),
            tool_name: &spec.name,
            tool_version: &spec.version,
            tool_source: spec.source,
            class: spec.idempotency,
        };
        let durability = Durability::of_tool(spec);
        let new = |status: InvocationStatus,
                   reason_code: Option<ReasonCode>,
                   approval_id: Option<Uuid>| NewInvocation {
            id: identity.id,
            tenant_id: request.tenant_id.clone(),
            session_id: request.session_id,
            run_id: request.run_id,
            step_number: request.step_number,
            call_id: request.call_id.clone(),
            tool_name: spec.name.clone(),
            tool_version: spec.version.clone(),
            tool_source: spec.source,
            server_id: spec.server_id.clone(),
            arguments: canonical.value.clone(),
            arguments_hash: canonical.sha256.clone(),
            idempotency_key: key.clone(),
            idempotency_class: spec.idempotency,
            side_effect: spec.side_effect,
            origin_trust: request.origin_trust,
            principal: request.principal.clone(),
            parallel_group: request.parallel_group,
            deadline_at: request.deadline_at,
            status,
            reason_code,
            approval_id,
            // Only a running intent's commit is the tool's; a denial or a
            // row waiting for approval is flushed.
            durability: if status == InvocationStatus::Running {
                durability
            } else {
                Durability::Flushed
            },
        };
        let claim = Claim {
            worker_id: self.worker_id,
            now,
        };
        // 8 and 9 in one commit: with no approval pending, the intent is
        // inserted already claimed (RUNNING under this worker's fence).
        // Losing it loses both or neither, and the tool starts only once it
        // is committed.
        let running = [
            identity.event(ToolEventKind::Proposed),
            identity.event(ToolEventKind::Authorized),
            identity.event(ToolEventKind::Started),
        ];
        // Taken back before anything was written: nothing is.
        if request.withdrawn() {
            return Ok(CallOutcome::Withdrawn);
        }
        let uncounted = request.recovering.is_none() && ruled == PolicyDecision::Allow;
        if uncounted {
            self.reached(Point::PersistIntent, request);
            if let Some(row) = self
                .invocations
                .insert_uncounted(&new(InvocationStatus::Running, None, None), claim, &running)
                .await?
            {
                return self
                    .start(
                        request,
                        &tool,
                        row,
                        &canonical.sha256,
                        BreakerTally::default(),
                    )
                    .await;
            }
        }
        let tally = match request.recovering {
            Some(_) => BreakerTally::default(),
            None => {
                self.invocations
                    .breaker_tally(
                        &request.tenant_id,
                        request.run_id,
                        &spec.name,
                        &canonical.sha256,
                    )
                    .await?
            }
        };
        if let breaker::Verdict::Refuse(code) = breaker::before_dispatch(&tally) {
            return self
                .refuse(
                    request,
                    &tool,
                    code,
                    None,
                    Some((&canonical.value, &canonical.sha256)),
                )
                .await;
        }
        let decision = match ruled {
            PolicyDecision::Deny(code) => PolicyDecision::Deny(breaker::denial(&tally, code)),
            other => other,
        };
        let inserted = match decision {
            PolicyDecision::Deny(code) => {
                let events = [
                    identity.event(ToolEventKind::Proposed),
                    denied_event(&identity, code),
                ];
                self.invocations
                    .insert_invocation(
                        &new(InvocationStatus::Denied, Some(code), None),
                        claim,
                        &events,
                    )
                    .await
            }
            PolicyDecision::RequireApproval(code) => {
                // A caller that cannot name its calls asking again is the
                // call that already waits: one approval, one execution.
                if request.caller.resumes_waiting
                    && request.recovering.is_none()
                    && let Some(row) = self
                        .invocations
                        .waiting_call(
                            &request.tenant_id,
                            request.run_id,
                            &spec.name,
                            &canonical.sha256,
                        )
                        .await?
                {
                    let same = CallRequest {
                        step_number: row.step_number,
                        call_id: row.call_id.clone(),
                        ..request.clone()
                    };
                    return self
                        .deduplicate(&same, &tool, row, &canonical.sha256, decision)
                        .await;
                }
                // 7. Approval: persisted with a waiting row in one commit.
                self.reached(Point::Approval, request);
                let approval_id = Uuid::new_v4();
                let events = [identity.event(ToolEventKind::Proposed)];
                let waiting = new(
                    InvocationStatus::WaitingForApproval,
                    Some(code),
                    Some(approval_id),
                );
                self.invocations
                    .insert_invocation(&waiting, claim, &events)
                    .await
            }
            PolicyDecision::Allow => {
                if !uncounted {
                    self.reached(Point::PersistIntent, request);
                }
                self.invocations
                    .insert_invocation(&new(InvocationStatus::Running, None, None), claim, &running)
                    .await
            }
        };
        match inserted? {
            InsertOutcome::Inserted(row) => match row.status {
                // Inserted already claimed.
                InvocationStatus::Running => {
                    self.start(request, &tool, row, &canonical.sha256, tally)
                        .await
                }
                InvocationStatus::WaitingForApproval => match row.approval_id {
                    Some(approval_id) => Ok(CallOutcome::Pending {
                        invocation_id: row.id,
                        approval_id,
                    }),
                    None => Ok(recorded(&row)),
                },
                _ => Ok(recorded(&row)),
            },
            InsertOutcome::Existing(row) => {
                self.deduplicate(request, &tool, row, &canonical.sha256, decision)
                    .await
            }
        }
    }

    /// Runs a row inserted already claimed, `tally` being the breaker's
    /// counts from before it.
    async fn start(
        &self,
        request: &CallRequest,
        tool: &Arc<RegisteredTool>,
        row: InvocationRecord,
        arguments_hash: &str,
        tally: BreakerTally,
    ) -> Result<CallOutcome, StoreError> {
        self.reached(Point::Claim, request);
        let Some(fence) = row.fence() else {
            return Ok(unrecorded(
                tool.spec.name.clone(),
                ReasonCode::ToolConcurrencyConflict,
            ));
        };
        let outcome = self.run_claimed(request, tool, row, fence).await?;
        self.with_synthesis_flag(request, &tool.spec.name, arguments_hash, tally, outcome)
            .await
    }

    /// Sets `synthesis_only` on a call that just ran. The count after it is
    /// the count before plus this outcome; only when that reaches one below
    /// the threshold is the store asked again, since evidence restarts can
    /// only have lowered it.
    async fn with_synthesis_flag(
        &self,
        request: &CallRequest,
        tool_name: &str,
        arguments_hash: &str,
        mut tally: BreakerTally,
        mut outcome: CallOutcome,
    ) -> Result<CallOutcome, StoreError> {
        let CallOutcome::Finished(finished) = &mut outcome else {
            return Ok(outcome);
        };
        let status = finished.outcome.status();
        let code = finished.outcome.reason_code();
        match tally
            .counts
            .iter_mut()
            .find(|(s, c, _)| *s == status && *c == code)
        {
            Some((_, _, count)) => *count += 1,
            None => tally.counts.push((status, code, 1)),
        }
        if breaker::synthesis_only(&tally) {
            // The call is settled; a tally that cannot be read leaves the
            // flag unset rather than the answer unsaid.
            match self
                .invocations
                .breaker_tally(
                    &request.tenant_id,
                    request.run_id,
                    tool_name,
                    arguments_hash,
                )
                .await
            {
                Ok(fresh) => finished.synthesis_only = breaker::synthesis_only(&fresh),
                Err(error) => {
                    tracing::warn!(error = %error, "breaker tally not read after a settled call")
                }
            }
        }
        Ok(outcome)
    }

    /// Deduplication on insert: the design document's five cases.
    async fn deduplicate(
        &self,
        request: &CallRequest,
        tool: &Arc<RegisteredTool>,
        row: InvocationRecord,
        arguments_hash: &str,
        decision: PolicyDecision,
    ) -> Result<CallOutcome, StoreError> {
        let action = tool.spec.name.clone();
        // A key recorded for another principal (or, impossibly but checked,
        // other canonical arguments) is never answered with that record: it
        // is a conflict, recorded as such.
        if row.principal.id != request.principal.id || row.arguments_hash != arguments_hash {
            return self
                .record_conflict(
                    request,
                    RecordedAs::of(&tool.spec),
                    &row.arguments,
                    arguments_hash,
                )
                .await;
        }
        // A suspended control tool waits for its answer, not for a worker:
        // submitting it again finds it still suspended.
        if let (InvocationStatus::Running, Some(kind), Some(reference)) =
            (row.status, &row.suspended_kind, &row.suspended_ref)
        {
            return Ok(CallOutcome::Suspended {
                invocation_id: row.id,
                kind: kind.clone(),
                reference: reference.clone(),
            });
        }
        match row.status {
            // 2. Terminal: the recorded outcome, without executing.
            status if status.is_terminal() => Ok(recorded(&row)),
            // 5. Waiting: resume the existing approval.
            InvocationStatus::WaitingForApproval => {
                self.resume_approval(request, tool, row, decision).await
            }
            InvocationStatus::Authorized | InvocationStatus::Running => {
                if row.suspended_kind.is_some() {
                    return Ok(unrecorded(action, ReasonCode::ToolConcurrencyConflict));
                }
                // Recovery took this row over for this very call.
                if request.recovering.is_some() && request.recovering == row.fence() {
                    return self.recover_row(request, tool, row, decision).await;
                }
                // 3 and 4: in flight under a live lease, or take it over.
                let claim = Claim {
                    worker_id: self.worker_id,
                    now: self.clock.now(),
                };
                match self
                    .invocations
                    .take_over(&request.tenant_id, row.id, claim)
                    .await?
                {
                    Some(taken) => self.recover_row(request, tool, taken, decision).await,
                    None => Ok(unrecorded(action, ReasonCode::ToolConcurrencyConflict)),
                }
            }
            InvocationStatus::Proposed => {
                Ok(unrecorded(action, ReasonCode::ToolConcurrencyConflict))
            }
            _ => Ok(recorded(&row)),
        }
    }

    async fn resume_approval(
        &self,
        request: &CallRequest,
        tool: &Arc<RegisteredTool>,
        row: InvocationRecord,
        decision: PolicyDecision,
    ) -> Result<CallOutcome, StoreError> {
        let Some(approval_id) = row.approval_id else {
            return Ok(recorded(&row));
        };
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
                [ended_event(&row, code)],
            )
        };
        match (status, decision) {
            (ApprovalStatus::Pending, _) => Ok(CallOutcome::Pending {
                invocation_id: row.id,
                approval_id,
            }),
            // Resumed at step 6: the decision just made stands unless it
            // only asked for the approval that was given.
            (ApprovalStatus::Approved, PolicyDecision::Deny(code)) => {
                let (terminal, events) = end(code);
                self.invocations
                    .settle_waiting(&request.tenant_id, row.id, &terminal, &events, now)
                    .await?;
                self.reread(request, row.id).await
            }
            (ApprovalStatus::Approved, _) => {
                let claim = Claim {
                    worker_id: self.worker_id,
                    now,
                };
                let events = [row_event(&row, ToolEventKind::Authorized)];
                match self
                    .invocations
                    .authorize_waiting(&request.tenant_id, row.id, claim, &events)
                    .await?
                {
                    Some(authorized) => self.claim_then_run(request, tool, authorized).await,
                    None => self.reread(request, row.id).await,
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
                    .settle_waiting(&request.tenant_id, row.id, &terminal, &events, now)
                    .await?;
                self.reread(request, row.id).await
            }
        }
    }

    /// What the row says, after another writer moved it: its outcome once
    /// it has one (waited for a little, as its new owner may be settling
    /// it), else "in progress", which the same call asked again resolves.
    async fn reread(&self, request: &CallRequest, id: Uuid) -> Result<CallOutcome, StoreError> {
        let deadline = tokio::time::Instant::now() + REREAD_WAIT;
        let mut wait = std::time::Duration::from_millis(20);
        let mut row = self.invocations.invocation(&request.tenant_id, id).await?;
        while row.as_ref().is_some_and(|row| !row.status.is_terminal())
            && tokio::time::Instant::now() + wait < deadline
        {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(std::time::Duration::from_millis(250));
            row = self.invocations.invocation(&request.tenant_id, id).await?;
        }
        match row {
            Some(row) if row.status.is_terminal() => Ok(recorded(&row)),
            Some(row) => Ok(CallOutcome::Finished(Finished {
                invocation_id: Some(row.id),
                outcome: ToolOutcome::not_succeeded(
                    row.tool_name.clone(),
                    ReasonCode::ToolConcurrencyConflict,
                ),
                content: Vec::new(),
                data: None,
                synthesis_only: false,
            })),
            None => Ok(unrecorded(
                request.name.clone(),
                ReasonCode::ToolInternalError,
            )),
        }
    }

    /// The recovery table, for a row this worker now holds. Authority was
    /// re-checked by steps 1 to 6 of this same call.
    async fn recover_row(
        &self,
        request: &CallRequest,
        tool: &Arc<RegisteredTool>,
        row: InvocationRecord,
        decision: PolicyDecision,
    ) -> Result<CallOutcome, StoreError> {
        let Some(fence) = row.fence() else {
            return Ok(unrecorded(
                tool.spec.name.clone(),
                ReasonCode::ToolConcurrencyConflict,
            ));
        };
        let effect_sent = row.effect_sent_at.is_some();
        let table = if row.status == InvocationStatus::Running {
            recovery::decide(row.idempotency_class, effect_sent)
        } else {
            RecoveryDecision::ReExecute
        };
        let expired = row
            .deadline_at
            .is_some_and(|deadline| deadline <= self.clock.now());
        if let (PolicyDecision::RequireApproval(code), false) = (decision, expired)
            && table != RecoveryDecision::Uncertain
            && !self.approved(&row).await?
        {
            // Standing authority gone and no approval on record: it falls
            // back to interactive approval, and nothing runs until a human
            // decides.
            let approval_id = Uuid::new_v4();
            let reopened = self
                .invocations
                .reopen_approval(
                    &row.tenant_id,
                    row.id,
                    fence,
                    approval_id,
                    code,
                    self.clock.now(),
                )
                .await?;
            if !reopened {
                return self.reread(request, row.id).await;
            }
            return Ok(CallOutcome::Pending {
                invocation_id: row.id,
                approval_id,
            });
        }
        let refusal = match (table, decision) {
            (RecoveryDecision::Uncertain, _) => Some(ReasonCode::ToolOutcomeUnknown),
            (_, PolicyDecision::Deny(code)) => Some(code),
            _ if expired => Some(ReasonCode::ToolDeadlineExceeded),
            _ => None,
        };
        if let Some(code) = refusal {
            return self.end_held(&row, fence, code).await;
        }
        if row.status == InvocationStatus::Authorized {
            return self.claim_then_run(request, tool, row).await;
        }
        self.run_claimed(request, tool, row, fence).await
    }

    /// Ends a row this worker holds with `code` and no result, then reports
    /// what the row says (another writer's record wins over ours).
    async fn end_held(
        &self,
        row: &InvocationRecord,
        fence: Fence,
        code: ReasonCode,
    ) -> Result<CallOutcome, StoreError> {
        let terminal = TerminalRecord::without_result(code);
        let event = ended_event(row, code);
        self.invocations
            .complete_invocation(
                &row.tenant_id,
                row.id,
                fence,
                &terminal,
                &[event],
                self.clock.now(),
            )
            .await?;
        Ok(
            match self.invocations.invocation(&row.tenant_id, row.id).await? {
                Some(current) if current.status.is_terminal() => recorded(&current),
                _ => unrecorded(row.tool_name.clone(), ReasonCode::ToolConcurrencyConflict),
            },
        )
    }

    async fn approved(&self, row: &InvocationRecord) -> Result<bool, StoreError> {
        let Some(approval_id) = row.approval_id else {
            return Ok(false);
        };
        let approval = self.approvals.approval(&row.tenant_id, approval_id).await?;
        Ok(approval.is_some_and(|a| a.status == ApprovalStatus::Approved))
    }

    /// Step 9, then steps 10 to 14.
    async fn claim_then_run(
        &self,
        request: &CallRequest,
        tool: &Arc<RegisteredTool>,
        row: InvocationRecord,
    ) -> Result<CallOutcome, StoreError> {
        self.reached(Point::Claim, request);
        let Some(fence) = row.fence() else {
            return Ok(unrecorded(
                tool.spec.name.clone(),
                ReasonCode::ToolConcurrencyConflict,
            ));
        };
        let events = [row_event(&row, ToolEventKind::Started)];
        let Some(running) = self
            .invocations
            .claim_invocation(
                &request.tenant_id,
                row.id,
                fence,
                self.clock.now(),
                &events,
                Durability::of_tool(&tool.spec),
            )
            .await?
        else {
            return self.reread(request, row.id).await;
        };
        let fence = running.fence().unwrap_or(fence);
        self.run_claimed(request, tool, running, fence).await
    }

    /// Steps 10 to 14 for a RUNNING row held under `fence`.
    async fn run_claimed(
        &self,
        request: &CallRequest,
        tool: &Arc<RegisteredTool>,
        row: InvocationRecord,
        fence: Fence,
    ) -> Result<CallOutcome, StoreError> {
        let spec = &tool.spec;
        // 10. Execute with the effective timeout.
        self.reached(Point::Execute, request);
        if let Some(kind) = suspension(spec) {
            // The await happens elsewhere: the row stays RUNNING with its
            // marker, the lease is released, and the answer completes it.
            let reference = Uuid::new_v4().to_string();
            let suspended = self
                .invocations
                .suspend_invocation(&request.tenant_id, row.id, fence, kind, &reference)
                .await?;
            if !suspended {
                return self.reread(request, row.id).await;
            }
            return Ok(CallOutcome::Suspended {
                invocation_id: row.id,
                kind: kind.to_owned(),
                reference,
            });
        }
        let now = self.clock.now();
        let remaining = row
            .deadline_at
            .map(|deadline| (deadline - now).to_std().unwrap_or_default().as_secs_f64())
            .unwrap_or(f64::INFINITY);
        let timeout_seconds = f64::from(spec.timeout_seconds).min(remaining);
        // One absolute deadline for the watermark's commit and the tool.
        let deadline = tokio::time::Instant::now()
            + std::time::Duration::from_secs_f64(timeout_seconds.max(0.0));
        let mut effect_sent = row.effect_sent_at.is_some();
        let writer = match self.artifacts.writer(&request.tenant_id, request.run_id) {
            Ok(writer) => writer,
            Err(_) => {
                let failure = ToolFailure::new(
                    ToolFailureKind::Internal,
                    "artifact store unavailable; the tool did not start",
                );
                return self
                    .settle(
                        request,
                        tool,
                        &row,
                        fence,
                        Conclusion::failure(failure, false),
                        Attempt {
                            executed: None,
                            effect_sent,
                        },
                    )
                    .await;
            }
        };
        if spec.needs_effect_watermark() {
            // The watermark commits before the tool starts, within the call's
            // deadline; if it cannot, the tool never starts.
            let marked = tokio::time::timeout_at(
                deadline,
                self.invocations.mark_effect_sent(
                    &request.tenant_id,
                    row.id,
                    fence,
                    now,
                    Durability::of_watermark(spec),
                ),
            )
            .await;
            let failure = match marked {
                Ok(Ok(true)) => {
                    effect_sent = true;
                    None
                }
                Ok(Ok(false)) => return self.reread(request, row.id).await,
                Ok(Err(error)) => {
                    tracing::error!(error = %error, call_id = %request.call_id, "effect watermark not committed");
                    Some(ToolFailure::new(
                        ToolFailureKind::Internal,
                        "effect watermark not committed; the tool did not start",
                    ))
                }
                Err(_) => Some(ToolFailure::new(
                    ToolFailureKind::Timeout,
                    "the deadline passed before the effect watermark committed; the tool did not start",
                )),
            };
            if let Some(failure) = failure {
                return self
                    .settle(
                        request,
                        tool,
                        &row,
                        fence,
                        Conclusion::failure(failure, false),
                        Attempt {
                            executed: None,
                            effect_sent,
                        },
                    )
                    .await;
            }
        }
        // What is left of the deadline is the tool's.
        let timeout_seconds = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .as_secs_f64();
        let now = self.clock.now();
        self.reached(Point::WatermarkCommitted, request);
        let resolver = Arc::new(RecordingResolver {
            inner: self.credentials.clone(),
            resolved: Mutex::new(Vec::new()),
        });
        let cancellation = CancellationToken::new();
        let context = ToolExecutionContext {
            invocation_id: row.id,
            call_id: row.call_id.clone(),
            run_id: row.run_id,
            session_id: row.session_id,
            tenant_id: row.tenant_id.clone(),
            principal: row.principal.clone(),
            step_number: u64::try_from(row.step_number).unwrap_or_default(),
            attempt_number: u32::try_from(row.attempt_number).unwrap_or(1),
            idempotency_key: row.idempotency_key.clone(),
            deadline_at: system_time(now, timeout_seconds),
            timeout_seconds,
            maximum_output_bytes: spec.maximum_output_bytes,
            target: ExecutionTarget {
                kind: spec.target_kind,
                server_id: spec.server_id.clone(),
                device_id: spec.device_id.clone(),
            },
            workspace: None,
            artifacts: writer.clone(),
            credentials: resolver.clone(),
            cancellation: cancellation.clone(),
            mark_effect_sent: Arc::new(StoreWatermark {
                store: self.invocations.clone(),
                clock: self.clock.clone(),
                tenant_id: row.tenant_id.clone(),
                id: row.id,
                fence,
                durability: Durability::of_watermark(spec),
            }),
            skills: request.pinned.skills().clone(),
        };
        let started = Instant::now();
        let execution = {
            // Polled on this task: a panic is contained, and a timed-out tool
            // is dropped where it stands; a spawned task would add a hand-off
            // and a wake-up to every call.
            let arguments = row.arguments.clone();
            let execution = match contain(|| Contained(tool.tool.execute(arguments, context))) {
                Some(mut running) => {
                    let ended = tokio::time::timeout_at(deadline, &mut running).await;
                    // The tool's own destructor runs contained as well.
                    contain(move || drop(running));
                    match ended {
                        Ok(Some(result)) => Execution::Returned(result),
                        Ok(None) => Execution::Panicked,
                        Err(_) => Execution::TimedOut,
                    }
                }
                None => Execution::Panicked,
            };
            if !matches!(execution, Execution::Returned(_)) {
                cancellation.cancel();
            }
            execution
        };
        let duration_ms = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
        // An effect that may have escaped cannot be reported as an ordinary
        // failure for any class that is neither read-only nor idempotent
        // (Decision 26): without the tool's proof it did not apply, it is
        // uncertain.
        let may_have_escaped = effect_sent
            && !matches!(
                spec.idempotency,
                IdempotencyClass::ReadOnly | IdempotencyClass::Idempotent
            );
        let finish = match execution {
            Execution::Returned(result) => {
                Conclusion::from_result(result, resolver.resolved(), may_have_escaped)
            }
            Execution::TimedOut if may_have_escaped => Conclusion::failure(
                ToolFailure::new(
                    ToolFailureKind::OutcomeUnknown,
                    "timed out after the effect watermark",
                ),
                true,
            ),
            Execution::TimedOut => Conclusion::failure(
                ToolFailure::new(ToolFailureKind::Timeout, "timed out"),
                false,
            ),
            Execution::Panicked if may_have_escaped => Conclusion::failure(
                ToolFailure::new(
                    ToolFailureKind::OutcomeUnknown,
                    "the tool panicked after the effect watermark",
                ),
                true,
            ),
            Execution::Panicked => Conclusion::failure(
                ToolFailure::new(ToolFailureKind::Internal, "the tool panicked"),
                false,
            ),
        };
        self.settle(
            request,
            tool,
            &row,
            fence,
            finish,
            Attempt {
                executed: Some((writer, duration_ms)),
                effect_sent,
            },
        )
        .await
    }

    /// Steps 11 to 14.
    async fn settle(
        &self,
        request: &CallRequest,
        tool: &Arc<RegisteredTool>,
        row: &InvocationRecord,
        fence: Fence,
        finish: Conclusion,
        attempt: Attempt,
    ) -> Result<CallOutcome, StoreError> {
        let Attempt {
            executed,
            effect_sent,
        } = attempt;
        let spec = &tool.spec;
        let attribution = Attribution {
            source: spec.source,
            tool: &spec.name,
        };
        // 11. Validate the result: schema, size, trust.
        self.reached(Point::ValidateResult, request);
        let secrets = match &finish {
            Conclusion::Succeeded { secrets, .. } => secrets.clone(),
            Conclusion::Failed { .. } => Vec::new(),
        };
        let (mut finish, text) = match finish {
            Conclusion::Succeeded { result, secrets } => {
                let text = output::scrub(&content_text(&result.content), &secrets);
                let invalid = match (&tool.output, &result.structured) {
                    (Some(schema), Some(structured)) => {
                        schema.validate(Value::Object(structured.clone())).is_err()
                    }
                    _ => false,
                };
                let ceiling = output::hard_ceiling(spec.maximum_output_bytes);
                // Images, audio and blobs count toward the output as text does.
                let blob_bytes: u64 = result
                    .content
                    .iter()
                    .filter_map(|part| match part {
                        ContentPart::Artifact(reference) => Some(reference.bytes),
                        ContentPart::Text { .. } => None,
                    })
                    .sum();
                if invalid {
                    (
                        Conclusion::failure(
                            ToolFailure::new(
                                ToolFailureKind::OutputInvalid,
                                "structured result fails the output schema",
                            ),
                            false,
                        ),
                        text,
                    )
                } else if (text.len() as u64).saturating_add(blob_bytes) > ceiling {
                    let kept = output::prefix_at_boundary(
                        &text,
                        usize::try_from(ceiling).unwrap_or(usize::MAX),
                    )
                    .to_owned();
                    (
                        Conclusion::failure(
                            ToolFailure::new(
                                ToolFailureKind::OutputTooLarge,
                                "output past the hard ceiling",
                            ),
                            false,
                        ),
                        kept,
                    )
                } else {
                    let trust = spec.output_trust.clamp_lower(result.output_trust);
                    (
                        Conclusion::Succeeded {
                            result: ToolResult {
                                output_trust: Some(trust),
                                ..result
                            },
                            secrets,
                        },
                        text,
                    )
                }
            }
            failed => (failed, String::new()),
        };

        // 12. Truncate or artifactize: the whole result is stored before the
        // result row and its event.
        self.reached(Point::Artifactize, request);
        let budget = output::inline_budget(
            spec.maximum_output_bytes,
            self.settings.inline_maximum_bytes,
        );
        let blob_bytes: u64 = match &finish {
            Conclusion::Succeeded { result, .. } => result
                .content
                .iter()
                .filter_map(|part| match part {
                    ContentPart::Artifact(reference) => Some(reference.bytes),
                    ContentPart::Text { .. } => None,
                })
                .sum(),
            Conclusion::Failed { .. } => 0,
        };
        let output_bytes = text.len() as i64;
        let recorded_bytes =
            output_bytes.saturating_add(i64::try_from(blob_bytes).unwrap_or(i64::MAX));
        let mut artifact: Option<(Uuid, u64)> = None;
        let mut content: Vec<RenderedPart> = Vec::new();
        let trust = match &finish {
            Conclusion::Succeeded { result, .. } => {
                result.output_trust.unwrap_or(TrustLevel::ExternalUntrusted)
            }
            _ => TrustLevel::ExternalUntrusted,
        };
        let too_large = matches!(&finish, Conclusion::Failed { failure, .. } if failure.kind == ToolFailureKind::OutputTooLarge);
        if (matches!(finish, Conclusion::Succeeded { .. }) || too_large)
            && output_bytes as u64 > budget
        {
            // The budget is checked with a reference of the real one's length
            // before anything is written: a limit too small to hold it fails
            // without creating an artifact.
            let placeholder = format!("artifact:{}", Uuid::nil());
            match (output::excerpt(&text, budget, &placeholder), &executed) {
                (Err(_), _) => {
                    finish = Conclusion::failure(
                        ToolFailure::new(
                            ToolFailureKind::OutputTooLarge,
                            "inline budget too small for an excerpt",
                        ),
                        false,
                    );
                }
                (Ok(_), None) => {
                    // A missing artifact writer never silently discards the result.
                    finish = Conclusion::failure(
                        ToolFailure::new(
                            ToolFailureKind::OutputTooLarge,
                            "artifact store unavailable",
                        ),
                        false,
                    );
                }
                (Ok(_), Some((writer, _))) => match writer
                    .write(ARTIFACT_MEDIA_TYPE, trust, text.clone().into_bytes())
                    .await
                {
                    Ok(reference) => {
                        let id = Uuid::parse_str(&reference.artifact_id)
                            .unwrap_or_else(|_| Uuid::new_v4());
                        // Same length as the placeholder that fit, so this fits.
                        let excerpt = output::excerpt(&text, budget, &format!("artifact:{id}"))
                            .unwrap_or_else(|_| output::Excerpt {
                                head: String::new(),
                                marker: format!("[full output: artifact:{id}]"),
                                tail: String::new(),
                            });
                        content.push(render_text(&excerpt.head, trust, &attribution));
                        content.push(RenderedPart::Text {
                            text: excerpt.marker,
                            trust: TrustLevel::Platform,
                        });
                        content.push(render_text(&excerpt.tail, trust, &attribution));
                        content.push(RenderedPart::Artifact {
                            artifact_id: id.to_string(),
                            bytes: reference.bytes,
                        });
                        artifact = Some((id, reference.bytes));
                    }
                    Err(_) => {
                        // A missing artifact never silently discards the result.
                        finish = Conclusion::failure(
                            ToolFailure::new(
                                ToolFailureKind::OutputTooLarge,
                                "artifact store unavailable",
                            ),
                            false,
                        );
                    }
                },
            }
        } else if let Conclusion::Succeeded { result, .. } = &finish {
            for part in &result.content {
                match part {
                    ContentPart::Text { text } => {
                        content.push(render_text(
                            &output::scrub(text, &secrets),
                            trust,
                            &attribution,
                        ));
                    }
                    ContentPart::Artifact(reference) => content.push(RenderedPart::Artifact {
                        artifact_id: reference.artifact_id.clone(),
                        bytes: reference.bytes,
                    }),
                }
            }
        }
        let (outcome_status, reason_code, error) = match &finish {
            Conclusion::Succeeded { .. } => (ToolOutcomeStatus::Succeeded, None, None),
            Conclusion::Failed { failure, uncertain } => {
                let code = if *uncertain {
                    ReasonCode::ToolOutcomeUnknown
                } else {
                    failure.reason_code
                };
                if let Some(external) = &failure.external_text {
                    // Remote text is data: enveloped, never the message.
                    content.push(RenderedPart::Text {
                        text: output::envelope(external, &attribution, &nonce()),
                        trust: TrustLevel::ExternalUntrusted,
                    });
                }
                (
                    code.status(),
                    Some(code),
                    serde_json::to_value(failure).ok(),
                )
            }
        };

        // The same result as data, for programmatic callers, and the
        // artifacts the tool made, recorded so their owner can read them.
        let data = match &finish {
            Conclusion::Succeeded { result, .. } => Some(output::result_data(
                result,
                &secrets,
                trust,
                spec.maximum_output_bytes,
                artifact.map(|(id, bytes)| DataArtifact {
                    artifact_id: id.to_string(),
                    media_type: ARTIFACT_MEDIA_TYPE.to_owned(),
                    bytes,
                    trust,
                }),
            )),
            Conclusion::Failed { .. } => None,
        };
        let whole_id = artifact.map(|(id, _)| id.to_string());
        let produced = data
            .iter()
            .flat_map(|data| data.artifacts.iter())
            .filter(|made| Some(&made.artifact_id) != whole_id.as_ref())
            .filter_map(|made| {
                Some(StoredArtifact {
                    id: Uuid::parse_str(&made.artifact_id).ok()?,
                    media_type: made.media_type.clone(),
                    bytes: i64::try_from(made.bytes).unwrap_or(i64::MAX),
                    trust: made.trust,
                })
            })
            .collect();

        // 13. Persist the result.
        self.reached(Point::PersistResult, request);
        let terminal = TerminalRecord {
            status: outcome_status.invocation_status(),
            outcome_status,
            reason_code,
            result: Some(json!({ "content": content, "data": data })),
            error,
            output_bytes: executed.as_ref().map(|_| recorded_bytes),
            truncated: artifact.is_some(),
            artifact: artifact.map(|(id, bytes)| StoredArtifact {
                id,
                media_type: ARTIFACT_MEDIA_TYPE.to_owned(),
                bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
                trust,
            }),
            produced,
            durability: Durability::of_tool(&tool.spec),
        };
        let mut event = row_event(row, terminal_event_kind(outcome_status));
        event.outcome_status = Some(outcome_status);
        event.reason_code = reason_code;
        // Whether the watermark is set: from this attempt or an earlier one.
        event.effect_sent = effect_sent;
        event.duration_ms = executed.as_ref().map(|(_, ms)| *ms);
        event.output_bytes = terminal.output_bytes;
        event.truncated = terminal.truncated;
        let now = self.clock.now();
        let written = match self
            .invocations
            .complete_invocation(
                &request.tenant_id,
                row.id,
                fence,
                &terminal,
                &[event.clone()],
                now,
            )
            .await
        {
            Ok(written) => written,
            Err(error) => {
                tracing::error!(error = %error, call_id = %request.call_id, "the result was not recorded; this worker keeps it");
                return Ok(self.settle_later(row, fence, terminal, event, effect_sent, now));
            }
        };
        if !written {
            // Another worker took the row over while this attempt ran: its
            // record, not this attempt's, is the call's.
            return self.reread(request, row.id).await;
        }
        if let (Conclusion::Succeeded { result, .. }, None) = (&finish, reason_code)
            && let Some(evidence_key) = &result.evidence_key
        {
            // The row is settled: evidence lost to a failing store costs a
            // restart of the loop count, never the answer.
            if let Err(error) = self
                .invocations
                .record_evidence(
                    &request.tenant_id,
                    row.run_id,
                    &spec.name,
                    &row.arguments_hash,
                    evidence_key,
                    breaker::MAXIMUM_RESTARTS,
                )
                .await
            {
                tracing::warn!(error = %error, "evidence key not recorded");
            }
        }

        // 14. Render.
        self.reached(Point::Render, request);
        let outcome = match reason_code {
            None => ToolOutcome::Succeeded {
                action: spec.name.clone(),
            },
            Some(code) => ToolOutcome::not_succeeded(spec.name.clone(), code),
        };
        Ok(CallOutcome::Finished(Finished {
            invocation_id: Some(row.id),
            outcome,
            content,
            data,
            synthesis_only: false,
        }))
    }

    /// The store failed under a terminal write whose tool ran. The answer
    /// is what the row will hold whichever way it ends, and this worker
    /// keeps the record to write when the store answers again: uncertain
    /// where recovery would end it so (the tool's own conclusion is kept
    /// beside it for the reviewer); otherwise the record as concluded, and
    /// "ask again", which the same call resolves.
    fn settle_later(
        &self,
        row: &InvocationRecord,
        fence: Fence,
        terminal: TerminalRecord,
        event: crate::ports::ToolEvent,
        effect_sent: bool,
        now: chrono::DateTime<chrono::Utc>,
    ) -> CallOutcome {
        let (terminal, event, answer) = match recovery::unwritten_end(
            row.idempotency_class,
            effect_sent,
        ) {
            UnwrittenEnd::Uncertain => {
                let code = ReasonCode::ToolOutcomeUnknown;
                let mut uncertain = TerminalRecord::without_result(code);
                uncertain.error = Some(json!({
                    "kind": "outcome_unknown",
                    "detail": "the store failed before this call's result was recorded; the tool concluded as `concluded` says",
                    "concluded": terminal.outcome_status.as_str(),
                    "concluded_reason_code": terminal.reason_code.map(ReasonCode::as_str),
                }));
                let mut event = event;
                event.kind = terminal_event_kind(ToolOutcomeStatus::Uncertain);
                event.outcome_status = Some(ToolOutcomeStatus::Uncertain);
                event.reason_code = Some(code);
                (uncertain, event, code)
            }
            UnwrittenEnd::AskAgain => (terminal, event, ReasonCode::ToolRecordUnavailable),
        };
        self.settler.hand_over(Settlement {
            tenant_id: row.tenant_id.clone(),
            id: row.id,
            fence,
            terminal,
            events: vec![event],
            now,
        });
        CallOutcome::Finished(Finished {
            invocation_id: Some(row.id),
            outcome: ToolOutcome::not_succeeded(row.tool_name.clone(), answer),
            content: Vec::new(),
            data: None,
            synthesis_only: false,
        })
    }

    /// ADR-0123: a `tool.call` is checked against its own schema, the tool
    /// it names must be pinned and must not be a control tool, and the call
    /// continues as that tool with the model's call id. Refusals are
    /// recorded under tool.call's name.
    async fn unwrap_tool_call(&self, request: &CallRequest) -> Result<Unwrap, StoreError> {
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

    async fn refuse(
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

    async fn refuse_unresolved(&self, request: &CallRequest) -> Result<CallOutcome, StoreError> {
        // No spec: the most restrictive classification stands in, and the
        // caller's name is recorded bounded (it is anyone's text).
        let name = bounded_name(&request.name);
        self.record_refusal(
            request,
            RecordedAs {
                tool_name: &name,
                tool_version: "",
                tool_source: ToolSource::Builtin,
                server_id: None,
                class: IdempotencyClass::NonIdempotent,
                side_effect: SideEffectClass::ExternalWrite,
            },
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
        let key = idempotency_key(
            &request.run_id.to_string(),
            u64::try_from(request.step_number).unwrap_or_default(),
            &request.call_id,
            call.tool_name,
            call.tool_version,
            &arguments_hash,
        );
        // Every identical denial counts toward the run's breaker, wherever
        // in steps 1 to 6 it was decided.
        let code = if code.status() == ToolOutcomeStatus::Denied {
            let tally = self
                .invocations
                .breaker_tally(
                    &request.tenant_id,
                    request.run_id,
                    call.tool_name,
                    &arguments_hash,
                )
                .await?;
            breaker::denial(&tally, code)
        } else {
            code
        };
        let status = code.status();
        let identity = Identity {
            request,
            id: Uuid::new_v4(),
            tool_name: call.tool_name,
            tool_version: call.tool_version,
            tool_source: call.tool_source,
            class: call.class,
        };
        let new = NewInvocation {
            id: identity.id,
            tenant_id: request.tenant_id.clone(),
            session_id: request.session_id,
            run_id: request.run_id,
            step_number: request.step_number,
            call_id: request.call_id.clone(),
            tool_name: call.tool_name.to_owned(),
            tool_version: call.tool_version.to_owned(),
            tool_source: call.tool_source,
            server_id: call.server_id.clone(),
            arguments,
            arguments_hash,
            idempotency_key: key,
            idempotency_class: call.class,
            side_effect: call.side_effect,
            origin_trust: request.origin_trust,
            principal: request.principal.clone(),
            parallel_group: request.parallel_group,
            deadline_at: request.deadline_at,
            status: status.invocation_status(),
            reason_code: Some(code),
            approval_id: None,
            durability: Durability::Flushed,
        };
        let mut terminal = identity.event(terminal_event_kind(status));
        terminal.outcome_status = Some(status);
        terminal.reason_code = Some(code);
        let events = [identity.event(ToolEventKind::Proposed), terminal];
        let claim = Claim {
            worker_id: self.worker_id,
            now: self.clock.now(),
        };
        let row = match self
            .invocations
            .insert_invocation(&new, claim, &events)
            .await
        {
            Ok(InsertOutcome::Inserted(row)) => row,
            // A refusal whose identity another principal's row holds is that
            // conflict, not the other row.
            Ok(InsertOutcome::Existing(row)) if row.principal.id != request.principal.id => {
                return self
                    .record_conflict(request, call, &new.arguments, &new.arguments_hash)
                    .await;
            }
            Ok(InsertOutcome::Existing(row)) => row,
            Err(failure) => return Err(failure),
        };
        if !row.status.is_terminal() {
            // Recovery re-checked authority and was refused: the row it holds
            // ends here, uncertain if its effect may have escaped.
            if let Some(fence) = request
                .recovering
                .filter(|fence| row.fence() == Some(*fence))
            {
                return self.end_held(&row, fence, ending_code(&row, code)).await;
            }
            return Ok(unrecorded(
                call.tool_name.to_owned(),
                ReasonCode::ToolConcurrencyConflict,
            ));
        }
        let mut outcome = recorded(&row);
        if let (CallOutcome::Finished(finished), Some(detail), true) =
            (&mut outcome, detail, row.id == new.id)
        {
            finished.content = detail;
        }
        Ok(outcome)
    }

    /// A call whose idempotency key another principal's row of the tenant
    /// holds (keys are unique per tenant, so another tenant's never does):
    /// that row is never this call's answer. The
    /// conflict is recorded as a terminal row of its own, under a key derived
    /// from the call's key and who submitted it (so a repeated submission
    /// finds the same conflict), and its outcome is returned.
    async fn record_conflict(
        &self,
        request: &CallRequest,
        call: RecordedAs<'_>,
        arguments: &Value,
        arguments_hash: &str,
    ) -> Result<CallOutcome, StoreError> {
        if request.withdrawn() {
            return Ok(CallOutcome::Withdrawn);
        }
        let code = ReasonCode::ToolIdempotencyConflict;
        let key = idempotency_key(
            &request.run_id.to_string(),
            u64::try_from(request.step_number).unwrap_or_default(),
            &request.call_id,
            call.tool_name,
            call.tool_version,
            arguments_hash,
        );
        let conflict_key = sha256_hex(
            format!(
                "{CONFLICT_KEY_TAG}\0{key}\0{}\0{}",
                request.tenant_id, request.principal.id
            )
            .as_bytes(),
        );
        let identity = Identity {
            request,
            id: Uuid::new_v4(),
            tool_name: call.tool_name,
            tool_version: call.tool_version,
            tool_source: call.tool_source,
            class: call.class,
        };
        let new = NewInvocation {
            id: identity.id,
            tenant_id: request.tenant_id.clone(),
            session_id: request.session_id,
            run_id: request.run_id,
            step_number: request.step_number,
            call_id: request.call_id.clone(),
            tool_name: call.tool_name.to_owned(),
            tool_version: call.tool_version.to_owned(),
            tool_source: call.tool_source,
            server_id: call.server_id,
            arguments: arguments.clone(),
            arguments_hash: arguments_hash.to_owned(),
            idempotency_key: conflict_key,
            idempotency_class: call.class,
            side_effect: call.side_effect,
            origin_trust: request.origin_trust,
            principal: request.principal.clone(),
            parallel_group: request.parallel_group,
            deadline_at: request.deadline_at,
            status: code.status().invocation_status(),
            reason_code: Some(code),
            approval_id: None,
            durability: Durability::Flushed,
        };
        let mut ended = identity.event(terminal_event_kind(code.status()));
        ended.outcome_status = Some(code.status());
        ended.reason_code = Some(code);
        let events = [identity.event(ToolEventKind::Proposed), ended];
        let claim = Claim {
            worker_id: self.worker_id,
            now: self.clock.now(),
        };
        Ok(
            match self
                .invocations
                .insert_invocation(&new, claim, &events)
                .await
            {
                Ok(InsertOutcome::Inserted(row) | InsertOutcome::Existing(row)) => recorded(&row),
                Err(failure) => return Err(failure),
            },
        )
    }

    /// Recovery: takes over the rows of dead workers, up to `batch` a round
    /// and `rounds` rounds (what one sweep takes is bounded; the next takes
    /// the rest), and re-enters the one pipeline function with each. What
    /// the table settles without the tool is settled first, before any
    /// server is prepared; servers are prepared only for the tenants of rows
    /// that must run again and whose tools no session has registered.
    pub async fn recover(&self, batch: i64, rounds: usize) -> Result<RecoveryReport, StoreError> {
        let mut report = RecoveryReport::default();
        // The tenants prepared in this sweep, each with its servers that
        // did not answer.
        let mut prepared: HashMap<String, HashSet<String>> = HashMap::new();
        for _ in 0..rounds.max(1) {
            if !self.lease.is_live() {
                break;
            }
            let claim = Claim {
                worker_id: self.worker_id,
                now: self.clock.now(),
            };
            let rows = self.invocations.claim_expired(claim, batch).await?;
            if rows.is_empty() {
                break;
            }
            report.taken += rows.len();
            let (settled, rest): (Vec<_>, Vec<_>) =
                rows.into_iter().partition(settled_without_the_tool);
            let mut outcomes = futures::future::join_all(
                settled.into_iter().map(|row| self.recover_one(row, None)),
            )
            .await;
            let wanting: HashSet<String> = rest
                .iter()
                .filter(|row| {
                    row.tool_source == ToolSource::Mcp
                        && !prepared.contains_key(&row.tenant_id)
                        && self
                            .registry
                            .pin_exact(&row.tenant_id, &row.tool_name, &row.tool_version)
                            .is_none()
                })
                .map(|row| row.tenant_id.clone())
                .collect();
            let discovered = futures::future::join_all(
                wanting
                    .into_iter()
                    .map(|tenant| async move { (self.prepare_servers(&tenant).await, tenant) }),
            )
            .await;
            prepared.extend(discovered.into_iter().map(|(down, tenant)| (tenant, down)));
            // The rows are independent; none waits behind another's tool.
            outcomes.extend(
                futures::future::join_all(rest.into_iter().map(|row| {
                    let down = prepared.get(&row.tenant_id);
                    self.recover_one(row, down)
                }))
                .await,
            );
            for outcome in outcomes {
                if outcome?.status() == Some(ToolOutcomeStatus::Uncertain) {
                    report.uncertain += 1;
                }
            }
        }
        Ok(report)
    }

    /// Registers a tenant's MCP tools for recovery; returns the servers
    /// that did not answer.
    async fn prepare_servers(&self, tenant: &str) -> HashSet<String> {
        let Some(servers) = &self.mcp else {
            return HashSet::new();
        };
        let discoveries = servers.discover(tenant).await;
        let (_, record) = register_discoveries(&self.registry, tenant, discoveries);
        record
            .events
            .iter()
            .filter_map(|event| match event {
                PlatformEvent::ServerDisconnected { server_id, .. } => Some(server_id.clone()),
                _ => None,
            })
            .collect()
    }

    async fn recover_one(
        &self,
        row: InvocationRecord,
        unreachable: Option<&HashSet<String>>,
    ) -> Result<CallOutcome, StoreError> {
        let fence = row.fence();
        if settled_without_the_tool(&row)
            && let Some(fence) = fence
        {
            // The table's answer does not depend on the tool or on current
            // authority: it is settled now, without waiting for a server.
            return self
                .end_held(&row, fence, ReasonCode::ToolOutcomeUnknown)
                .await;
        }
        let pinned = self
            .registry
            .pin_exact(&row.tenant_id, &row.tool_name, &row.tool_version);
        let Some(pinned) = pinned else {
            // Nothing can run it again: its server did not answer, or the
            // build or the server no longer has the tool (at this version).
            let server_down = row
                .server_id
                .as_ref()
                .is_some_and(|server| unreachable.is_some_and(|down| down.contains(server)));
            let otherwise = if server_down {
                ReasonCode::ToolServerUnreachable
            } else {
                ReasonCode::ToolWithdrawn
            };
            let code = ending_code(&row, otherwise);
            return match fence {
                Some(fence) => self.end_held(&row, fence, code).await,
                None => Ok(unrecorded(row.tool_name.clone(), code)),
            };
        };
        let request = CallRequest {
            tenant_id: row.tenant_id.clone(),
            session_id: row.session_id,
            run_id: row.run_id,
            step_number: row.step_number,
            call_id: row.call_id.clone(),
            name: row.tool_name.clone(),
            arguments: row.arguments.clone(),
            principal: row.principal.clone(),
            agent: AgentSpec {
                tools: vec![row.tool_name.clone()],
            },
            pinned,
            origin_trust: row.origin_trust,
            argument_trust: ArgumentTrust::default(),
            deadline_at: row.deadline_at,
            parallel_group: row.parallel_group,
            recovering: fence,
            caller: CallerTerms::default(),
        };
        Ok(self.call(request).await)
    }
}

/// The classification a refused call is recorded under.
#[derive(Clone)]
struct RecordedAs<'a> {
    tool_name: &'a str,
    tool_version: &'a str,
    tool_source: ToolSource,
    server_id: Option<String>,
    class: IdempotencyClass,
    side_effect: SideEffectClass,
}

impl<'a> RecordedAs<'a> {
    /// A resolved tool's classification.
    fn of(spec: &'a ToolSpec) -> Self {
        RecordedAs {
            tool_name: &spec.name,
            tool_version: &spec.version,
            tool_source: spec.source,
            server_id: spec.server_id.clone(),
            class: spec.idempotency,
            side_effect: spec.side_effect,
        }
    }
}

fn suspension(spec: &ToolSpec) -> Option<&'static str> {
    if spec.kind != ToolKind::Control {
        return None;
    }
    SUSPENDING
        .iter()
        .find(|(name, _)| *name == spec.name)
        .map(|(_, kind)| *kind)
}

/// What `tool.call` unwrapping decided.
enum Unwrap {
    /// Not a tool.call.
    Plain,
    /// The call, as the tool it names.
    Into(Box<CallRequest>),
    /// The wrapper was refused; this is the recorded outcome.
    Refused(CallOutcome),
}

enum Conclusion {
    Succeeded {
        result: ToolResult,
        secrets: Vec<SecretValue>,
    },
    Failed {
        failure: ToolFailure,
        uncertain: bool,
    },
}

impl Conclusion {
    fn failure(failure: ToolFailure, uncertain: bool) -> Conclusion {
        let uncertain = uncertain || failure.kind == ToolFailureKind::OutcomeUnknown;
        Conclusion::Failed { failure, uncertain }
    }

    fn from_result(
        result: ToolResult,
        secrets: Vec<SecretValue>,
        may_have_escaped: bool,
    ) -> Conclusion {
        match result.failure {
            None => Conclusion::Succeeded { result, secrets },
            Some(mut failure) => {
                // Scrub what the tool says about itself, too.
                failure.detail = output::scrub(&failure.detail, &secrets);
                failure.external_text = failure
                    .external_text
                    .map(|text| output::scrub(&text, &secrets));
                // A failure after the watermark of a non-idempotent effect is
                // uncertain unless the tool reports it definitively.
                let definitive = failure.effect_not_applied
                    || matches!(
                        failure.kind,
                        ToolFailureKind::InvalidArguments
                            | ToolFailureKind::NotFound
                            | ToolFailureKind::Permission
                    );
                let uncertain = may_have_escaped && !definitive;
                Conclusion::failure(failure, uncertain)
            }
        }
    }
}

/// Whether the recovery table settles a taken row as UNCERTAIN whatever the
/// tool and the current authority: a running call that may have sent its
/// effect and cannot be repeated.
fn settled_without_the_tool(row: &InvocationRecord) -> bool {
    row.status == InvocationStatus::Running
        && recovery::decide(row.idempotency_class, row.effect_sent_at.is_some())
            == RecoveryDecision::Uncertain
}

/// The code a held row ends with when it is not run again: uncertain if its
/// effect may have escaped, `otherwise` if not.
fn ending_code(row: &InvocationRecord, otherwise: ReasonCode) -> ReasonCode {
    let may_have_escaped = row.status == InvocationStatus::Running
        && recovery::decide(row.idempotency_class, row.effect_sent_at.is_some())
            == RecoveryDecision::Uncertain;
    if may_have_escaped {
        ReasonCode::ToolOutcomeUnknown
    } else {
        otherwise
    }
}
