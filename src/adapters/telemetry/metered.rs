//! An invocation store that counts the document's tool metrics from the
//! terminal tool events it commits: a count exists exactly when its event
//! does.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::domain::{Durability, ReasonCode, SuspensionKind, ToolEventKind};
use crate::ports::metrics::{Labels, Metrics};
use crate::ports::{
    ArtifactRecord, BoxFuture, BreakerTally, Claim, Fence, Held, InsertOutcome, InvocationRecord,
    InvocationStore, NewInvocation, RunOwner, StoreError, TerminalRecord, ToolEvent,
};

/// Wraps the invocation store; every write that commits tool events counts
/// them.
pub struct MeteredInvocations {
    inner: Arc<dyn InvocationStore>,
    metrics: Arc<dyn Metrics>,
}

impl MeteredInvocations {
    /// `inner`, counted into `metrics`.
    pub fn new(inner: Arc<dyn InvocationStore>, metrics: Arc<dyn Metrics>) -> Self {
        MeteredInvocations { inner, metrics }
    }
}

/// The `name` every call of a name no tool has is counted under.
pub const UNKNOWN_TOOL: &str = "unknown";

/// Records how long one of the hot path's commits took.
fn commit_time(metrics: &dyn Metrics, operation: &str, started: tokio::time::Instant) {
    metrics.observe(
        "store_commit_seconds",
        vec![("operation", operation.to_owned())],
        started.elapsed().as_secs_f64(),
    );
}

/// Counts the terminal events among `events`.
fn count(metrics: &dyn Metrics, events: &[ToolEvent]) {
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
        // A name no tool has is a caller's text: it never becomes a label.
        let name = if event.reason_code == Some(ReasonCode::PolicyMatrixUnknownTool) {
            UNKNOWN_TOOL.to_owned()
        } else {
            event.tool_name.clone()
        };
        let tool: Labels = vec![
            ("name", name),
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

impl InvocationStore for MeteredInvocations {
    delegate! {
        open_run(run: &'a RunOwner) -> Result<RunOwner, StoreError>;
        invocation(tenant: &'a str, id: Uuid) -> Result<Option<InvocationRecord>, StoreError>;
        run_invocations(tenant: &'a str, run_id: Uuid) -> Result<Vec<InvocationRecord>, StoreError>;
        step_invocations(tenant: &'a str, run_id: Uuid, step: i64) -> Result<Vec<InvocationRecord>, StoreError>;
        latest_succeeded(tenant: &'a str, run_id: Uuid, tool: &'a str) -> Result<Option<InvocationRecord>, StoreError>;
        waiting_call(tenant: &'a str, run_id: Uuid, tool: &'a str, hash: &'a str) -> Result<Option<InvocationRecord>, StoreError>;
        claim_expired(claim: Claim, limit: i64) -> Result<Vec<Held>, StoreError>;
        take_over(tenant: &'a str, id: Uuid, claim: Claim) -> Result<Option<Held>, StoreError>;
        breaker_tally(tenant: &'a str, run_id: Uuid, tool: &'a str, hash: &'a str) -> Result<BreakerTally, StoreError>;
        record_evidence(tenant: &'a str, run_id: Uuid, tool: &'a str, hash: &'a str, key: &'a str, maximum: i32) -> Result<bool, StoreError>;
        artifact(tenant: &'a str, id: Uuid) -> Result<Option<ArtifactRecord>, StoreError>;
        mark_synthesis_only(tenant: &'a str, run_id: Uuid, step: i64) -> Result<(), StoreError>;
        release_invocation(tenant: &'a str, id: Uuid, fence: Fence) -> Result<bool, StoreError>;
        suspend_invocation(tenant: &'a str, id: Uuid, fence: Fence, kind: SuspensionKind, reference: &'a str) -> Result<bool, StoreError>;
        reopen_approval(tenant: &'a str, id: Uuid, fence: Fence, approval: Uuid, code: ReasonCode, now: DateTime<Utc>) -> Result<bool, StoreError>;
    }

    fn mark_effect_sent<'a>(
        &'a self,
        tenant: &'a str,
        id: Uuid,
        fence: Fence,
        now: DateTime<Utc>,
        durability: Durability,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let started = tokio::time::Instant::now();
            let marked = self
                .inner
                .mark_effect_sent(tenant, id, fence, now, durability)
                .await?;
            commit_time(self.metrics.as_ref(), "watermark", started);
            Ok(marked)
        })
    }

    fn insert_invocation<'a>(
        &'a self,
        new: &'a NewInvocation,
        claim: Claim,
        events: &'a [ToolEvent],
    ) -> BoxFuture<'a, Result<InsertOutcome, StoreError>> {
        Box::pin(async move {
            let started = tokio::time::Instant::now();
            let outcome = self.inner.insert_invocation(new, claim, events).await?;
            commit_time(self.metrics.as_ref(), "insert", started);
            if matches!(outcome, InsertOutcome::Inserted(_)) {
                count(self.metrics.as_ref(), events);
            }
            Ok(outcome)
        })
    }

    fn insert_uncounted<'a>(
        &'a self,
        new: &'a NewInvocation,
        claim: Claim,
        events: &'a [ToolEvent],
    ) -> BoxFuture<'a, Result<Option<Held>, StoreError>> {
        Box::pin(async move {
            let started = tokio::time::Instant::now();
            let row = self.inner.insert_uncounted(new, claim, events).await?;
            // Only an insert is an insert's commit: an attempt that wrote
            // nothing is followed by the usual insert, timed there.
            if row.is_some() {
                commit_time(self.metrics.as_ref(), "insert", started);
                count(self.metrics.as_ref(), events);
            }
            Ok(row)
        })
    }

    fn authorize_waiting<'a>(
        &'a self,
        tenant: &'a str,
        id: Uuid,
        claim: Claim,
        events: &'a [ToolEvent],
    ) -> BoxFuture<'a, Result<Option<Held>, StoreError>> {
        Box::pin(async move {
            let row = self
                .inner
                .authorize_waiting(tenant, id, claim, events)
                .await?;
            if row.is_some() {
                count(self.metrics.as_ref(), events);
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
                count(self.metrics.as_ref(), events);
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
        durability: Durability,
    ) -> BoxFuture<'a, Result<Option<Held>, StoreError>> {
        Box::pin(async move {
            let started = tokio::time::Instant::now();
            let row = self
                .inner
                .claim_invocation(tenant, id, fence, now, events, durability)
                .await?;
            commit_time(self.metrics.as_ref(), "claim", started);
            if row.is_some() {
                count(self.metrics.as_ref(), events);
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
                count(self.metrics.as_ref(), events);
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
            let started = tokio::time::Instant::now();
            let written = self
                .inner
                .complete_invocation(tenant, id, fence, terminal, events, now)
                .await?;
            commit_time(self.metrics.as_ref(), "complete", started);
            if written {
                count(self.metrics.as_ref(), events);
            }
            Ok(written)
        })
    }
}
