//! A `Store` that counts the document's tool metrics from the terminal tool
//! events it commits: a count exists exactly when its event does.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::domain::{ApprovalStatus, ToolEventKind};
use crate::ports::metrics::{Labels, Metrics};
use crate::ports::{
    ApprovalRecord, BoxFuture, BreakerTally, CatalogRow, Claim, EventRecord, Fence, InsertOutcome,
    InvocationRecord, McpServerRow, NewInvocation, PlatformEvent, PreparationRecord, ReviewRecord,
    SessionRecord, Store, StoreError, StoredArtifact, TerminalRecord, ToolEvent, WorkerLease,
};

/// Wraps a store; every write that commits tool events counts them.
pub struct MeteredStore {
    inner: Arc<dyn Store>,
    metrics: Arc<Metrics>,
}

impl MeteredStore {
    /// `inner`, counted into `metrics`.
    pub fn new(inner: Arc<dyn Store>, metrics: Arc<Metrics>) -> Self {
        MeteredStore { inner, metrics }
    }
}

/// Counts the terminal events among `events`.
fn count(metrics: &Metrics, events: &[ToolEvent]) {
    for event in events {
        let terminal = matches!(
            event.kind,
            ToolEventKind::Completed
                | ToolEventKind::Failed
                | ToolEventKind::Uncertain
                | ToolEventKind::Denied
        );
        let Some(status) = event.outcome_status.filter(|_| terminal) else {
            continue;
        };
        let tool: Labels = vec![
            ("name", event.tool_name.clone()),
            ("source", event.tool_source.as_str().to_owned()),
        ];
        let mut labels = tool.clone();
        labels.push(("outcome_status", status.as_str().to_owned()));
        metrics.increment("tool_calls_total", labels);
        if let Some(code) = event.reason_code {
            let mut labels = tool.clone();
            labels.push(("reason_code", code.as_str().to_owned()));
            metrics.increment("tool_failures_total", labels);
        }
        if event.kind == ToolEventKind::Uncertain {
            metrics.increment("tool_uncertain_total", tool.clone());
        }
        if event.truncated {
            metrics.increment("tool_truncations_total", tool.clone());
        }
        if let Some(duration_ms) = event.duration_ms {
            metrics.observe(
                "tool_duration_seconds",
                tool.clone(),
                duration_ms as f64 / 1000.0,
            );
        }
        if let Some(bytes) = event.output_bytes {
            metrics.observe("tool_output_bytes", tool, bytes as f64);
        }
    }
}

macro_rules! delegate {
    ($($name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty;)*) => {
        $(fn $name<'a>(&'a self, $($arg: $ty),*) -> BoxFuture<'a, $ret> { self.inner.$name($($arg),*) })*
    };
}

impl Store for MeteredStore {
    delegate! {
        pending_migrations() -> Result<Vec<i64>, StoreError>;
        migrate() -> Result<Vec<i64>, StoreError>;
        register_worker(lease: &'a WorkerLease) -> Result<(), StoreError>;
        heartbeat(worker_id: Uuid, until: DateTime<Utc>) -> Result<bool, StoreError>;
        release_worker(worker_id: Uuid, now: DateTime<Utc>) -> Result<(), StoreError>;
        worker(worker_id: Uuid) -> Result<Option<WorkerLease>, StoreError>;
        mark_effect_sent(tenant: &'a str, id: Uuid, fence: Fence, now: DateTime<Utc>) -> Result<bool, StoreError>;
        invocation(tenant: &'a str, id: Uuid) -> Result<Option<InvocationRecord>, StoreError>;
        run_invocations(tenant: &'a str, run_id: Uuid) -> Result<Vec<InvocationRecord>, StoreError>;
        claim_expired(claim: Claim, limit: i64) -> Result<Vec<InvocationRecord>, StoreError>;
        take_over(tenant: &'a str, id: Uuid, claim: Claim) -> Result<Option<InvocationRecord>, StoreError>;
        approval(tenant: &'a str, id: Uuid) -> Result<Option<ApprovalRecord>, StoreError>;
        pending_approvals(tenant: &'a str) -> Result<Vec<ApprovalRecord>, StoreError>;
        decide_approval(tenant: &'a str, id: Uuid, status: ApprovalStatus, approver: &'a str, now: DateTime<Utc>) -> Result<Option<ApprovalRecord>, StoreError>;
        breaker_tally(tenant: &'a str, run_id: Uuid, tool: &'a str, hash: &'a str) -> Result<BreakerTally, StoreError>;
        record_evidence(tenant: &'a str, run_id: Uuid, tool: &'a str, hash: &'a str, key: &'a str, maximum: i32) -> Result<bool, StoreError>;
        artifact(tenant: &'a str, id: Uuid) -> Result<Option<StoredArtifact>, StoreError>;
        record_preparation(tenant: &'a str, record: &'a PreparationRecord, now: DateTime<Utc>) -> Result<Vec<bool>, StoreError>;
        record_event(tenant: Option<&'a str>, event: &'a PlatformEvent, now: DateTime<Utc>) -> Result<(), StoreError>;
        catalog_history(tenant: &'a str, server: &'a str) -> Result<Vec<CatalogRow>, StoreError>;
        suspend_invocation(tenant: &'a str, id: Uuid, fence: Fence, kind: &'a str, reference: &'a str) -> Result<bool, StoreError>;
        open_session(session: &'a SessionRecord) -> Result<SessionRecord, StoreError>;
        session(session_id: Uuid) -> Result<Option<SessionRecord>, StoreError>;
        touch_session(session_id: Uuid, now: DateTime<Utc>) -> Result<(), StoreError>;
        forget_sessions(before: DateTime<Utc>) -> Result<u64, StoreError>;
        put_mcp_server(tenant: &'a str, server: &'a McpServerRow, now: DateTime<Utc>) -> Result<(), StoreError>;
        mcp_server(tenant: &'a str, server_id: &'a str) -> Result<Option<McpServerRow>, StoreError>;
        delete_mcp_server(tenant: &'a str, server_id: &'a str) -> Result<bool, StoreError>;
        review_queue(tenant: &'a str, limit: i64) -> Result<Vec<InvocationRecord>, StoreError>;
        resolve_review(tenant: &'a str, review: &'a ReviewRecord) -> Result<bool, StoreError>;
        events_after(after: i64, limit: i64) -> Result<Vec<EventRecord>, StoreError>;
    }

    fn insert_invocation<'a>(
        &'a self,
        new: &'a NewInvocation,
        claim: Claim,
        events: &'a [ToolEvent],
    ) -> BoxFuture<'a, Result<InsertOutcome, StoreError>> {
        Box::pin(async move {
            let outcome = self.inner.insert_invocation(new, claim, events).await?;
            if matches!(outcome, InsertOutcome::Inserted(_)) {
                count(&self.metrics, events);
            }
            Ok(outcome)
        })
    }

    fn authorize_waiting<'a>(
        &'a self,
        tenant: &'a str,
        id: Uuid,
        claim: Claim,
        events: &'a [ToolEvent],
    ) -> BoxFuture<'a, Result<Option<InvocationRecord>, StoreError>> {
        Box::pin(async move {
            let row = self
                .inner
                .authorize_waiting(tenant, id, claim, events)
                .await?;
            if row.is_some() {
                count(&self.metrics, events);
            }
            Ok(row)
        })
    }

    fn settle_waiting<'a>(
        &'a self,
        tenant: &'a str,
        id: Uuid,
        terminal: &'a TerminalRecord,
        events: &'a [ToolEvent],
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let written = self
                .inner
                .settle_waiting(tenant, id, terminal, events, now)
                .await?;
            if written {
                count(&self.metrics, events);
            }
            Ok(written)
        })
    }

    fn claim_invocation<'a>(
        &'a self,
        tenant: &'a str,
        id: Uuid,
        fence: Fence,
        now: DateTime<Utc>,
        events: &'a [ToolEvent],
    ) -> BoxFuture<'a, Result<Option<InvocationRecord>, StoreError>> {
        Box::pin(async move {
            let row = self
                .inner
                .claim_invocation(tenant, id, fence, now, events)
                .await?;
            if row.is_some() {
                count(&self.metrics, events);
            }
            Ok(row)
        })
    }

    fn complete_suspended<'a>(
        &'a self,
        tenant: &'a str,
        id: Uuid,
        terminal: &'a TerminalRecord,
        events: &'a [ToolEvent],
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let written = self
                .inner
                .complete_suspended(tenant, id, terminal, events, now)
                .await?;
            if written {
                count(&self.metrics, events);
            }
            Ok(written)
        })
    }

    fn complete_invocation<'a>(
        &'a self,
        tenant: &'a str,
        id: Uuid,
        fence: Fence,
        terminal: &'a TerminalRecord,
        events: &'a [ToolEvent],
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let written = self
                .inner
                .complete_invocation(tenant, id, fence, terminal, events, now)
                .await?;
            if written {
                count(&self.metrics, events);
            }
            Ok(written)
        })
    }
}
