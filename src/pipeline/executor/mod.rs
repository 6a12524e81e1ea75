//! The one pipeline function: every call, from every entry point, runs
//! through [`Pipeline::call`]. Fourteen steps in the design document's order,
//! with its four commits (intent, claim, result, and the watermark between),
//! and no transaction open across tool I/O.
//!
//! Recovery re-enters the same function with the row it took over, so
//! authority is re-checked by steps 1 to 6 and the recovery table is applied
//! where deduplication meets the row.

mod authorize;
mod decide;
mod dedup;
mod execute;
mod intent;
mod recovery;
mod refusals;
mod settle;
mod suspended;
mod unrecorded;

use std::sync::Arc;

use uuid::Uuid;

use super::call::{CallOutcome, CallRequest, PipelineSettings, Point, StepObserver};
use super::limits::{RateLimitSettings, RateLimits};
use super::output::RenderedPart;
use super::records::unrecorded;
use super::registry::ToolRegistry;
use super::runs::RunOwners;
use super::settlement::Settler;
use super::worker::Lease;
use crate::domain::ReasonCode;
use crate::ports::{
    ApprovalStore, ArtifactStore, Clock, CredentialResolver, EventStore, InvocationStore,
    McpServers, PolicyEngine,
};

/// The executor and what it stands on.
pub struct Pipeline {
    registry: Arc<ToolRegistry>,
    invocations: Arc<dyn InvocationStore>,
    approvals: Arc<dyn ApprovalStore>,
    events: Arc<dyn EventStore>,
    policy: Arc<dyn PolicyEngine>,
    artifacts: Arc<dyn ArtifactStore>,
    credentials: Arc<dyn CredentialResolver>,
    clock: Arc<dyn Clock>,
    observer: Arc<dyn StepObserver>,
    mcp: Option<Arc<dyn McpServers>>,
    lease: Arc<Lease>,
    settler: Settler,
    settings: PipelineSettings,
    owners: RunOwners,
    limits: RateLimits,
    /// toolgate's consent page for a server, less the server's id; none
    /// while consent is not served.
    consent_pages: Option<String>,
}

/// The parts of a pipeline, as the composition root wires them.
pub struct PipelineParts {
    /// Resolution and specs.
    pub registry: Arc<ToolRegistry>,
    /// The invocation rows the four commits write.
    pub invocations: Arc<dyn InvocationStore>,
    /// Approvals, read when a waiting call resumes.
    pub approvals: Arc<dyn ApprovalStore>,
    /// Where what the pipeline decides beside a call's row is told (a
    /// replay that diverged).
    pub events: Arc<dyn EventStore>,
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
    /// This process's worker lease as it sees it: the worker new claims
    /// are made under, and nothing is claimed while it is not live.
    pub lease: Arc<Lease>,
    /// Settings.
    pub settings: PipelineSettings,
}

impl Pipeline {
    /// A pipeline over its parts.
    pub fn new(parts: PipelineParts) -> Self {
        Pipeline {
            registry: parts.registry,
            invocations: parts.invocations.clone(),
            approvals: parts.approvals,
            events: parts.events,
            policy: parts.policy,
            artifacts: parts.artifacts,
            credentials: parts.credentials,
            clock: parts.clock,
            observer: parts.observer,
            mcp: parts.mcp,
            lease: parts.lease,
            settler: Settler::new(parts.invocations.clone()),
            settings: parts.settings,
            owners: RunOwners::default(),
            limits: RateLimits::new(RateLimitSettings::default(), None),
            consent_pages: None,
        }
    }

    /// This pipeline sending a call that needs a principal's consent to
    /// `pages` followed by the server's id.
    pub fn with_consent_pages(mut self, pages: String) -> Self {
        self.consent_pages = Some(pages);
        self
    }

    /// This pipeline with the operator's rate limits, counted in `metrics`.
    pub fn with_rate_limits(
        mut self,
        settings: RateLimitSettings,
        metrics: Arc<dyn crate::ports::Metrics>,
    ) -> Self {
        self.limits = RateLimits::new(settings, Some(metrics));
        self
    }

    /// Whether a call or turn of `principal_id` in `tenant_id` may write run
    /// `run_id`: a run is its opener's, and is opened by this question
    /// when nobody has opened it yet.
    pub async fn owns_run(
        &self,
        tenant_id: &str,
        principal_id: &str,
        session_id: Uuid,
        run_id: Uuid,
    ) -> Result<bool, crate::ports::StoreError> {
        let opener = crate::ports::RunOwner {
            run_id,
            tenant_id: tenant_id.to_owned(),
            principal_id: principal_id.to_owned(),
            session_id,
            opened_at: self.clock.now(),
        };
        self.owners.admits(self.invocations.as_ref(), &opener).await
    }

    /// The worker this pipeline claims new rows under now.
    pub fn worker_id(&self) -> Uuid {
        self.lease.worker_id()
    }

    /// One step of a run's recorded calls, what a replayed turn compares
    /// its calls with.
    pub async fn step_calls(
        &self,
        tenant_id: &str,
        run_id: Uuid,
        step_number: i64,
    ) -> Result<Vec<crate::ports::InvocationRecord>, crate::ports::StoreError> {
        self.invocations
            .step_invocations(tenant_id, run_id, step_number)
            .await
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
            // The batch's id as its text; a call outside a batch has none.
            tool.parallel_group = request.parallel_group.map(tracing::field::display),
        );
        let started = tokio::time::Instant::now();
        let outcome = self.call_steps(&request).instrument(span.clone()).await;
        if let CallOutcome::Finished(finished) = &outcome {
            span.record("tool.outcome_status", finished.outcome.status().as_str());
            if let Some(code) = finished.outcome.reason_code() {
                span.record("tool.reason_code", code.as_str());
            }
            // One line per finished call: identity, status and time only.
            tracing::info!(
                invocation_id = finished.invocation_id.map(tracing::field::display),
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
        if let Some(refused) = self.refused_unrecorded(request).await {
            return refused;
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
}

/// "In progress": the row is another worker's, or moved under this one;
/// the same call asked again resolves it.
fn in_progress(action: &str) -> CallOutcome {
    unrecorded(action.to_owned(), ReasonCode::ToolConcurrencyConflict)
}
