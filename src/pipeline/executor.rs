//! The one pipeline function: every call, from every entry point, runs
//! through [`Pipeline::call`]. Fourteen steps in the design document's order,
//! with its four commits (intent, claim, result, and the watermark between),
//! and no transaction open across tool I/O.
//!
//! Recovery re-enters the same function with the row it took over, so
//! authority is re-checked by steps 1 to 6 and the recovery table is applied
//! where deduplication meets the row.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use uuid::Uuid;

use super::breaker;
use super::output::{self, Attribution, RenderedPart};
use super::recovery::{self, RecoveryDecision};
use super::registry::{PinnedToolSet, RegisteredTool, ToolRegistry};
use crate::domain::policy::{PolicyDecision, ProposedAction};
use crate::domain::secret::CredentialRef;
use crate::domain::{
    AgentSpec, ApprovalStatus, ArgumentTrust, ContentPart, IdempotencyClass, InvocationStatus,
    Principal, ReasonCode, SecretValue, SideEffectClass, ToolEventKind, ToolFailure,
    ToolFailureKind, ToolKind, ToolOutcome, ToolOutcomeStatus, ToolResult, ToolSource, ToolSpec,
    TrustLevel, canonicalize, idempotency_key, sha256_hex,
};
use crate::ports::{
    ArtifactStore, BoxFuture, BreakerTally, CancellationToken, Claim, Clock, CredentialError,
    CredentialResolver, EffectWatermark, ExecutionTarget, Fence, InsertOutcome, InvocationRecord,
    NewInvocation, PolicyEngine, Store, StoreError, StoredArtifact, TerminalRecord, ToolEvent,
    ToolExecutionContext, WatermarkError,
};

/// What an excerpted result's whole is stored as.
const ARTIFACT_MEDIA_TYPE: &str = "text/plain; charset=utf-8";

/// A place in the pipeline an observer is told about: the fourteen steps as
/// they are entered, and the watermark's commit inside step 10.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Point {
    /// 1: resolve the registered tool.
    Resolve,
    /// 2: check the tool is enabled for the agent.
    Enabled,
    /// 3: check the principal's scopes.
    Scopes,
    /// 4: validate the arguments.
    Validate,
    /// 5: normalize: canonical form, hash, key.
    Normalize,
    /// 6: evaluate policy.
    Policy,
    /// 7: request approval if needed.
    Approval,
    /// 8: persist intent (commit).
    PersistIntent,
    /// 9: claim for execution (commit).
    Claim,
    /// 10: execute (the watermark commits first for any side effect).
    Execute,
    /// Inside 10: the watermark is committed and the tool is about to start.
    WatermarkCommitted,
    /// 11: validate the result.
    ValidateResult,
    /// 12: truncate or artifactize.
    Artifactize,
    /// 13: persist the result (commit).
    PersistResult,
    /// 14: render the outcome.
    Render,
}

impl Point {
    /// A stable name, for failpoints and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Point::Resolve => "resolve",
            Point::Enabled => "enabled",
            Point::Scopes => "scopes",
            Point::Validate => "validate",
            Point::Normalize => "normalize",
            Point::Policy => "policy",
            Point::Approval => "approval",
            Point::PersistIntent => "persist_intent",
            Point::Claim => "claim",
            Point::Execute => "execute",
            Point::WatermarkCommitted => "watermark_committed",
            Point::ValidateResult => "validate_result",
            Point::Artifactize => "artifactize",
            Point::PersistResult => "persist_result",
            Point::Render => "render",
        }
    }

    /// The point a name denotes.
    pub fn parse(name: &str) -> Option<Point> {
        Point::ALL.into_iter().find(|point| point.as_str() == name)
    }

    /// Every point, in pipeline order.
    pub const ALL: [Point; 15] = [
        Point::Resolve,
        Point::Enabled,
        Point::Scopes,
        Point::Validate,
        Point::Normalize,
        Point::Policy,
        Point::Approval,
        Point::PersistIntent,
        Point::Claim,
        Point::Execute,
        Point::WatermarkCommitted,
        Point::ValidateResult,
        Point::Artifactize,
        Point::PersistResult,
        Point::Render,
    ];
}

/// Watches the pipeline pass its points: tests record the sequence, the
/// crash harness aborts the process at one.
pub trait StepObserver: Send + Sync {
    /// The call `call_id` reached `point`.
    fn reached(&self, point: Point, call_id: &str);
}

/// An observer that does nothing.
#[derive(Debug, Default)]
pub struct Unobserved;

impl StepObserver for Unobserved {
    fn reached(&self, _: Point, _: &str) {}
}

/// Pipeline-wide settings from configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipelineSettings {
    /// The model-visible admission ceiling.
    pub inline_maximum_bytes: u64,
}

/// One call, as an entry point submits it.
#[derive(Debug, Clone)]
pub struct CallRequest {
    /// The tenant.
    pub tenant_id: String,
    /// The session.
    pub session_id: Uuid,
    /// The run.
    pub run_id: Uuid,
    /// The step (shared by the batch).
    pub step_number: i64,
    /// The provider's call id, or the bridge's.
    pub call_id: String,
    /// A registry name or its wire alias.
    pub name: String,
    /// The model's arguments.
    pub arguments: Value,
    /// Who the call acts for.
    pub principal: Principal,
    /// The agent's configuration.
    pub agent: AgentSpec,
    /// The session's pinned set: resolution is against what was advertised.
    pub pinned: Arc<PinnedToolSet>,
    /// Minimum trust over the request's context items.
    pub origin_trust: TrustLevel,
    /// Per-argument trust, carried from construction.
    pub argument_trust: ArgumentTrust,
    /// The run's deadline.
    pub deadline_at: Option<DateTime<Utc>>,
    /// The batch, when parallel.
    pub parallel_group: Option<Uuid>,
    /// Set only by recovery: the fence under which it took the row over.
    pub recovering: Option<Fence>,
}

/// A call's end, as the model reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    /// The row, when one was written or found.
    pub invocation_id: Option<Uuid>,
    /// The six-field (or success) outcome.
    pub outcome: ToolOutcome,
    /// What the model reads beside it.
    pub content: Vec<RenderedPart>,
    /// An identical-call count sits one below the loop threshold after this
    /// call: the next model turn must answer from what it has.
    pub synthesis_only: bool,
}

impl Finished {
    /// Whether this outcome fails the run (ToolPolicyDenied: the third
    /// identical denied proposal).
    pub fn fails_run(&self) -> bool {
        self.outcome.reason_code() == Some(ReasonCode::PolicyBreakerRepeatedDenial)
    }
}

/// What an entry point gets back.
#[derive(Debug, Clone, PartialEq)]
pub enum CallOutcome {
    /// The call ended.
    Finished(Finished),
    /// A control tool suspended the call: it ends when its answer (a user's
    /// reply, a child run's result) completes it through
    /// [`Pipeline::complete_suspended`].
    Suspended {
        /// The suspended row.
        invocation_id: Uuid,
        /// `user_input` or `child_run`.
        kind: String,
        /// The question or child run the answer must name.
        reference: String,
    },
    /// The call waits for a human; submitting it again resumes it.
    Pending {
        /// The waiting row.
        invocation_id: Uuid,
        /// The approval to decide.
        approval_id: Uuid,
    },
}

impl CallOutcome {
    /// The end, if the call has one.
    pub fn finished(&self) -> Option<&Finished> {
        match self {
            CallOutcome::Finished(finished) => Some(finished),
            CallOutcome::Pending { .. } | CallOutcome::Suspended { .. } => None,
        }
    }

    /// The outcome status, absent while pending.
    pub fn status(&self) -> Option<ToolOutcomeStatus> {
        self.finished().map(|finished| finished.outcome.status())
    }
}

/// What recovery did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Rows taken over.
    pub taken: usize,
    /// Of those, ended uncertain.
    pub uncertain: usize,
}

/// The executor and what it stands on.
pub struct Pipeline {
    registry: Arc<ToolRegistry>,
    store: Arc<dyn Store>,
    policy: Arc<dyn PolicyEngine>,
    artifacts: Arc<dyn ArtifactStore>,
    credentials: Arc<dyn CredentialResolver>,
    clock: Arc<dyn Clock>,
    observer: Arc<dyn StepObserver>,
    worker_id: Uuid,
    settings: PipelineSettings,
}

/// The parts of a pipeline, as the composition root wires them.
pub struct PipelineParts {
    /// Resolution and specs.
    pub registry: Arc<ToolRegistry>,
    /// The durable record.
    pub store: Arc<dyn Store>,
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
    /// This process's worker (registered with a lease).
    pub worker_id: Uuid,
    /// Settings.
    pub settings: PipelineSettings,
}

/// Identity fields every event and row of one call shares.
struct Identity<'a> {
    request: &'a CallRequest,
    id: Uuid,
    tool_name: &'a str,
    tool_version: &'a str,
    tool_source: ToolSource,
    class: IdempotencyClass,
}

impl Identity<'_> {
    fn event(&self, kind: ToolEventKind) -> ToolEvent {
        ToolEvent {
            kind,
            invocation_id: self.id,
            run_id: self.request.run_id,
            step_number: self.request.step_number,
            call_id: self.request.call_id.clone(),
            tool_name: self.tool_name.to_owned(),
            tool_source: self.tool_source,
            tool_version: self.tool_version.to_owned(),
            outcome_status: None,
            reason_code: None,
            idempotency_class: self.class,
            effect_sent: false,
            duration_ms: None,
            output_bytes: None,
            truncated: false,
            parallel_group: self.request.parallel_group,
        }
    }
}

fn terminal_event(kind_of: ToolOutcomeStatus) -> ToolEventKind {
    match kind_of {
        ToolOutcomeStatus::Succeeded => ToolEventKind::Completed,
        ToolOutcomeStatus::Failed | ToolOutcomeStatus::Unavailable => ToolEventKind::Failed,
        ToolOutcomeStatus::Denied => ToolEventKind::Denied,
        ToolOutcomeStatus::Uncertain => ToolEventKind::Uncertain,
    }
}

fn record_event(row: &InvocationRecord, kind: ToolEventKind) -> ToolEvent {
    ToolEvent {
        kind,
        invocation_id: row.id,
        run_id: row.run_id,
        step_number: row.step_number,
        call_id: row.call_id.clone(),
        tool_name: row.tool_name.clone(),
        tool_source: row.tool_source,
        tool_version: row.tool_version.clone(),
        outcome_status: row.outcome_status,
        reason_code: row.reason_code,
        idempotency_class: row.idempotency_class,
        effect_sent: row.effect_sent_at.is_some(),
        duration_ms: None,
        output_bytes: row.output_bytes,
        truncated: row.truncated,
        parallel_group: row.parallel_group,
    }
}

/// The watermark a tool's context carries: one short fenced transaction.
struct StoreWatermark {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    tenant_id: String,
    id: Uuid,
    fence: Fence,
}

impl EffectWatermark for StoreWatermark {
    fn mark_effect_sent(&self) -> BoxFuture<'_, Result<(), WatermarkError>> {
        Box::pin(async move {
            match self
                .store
                .mark_effect_sent(&self.tenant_id, self.id, self.fence, self.clock.now())
                .await
            {
                Ok(true) => Ok(()),
                Ok(false) => Err(WatermarkError(
                    "this attempt no longer holds the call".into(),
                )),
                Err(error) => Err(WatermarkError(error.to_string())),
            }
        })
    }
}

/// Resolves through the real resolver and remembers every value it handed
/// out, so they can be scrubbed from whatever the tool returns.
struct RecordingResolver {
    inner: Arc<dyn CredentialResolver>,
    resolved: Mutex<Vec<SecretValue>>,
}

impl RecordingResolver {
    fn resolved(&self) -> Vec<SecretValue> {
        self.resolved
            .lock()
            .map(|values| values.clone())
            .unwrap_or_default()
    }
}

impl CredentialResolver for RecordingResolver {
    fn resolve<'a>(
        &'a self,
        reference: &'a CredentialRef,
    ) -> BoxFuture<'a, Result<SecretValue, CredentialError>> {
        Box::pin(async move {
            let value = self.inner.resolve(reference).await?;
            if let Ok(mut resolved) = self.resolved.lock() {
                resolved.push(value.clone());
            }
            Ok(value)
        })
    }
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
            store: parts.store,
            policy: parts.policy,
            artifacts: parts.artifacts,
            credentials: parts.credentials,
            clock: parts.clock,
            observer: parts.observer,
            worker_id: parts.worker_id,
            settings: parts.settings,
        }
    }

    /// This pipeline's worker.
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
        let Some(row) = self.store.invocation(tenant_id, invocation_id).await? else {
            return Ok(None);
        };
        let Some(kind) = row.suspended_kind.clone() else {
            return Ok(None);
        };
        if row.status != InvocationStatus::Running {
            return Ok(None);
        }
        let (terminal, outcome, content, event) = match completion {
            Completion::Answered { text } => {
                let trust = if kind == "user_input" {
                    TrustLevel::User
                } else {
                    TrustLevel::ExternalUntrusted
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
                    result: Some(json!({ "content": content })),
                    error: None,
                    output_bytes: Some(output_bytes),
                    truncated: false,
                    artifact: None,
                };
                let mut event = record_event(&row, ToolEventKind::Completed);
                event.outcome_status = Some(ToolOutcomeStatus::Succeeded);
                event.output_bytes = Some(output_bytes);
                let outcome = ToolOutcome::Succeeded {
                    action: row.tool_name.clone(),
                };
                (terminal, outcome, content, event)
            }
            Completion::RunCancelled => {
                let code = ReasonCode::ToolRunCancelled;
                (
                    TerminalRecord::without_result(code),
                    ToolOutcome::not_succeeded(row.tool_name.clone(), code),
                    Vec::new(),
                    ended_event(&row, code),
                )
            }
        };
        let written = self
            .store
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
            synthesis_only: false,
        }))
    }

    pub fn worker_id(&self) -> Uuid {
        self.worker_id
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
        let outcome = self.call_steps(&request).instrument(span.clone()).await;
        if let CallOutcome::Finished(finished) = &outcome {
            span.record("tool.outcome_status", finished.outcome.status().as_str());
            if let Some(code) = finished.outcome.reason_code() {
                span.record("tool.reason_code", code.as_str());
            }
            let truncated = finished
                .content
                .iter()
                .any(|part| matches!(part, RenderedPart::Artifact { .. }));
            span.record("tool.truncated", truncated);
        }
        outcome
    }

    async fn call_steps(&self, request: &CallRequest) -> CallOutcome {
        match self.steps(request).await {
            Ok(outcome) => outcome,
            // The store failing is the one thing the pipeline cannot record;
            // the caller learns the call is not known to have run.
            Err(error) => {
                tracing::error!(error = %error, call_id = %request.call_id, "store failure in the pipeline");
                unrecorded(request.name.clone(), ReasonCode::ToolInternalError)
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

        // 6. Policy: the breaker first, since its counts are the run's own
        // record; a recovering call was counted when it was first proposed.
        self.reached(Point::Policy, request);
        let tally = match request.recovering {
            Some(_) => BreakerTally::default(),
            None => {
                self.store
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
        let decision = match self
            .policy
            .evaluate(&action)
            .instrument(tracing::info_span!("policy.evaluate"))
            .await
        {
            PolicyDecision::Deny(code) => PolicyDecision::Deny(breaker::denial(&tally, code)),
            other => other,
        };
        let identity = Identity {
            request,
            id: Uuid::new_v4(),
            tool_name: &spec.name,
            tool_version: &spec.version,
            tool_source: spec.source,
            class: spec.idempotency,
        };
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
        };
        let claim = Claim {
            worker_id: self.worker_id,
            now,
        };
        let inserted = match decision {
            PolicyDecision::Deny(code) => {
                let events = [
                    identity.event(ToolEventKind::Proposed),
                    denied_event(&identity, code),
                ];
                self.store
                    .insert_invocation(
                        &new(InvocationStatus::Denied, Some(code), None),
                        claim,
                        &events,
                    )
                    .await?
            }
            PolicyDecision::RequireApproval(code) => {
                // 7. Approval: persisted with a waiting row in one commit.
                self.reached(Point::Approval, request);
                let approval_id = Uuid::new_v4();
                let events = [identity.event(ToolEventKind::Proposed)];
                let waiting = new(
                    InvocationStatus::WaitingForApproval,
                    Some(code),
                    Some(approval_id),
                );
                self.store
                    .insert_invocation(&waiting, claim, &events)
                    .await?
            }
            PolicyDecision::Allow => {
                // 8. Persist intent.
                self.reached(Point::PersistIntent, request);
                let events = [
                    identity.event(ToolEventKind::Proposed),
                    identity.event(ToolEventKind::Authorized),
                ];
                self.store
                    .insert_invocation(
                        &new(InvocationStatus::Authorized, None, None),
                        claim,
                        &events,
                    )
                    .await?
            }
        };
        match inserted {
            InsertOutcome::Inserted(row) => match row.status {
                InvocationStatus::Authorized => {
                    let outcome = self.execute(request, &tool, row).await?;
                    self.with_synthesis_flag(request, &spec.name, &canonical.sha256, tally, outcome)
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
            let fresh = self
                .store
                .breaker_tally(
                    &request.tenant_id,
                    request.run_id,
                    tool_name,
                    arguments_hash,
                )
                .await?;
            finished.synthesis_only = breaker::synthesis_only(&fresh);
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
        // A reused key whose canonical arguments differ is refused, not merged.
        if row.arguments_hash != arguments_hash {
            return Ok(unrecorded(action, ReasonCode::ToolIdempotencyConflict));
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
                    .store
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
        let approval = self.store.approval(&request.tenant_id, approval_id).await?;
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
                self.store
                    .settle_waiting(&request.tenant_id, row.id, &terminal, &events, now)
                    .await?;
                self.reread(request, row.id).await
            }
            (ApprovalStatus::Approved, _) => {
                let claim = Claim {
                    worker_id: self.worker_id,
                    now,
                };
                let events = [record_event(&row, ToolEventKind::Authorized)];
                match self
                    .store
                    .authorize_waiting(&request.tenant_id, row.id, claim, &events)
                    .await?
                {
                    Some(authorized) => self.execute(request, tool, authorized).await,
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
                self.store
                    .settle_waiting(&request.tenant_id, row.id, &terminal, &events, now)
                    .await?;
                self.reread(request, row.id).await
            }
        }
    }

    /// What the row says now, after another writer may have moved it.
    async fn reread(&self, request: &CallRequest, id: Uuid) -> Result<CallOutcome, StoreError> {
        match self.store.invocation(&request.tenant_id, id).await? {
            Some(row) if row.status.is_terminal() => Ok(recorded(&row)),
            Some(row) => Ok(CallOutcome::Finished(Finished {
                invocation_id: Some(row.id),
                outcome: ToolOutcome::not_succeeded(
                    row.tool_name.clone(),
                    ReasonCode::ToolConcurrencyConflict,
                ),
                content: Vec::new(),
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
        let refusal = match (table, decision) {
            (RecoveryDecision::Uncertain, _) => Some(ReasonCode::ToolOutcomeUnknown),
            (_, PolicyDecision::Deny(code)) => Some(code),
            // Standing authority gone and no approval on record: a human
            // must decide again, so nothing runs.
            (_, PolicyDecision::RequireApproval(code)) if !self.approved(&row).await? => Some(code),
            _ if row
                .deadline_at
                .is_some_and(|deadline| deadline <= self.clock.now()) =>
            {
                Some(ReasonCode::ToolDeadlineExceeded)
            }
            _ => None,
        };
        if let Some(code) = refusal {
            return self.end_held(&row, fence, code).await;
        }
        if row.status == InvocationStatus::Authorized {
            return self.execute(request, tool, row).await;
        }
        self.run(request, tool, row, fence).await
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
        self.store
            .complete_invocation(
                &row.tenant_id,
                row.id,
                fence,
                &terminal,
                &[event],
                self.clock.now(),
            )
            .await?;
        Ok(match self.store.invocation(&row.tenant_id, row.id).await? {
            Some(current) if current.status.is_terminal() => recorded(&current),
            _ => unrecorded(row.tool_name.clone(), ReasonCode::ToolConcurrencyConflict),
        })
    }

    async fn approved(&self, row: &InvocationRecord) -> Result<bool, StoreError> {
        let Some(approval_id) = row.approval_id else {
            return Ok(false);
        };
        let approval = self.store.approval(&row.tenant_id, approval_id).await?;
        Ok(approval.is_some_and(|a| a.status == ApprovalStatus::Approved))
    }

    /// Step 9, then steps 10 to 14.
    async fn execute(
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
        let events = [record_event(&row, ToolEventKind::Started)];
        let Some(running) = self
            .store
            .claim_invocation(&request.tenant_id, row.id, fence, self.clock.now(), &events)
            .await?
        else {
            return self.reread(request, row.id).await;
        };
        let fence = running.fence().unwrap_or(fence);
        self.run(request, tool, running, fence).await
    }

    /// Steps 10 to 14 for a RUNNING row held under `fence`.
    async fn run(
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
                .store
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
        let mut effect_sent = row.effect_sent_at.is_some();
        let writer = match self.artifacts.writer(&request.tenant_id, request.run_id) {
            Ok(writer) => writer,
            Err(_) => {
                let failure = ToolFailure::new(
                    ToolFailureKind::Internal,
                    "artifact store unavailable; the tool did not start",
                );
                return self
                    .finish(
                        request,
                        tool,
                        &row,
                        fence,
                        Finish::failure(failure, false),
                        None,
                    )
                    .await;
            }
        };
        if spec.needs_effect_watermark() {
            // The watermark commits before the tool starts; if it cannot, the
            // tool never starts.
            match self
                .store
                .mark_effect_sent(&request.tenant_id, row.id, fence, now)
                .await
            {
                Ok(true) => effect_sent = true,
                Ok(false) => return self.reread(request, row.id).await,
                Err(error) => {
                    tracing::error!(error = %error, call_id = %request.call_id, "effect watermark not committed");
                    let failure = ToolFailure::new(
                        ToolFailureKind::Internal,
                        "effect watermark not committed; the tool did not start",
                    );
                    return self
                        .finish(
                            request,
                            tool,
                            &row,
                            fence,
                            Finish::failure(failure, false),
                            None,
                        )
                        .await;
                }
            }
        }
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
                store: self.store.clone(),
                clock: self.clock.clone(),
                tenant_id: row.tenant_id.clone(),
                id: row.id,
                fence,
            }),
        };
        let started = Instant::now();
        let execution = {
            // Polled on this task: a panic is contained, and a timed-out tool
            // is dropped where it stands; a spawned task would add a hand-off
            // and a wake-up to every call.
            let arguments = row.arguments.clone();
            let execution = match contain(|| Contained(tool.tool.execute(arguments, context))) {
                Some(mut running) => {
                    let ended = tokio::time::timeout(
                        std::time::Duration::from_secs_f64(timeout_seconds.max(0.0)),
                        &mut running,
                    )
                    .await;
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
        // Non-idempotent effects that may have escaped cannot be reported
        // as ordinary failures.
        let may_have_escaped = effect_sent && spec.idempotency == IdempotencyClass::NonIdempotent;
        let finish = match execution {
            Execution::Returned(result) => {
                Finish::from_result(result, resolver.resolved(), may_have_escaped)
            }
            Execution::TimedOut if may_have_escaped => Finish::failure(
                ToolFailure::new(
                    ToolFailureKind::OutcomeUnknown,
                    "timed out after the effect watermark",
                ),
                true,
            ),
            Execution::TimedOut => Finish::failure(
                ToolFailure::new(ToolFailureKind::Timeout, "timed out"),
                false,
            ),
            Execution::Panicked if may_have_escaped => Finish::failure(
                ToolFailure::new(
                    ToolFailureKind::OutcomeUnknown,
                    "the tool panicked after the effect watermark",
                ),
                true,
            ),
            Execution::Panicked => Finish::failure(
                ToolFailure::new(ToolFailureKind::Internal, "the tool panicked"),
                false,
            ),
        };
        self.finish(
            request,
            tool,
            &row,
            fence,
            finish,
            Some((writer, duration_ms)),
        )
        .await
    }

    /// Steps 11 to 14.
    async fn finish(
        &self,
        request: &CallRequest,
        tool: &Arc<RegisteredTool>,
        row: &InvocationRecord,
        fence: Fence,
        finish: Finish,
        executed: Option<(Arc<dyn crate::ports::ArtifactWriter>, i64)>,
    ) -> Result<CallOutcome, StoreError> {
        let spec = &tool.spec;
        let attribution = Attribution {
            source: spec.source,
            tool: &spec.name,
        };
        // 11. Validate the result: schema, size, trust.
        self.reached(Point::ValidateResult, request);
        let secrets = match &finish {
            Finish::Succeeded { secrets, .. } => secrets.clone(),
            Finish::Failed { .. } => Vec::new(),
        };
        let (mut finish, text) = match finish {
            Finish::Succeeded { result, secrets } => {
                let text = output::scrub(&content_text(&result.content), &secrets);
                let invalid = match (&tool.output, &result.structured) {
                    (Some(schema), Some(structured)) => {
                        schema.validate(Value::Object(structured.clone())).is_err()
                    }
                    _ => false,
                };
                let ceiling = output::hard_ceiling(spec.maximum_output_bytes);
                if invalid {
                    (
                        Finish::failure(
                            ToolFailure::new(
                                ToolFailureKind::OutputInvalid,
                                "structured result fails the output schema",
                            ),
                            false,
                        ),
                        text,
                    )
                } else if text.len() as u64 > ceiling {
                    let kept = output::prefix_at_boundary(
                        &text,
                        usize::try_from(ceiling).unwrap_or(usize::MAX),
                    )
                    .to_owned();
                    (
                        Finish::failure(
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
                        Finish::Succeeded {
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
        let output_bytes = text.len() as i64;
        let mut artifact: Option<(Uuid, u64)> = None;
        let mut content: Vec<RenderedPart> = Vec::new();
        let trust = match &finish {
            Finish::Succeeded { result, .. } => {
                result.output_trust.unwrap_or(TrustLevel::ExternalUntrusted)
            }
            _ => TrustLevel::ExternalUntrusted,
        };
        let too_large = matches!(&finish, Finish::Failed { failure, .. } if failure.kind == ToolFailureKind::OutputTooLarge);
        if (matches!(finish, Finish::Succeeded { .. }) || too_large) && output_bytes as u64 > budget
        {
            // The budget is checked with a reference of the real one's length
            // before anything is written: a limit too small to hold it fails
            // without creating an artifact.
            let placeholder = format!("artifact:{}", Uuid::nil());
            match (output::excerpt(&text, budget, &placeholder), &executed) {
                (Err(_), _) => {
                    finish = Finish::failure(
                        ToolFailure::new(
                            ToolFailureKind::OutputTooLarge,
                            "inline budget too small for an excerpt",
                        ),
                        false,
                    );
                }
                (Ok(_), None) => {
                    // A missing artifact writer never silently discards the result.
                    finish = Finish::failure(
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
                        finish = Finish::failure(
                            ToolFailure::new(
                                ToolFailureKind::OutputTooLarge,
                                "artifact store unavailable",
                            ),
                            false,
                        );
                    }
                },
            }
        } else if let Finish::Succeeded { result, .. } = &finish {
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
            Finish::Succeeded { .. } => (ToolOutcomeStatus::Succeeded, None, None),
            Finish::Failed { failure, uncertain } => {
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

        // 13. Persist the result.
        self.reached(Point::PersistResult, request);
        let terminal = TerminalRecord {
            status: outcome_status.invocation_status(),
            outcome_status,
            reason_code,
            result: Some(json!({ "content": content })),
            error,
            output_bytes: executed.as_ref().map(|_| output_bytes),
            truncated: artifact.is_some(),
            artifact: artifact.map(|(id, bytes)| StoredArtifact {
                id,
                media_type: ARTIFACT_MEDIA_TYPE.to_owned(),
                bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
                trust,
            }),
        };
        let mut event = record_event(row, terminal_event(outcome_status));
        event.outcome_status = Some(outcome_status);
        event.reason_code = reason_code;
        event.effect_sent = row.effect_sent_at.is_some() || tool.spec.needs_effect_watermark();
        event.duration_ms = executed.as_ref().map(|(_, ms)| *ms);
        event.output_bytes = terminal.output_bytes;
        event.truncated = terminal.truncated;
        let written = self
            .store
            .complete_invocation(
                &request.tenant_id,
                row.id,
                fence,
                &terminal,
                &[event],
                self.clock.now(),
            )
            .await?;
        if !written {
            // Another worker took the row over while this attempt ran: its
            // record, not this attempt's, is the call's.
            return self.reread(request, row.id).await;
        }
        if let (Finish::Succeeded { result, .. }, None) = (&finish, reason_code)
            && let Some(evidence_key) = &result.evidence_key
        {
            self.store
                .record_evidence(
                    &request.tenant_id,
                    row.run_id,
                    &spec.name,
                    &row.arguments_hash,
                    evidence_key,
                    breaker::MAXIMUM_RESTARTS,
                )
                .await?;
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
            synthesis_only: false,
        }))
    }

    /// A denial or pipeline failure before step 8, recorded as a terminal
    /// row so the step's batch is complete and a replay finds it.
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
        let spec = &tool.spec;
        self.record_refusal(
            request,
            RefusedCall {
                tool_name: &spec.name,
                tool_version: &spec.version,
                tool_source: spec.source,
                server_id: spec.server_id.clone(),
                class: spec.idempotency,
                side_effect: spec.side_effect,
            },
            code,
            detail,
            canonical,
        )
        .await
    }

    async fn refuse_unresolved(&self, request: &CallRequest) -> Result<CallOutcome, StoreError> {
        // No spec: the most restrictive classification stands in.
        self.record_refusal(
            request,
            RefusedCall {
                tool_name: &request.name,
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

    async fn record_refusal(
        &self,
        request: &CallRequest,
        call: RefusedCall<'_>,
        code: ReasonCode,
        detail: Option<Vec<RenderedPart>>,
        validated: Option<(&Value, &str)>,
    ) -> Result<CallOutcome, StoreError> {
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
                .store
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
            server_id: call.server_id,
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
        };
        let mut terminal = identity.event(terminal_event(status));
        terminal.outcome_status = Some(status);
        terminal.reason_code = Some(code);
        let events = [identity.event(ToolEventKind::Proposed), terminal];
        let claim = Claim {
            worker_id: self.worker_id,
            now: self.clock.now(),
        };
        let row = match self.store.insert_invocation(&new, claim, &events).await? {
            InsertOutcome::Inserted(row) | InsertOutcome::Existing(row) => row,
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

    /// Recovery: takes over the rows of dead workers, a batch at a time, and
    /// re-enters the one pipeline function with each.
    pub async fn recover(&self, batch: i64) -> Result<RecoveryReport, StoreError> {
        let mut report = RecoveryReport::default();
        loop {
            let claim = Claim {
                worker_id: self.worker_id,
                now: self.clock.now(),
            };
            let rows = self.store.claim_expired(claim, batch).await?;
            if rows.is_empty() {
                return Ok(report);
            }
            for row in rows {
                report.taken += 1;
                if self.recover_one(row).await?.status() == Some(ToolOutcomeStatus::Uncertain) {
                    report.uncertain += 1;
                }
            }
        }
    }

    async fn recover_one(&self, row: InvocationRecord) -> Result<CallOutcome, StoreError> {
        let fence = row.fence();
        let Some(pinned) = self.registry.pin_exact(&row.tool_name, &row.tool_version) else {
            // The build no longer has the tool: nothing can run it again.
            let code = ending_code(&row, ReasonCode::ToolWithdrawn);
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
        };
        Ok(self.call(request).await)
    }
}

/// The classification a refused call is recorded under.
struct RefusedCall<'a> {
    tool_name: &'a str,
    tool_version: &'a str,
    tool_source: ToolSource,
    server_id: Option<String>,
    class: IdempotencyClass,
    side_effect: SideEffectClass,
}

/// How a call ended before its result is validated and stored.
/// How a suspended control tool ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// The user replied, or the child run finished, with this text.
    Answered {
        /// The reply or the child's result.
        text: String,
    },
    /// The run was cancelled while the call waited.
    RunCancelled,
}

/// The control tools that suspend, and the marker each leaves on its row.
pub const SUSPENDING: &[(&str, &str)] = &[
    ("conversation.ask_user", "user_input"),
    ("delegate.run", "child_run"),
];

/// Runs tool code (its `execute`, its destructor) so that a panic in it is
/// `None` rather than an unwinding pipeline.
fn contain<T>(run: impl FnOnce() -> T) -> Option<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).ok()
}

/// A tool's future whose panic ends it with `None` instead of unwinding
/// through the pipeline.
struct Contained<'a>(BoxFuture<'a, ToolResult>);

impl std::future::Future for Contained<'_> {
    type Output = Option<ToolResult>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let running = &mut self.0;
        // A future that panicked is never polled again.
        match contain(|| running.as_mut().poll(cx)) {
            Some(std::task::Poll::Ready(result)) => std::task::Poll::Ready(Some(result)),
            Some(std::task::Poll::Pending) => std::task::Poll::Pending,
            None => std::task::Poll::Ready(None),
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

/// The registry name of the wrapper ADR-0123 adds.
pub const TOOL_CALL: &str = "tool.call";

/// What `tool.call` unwrapping decided.
enum Unwrap {
    /// Not a tool.call.
    Plain,
    /// The call, as the tool it names.
    Into(Box<CallRequest>),
    /// The wrapper was refused; this is the recorded outcome.
    Refused(CallOutcome),
}

enum Finish {
    Succeeded {
        result: ToolResult,
        secrets: Vec<SecretValue>,
    },
    Failed {
        failure: ToolFailure,
        uncertain: bool,
    },
}

impl Finish {
    fn failure(failure: ToolFailure, uncertain: bool) -> Finish {
        let uncertain = uncertain || failure.kind == ToolFailureKind::OutcomeUnknown;
        Finish::Failed { failure, uncertain }
    }

    fn from_result(
        result: ToolResult,
        secrets: Vec<SecretValue>,
        may_have_escaped: bool,
    ) -> Finish {
        match result.failure {
            None => Finish::Succeeded { result, secrets },
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
                Finish::failure(failure, uncertain)
            }
        }
    }
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

/// The terminal event of a row that ends with `code` and no result.
fn ended_event(row: &InvocationRecord, code: ReasonCode) -> ToolEvent {
    let status = code.status();
    let mut event = record_event(row, terminal_event(status));
    event.outcome_status = Some(status);
    event.reason_code = Some(code);
    event
}

fn denied_event(identity: &Identity<'_>, code: ReasonCode) -> ToolEvent {
    let mut event = identity.event(ToolEventKind::Denied);
    event.outcome_status = Some(ToolOutcomeStatus::Denied);
    event.reason_code = Some(code);
    event
}

/// The outcome a terminal row records, as the model read it the first time.
fn recorded(row: &InvocationRecord) -> CallOutcome {
    let outcome = match (row.outcome_status, row.reason_code) {
        (Some(ToolOutcomeStatus::Succeeded), _) => ToolOutcome::Succeeded {
            action: row.tool_name.clone(),
        },
        (_, Some(code)) => ToolOutcome::not_succeeded(row.tool_name.clone(), code),
        _ => ToolOutcome::not_succeeded(row.tool_name.clone(), ReasonCode::ToolInternalError),
    };
    let content = row
        .result
        .as_ref()
        .and_then(|result| result.get("content"))
        .and_then(|content| serde_json::from_value::<Vec<StoredPart>>(content.clone()).ok())
        .map(|parts| parts.into_iter().map(StoredPart::into_rendered).collect())
        .unwrap_or_default();
    CallOutcome::Finished(Finished {
        invocation_id: Some(row.id),
        outcome,
        content,
        synthesis_only: false,
    })
}

/// A rendered part as stored in `result`.
#[derive(serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StoredPart {
    Text { text: String, trust: TrustLevel },
    Artifact { artifact_id: String, bytes: u64 },
}

impl StoredPart {
    fn into_rendered(self) -> RenderedPart {
        match self {
            StoredPart::Text { text, trust } => RenderedPart::Text { text, trust },
            StoredPart::Artifact { artifact_id, bytes } => {
                RenderedPart::Artifact { artifact_id, bytes }
            }
        }
    }
}

/// An outcome for a submission that wrote no row of its own.
fn unrecorded(action: String, code: ReasonCode) -> CallOutcome {
    CallOutcome::Finished(Finished {
        invocation_id: None,
        outcome: ToolOutcome::not_succeeded(action, code),
        content: Vec::new(),
        synthesis_only: false,
    })
}

fn content_text(content: &[ContentPart]) -> String {
    let texts: Vec<&str> = content
        .iter()
        .filter_map(|part| match part {
            ContentPart::Text { text } => Some(text.as_str()),
            ContentPart::Artifact(_) => None,
        })
        .collect();
    texts.join("\n")
}

fn render_text(text: &str, trust: TrustLevel, attribution: &Attribution<'_>) -> RenderedPart {
    if trust <= TrustLevel::ExternalUntrusted {
        RenderedPart::Text {
            text: output::envelope(text, attribution, &nonce()),
            trust,
        }
    } else {
        RenderedPart::Text {
            text: text.to_owned(),
            trust,
        }
    }
}

fn nonce() -> String {
    Uuid::new_v4().simple().to_string()
}

fn system_time(now: DateTime<Utc>, seconds: f64) -> std::time::SystemTime {
    let now: std::time::SystemTime = now.into();
    if seconds.is_finite() {
        now + std::time::Duration::from_secs_f64(seconds.max(0.0))
    } else {
        now + std::time::Duration::from_secs(365 * 24 * 3600)
    }
}
