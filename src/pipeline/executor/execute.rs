//! Steps 9 and 10: the claim, the suspension or the watermark, and the
//! tool run under its deadline.

use std::sync::{Arc, Mutex};
use tokio::time::Instant;
use uuid::Uuid;

use super::Pipeline;
use super::decide::{Conclusion, Execution, may_have_escaped};
use crate::domain::{
    Durability, SecretValue, SuspensionKind, ToolEventKind, ToolFailure, ToolFailureKind, ToolKind,
    ToolSpec,
};
use crate::pipeline::breaker;
use crate::pipeline::call::{CallOutcome, CallRequest, Point, SUSPENDING};
use crate::pipeline::guard::{Contained, RecordingResolver, StoreWatermark, contain, system_time};
use crate::pipeline::records::row_event;
use crate::pipeline::registry::RegisteredTool;
use crate::ports::{
    ArtifactWriter, BreakerTally, CancellationToken, ExecutionTarget, Held, StoreError,
    ToolExecutionContext,
};

impl Pipeline {
    /// Runs a row inserted already claimed, `tally` being the breaker's
    /// counts from before it.
    pub(super) async fn start(
        &self,
        request: &CallRequest,
        tool: &Arc<RegisteredTool>,
        held: Held,
        arguments_hash: &str,
        tally: BreakerTally,
    ) -> Result<CallOutcome, StoreError> {
        self.reached(Point::Claim, request);
        let outcome = self.run_claimed(request, tool, held).await?;
        self.with_synthesis_flag(request, &tool.spec.name, arguments_hash, tally, outcome)
            .await
    }

    /// Sets `synthesis_only` on a call that just ran. The count after it is
    /// the count before plus this outcome; only when that reaches one below
    /// the threshold is the store asked again, since evidence restarts can
    /// only have lowered it.
    pub(super) async fn with_synthesis_flag(
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
            // Kept in the store, so the run's later steps are refused on
            // every node and after a restart, whatever the caller does with
            // the flag.
            if finished.synthesis_only
                && let Err(error) = self
                    .invocations
                    .mark_synthesis_only(&request.tenant_id, request.run_id, request.step_number)
                    .await
            {
                tracing::warn!(error = %error, "the run's synthesis-only step was not recorded");
            }
        }
        Ok(outcome)
    }

    /// Step 9 on an AUTHORIZED row this worker holds, then steps 10 to 14.
    pub(super) async fn claim_then_run(
        &self,
        request: &CallRequest,
        tool: &Arc<RegisteredTool>,
        authorized: Held,
    ) -> Result<CallOutcome, StoreError> {
        self.reached(Point::Claim, request);
        let events = [row_event(&authorized, ToolEventKind::Started)];
        let Some(running) = self
            .invocations
            .claim_invocation(
                &request.tenant_id,
                authorized.identity.id,
                authorized.fence,
                self.clock.now(),
                &events,
                Durability::of_tool(&tool.spec),
            )
            .await?
        else {
            return self.reread(request, authorized.identity.id).await;
        };
        self.run_claimed(request, tool, running).await
    }

    /// Steps 10 to 14 for a RUNNING row this worker holds.
    pub(super) async fn run_claimed(
        &self,
        request: &CallRequest,
        tool: &Arc<RegisteredTool>,
        row: Held,
    ) -> Result<CallOutcome, StoreError> {
        let spec = &tool.spec;
        // 10. Execute with the effective timeout.
        self.reached(Point::Execute, request);
        if let Some(kind) = suspension(spec) {
            return self.suspend(request, &row, kind).await;
        }
        let remaining = row
            .identity
            .deadline_at
            .map(|deadline| {
                (deadline - self.clock.now())
                    .to_std()
                    .unwrap_or_default()
                    .as_secs_f64()
            })
            .unwrap_or(f64::INFINITY);
        let timeout_seconds = f64::from(spec.timeout_seconds).min(remaining);
        // One absolute deadline for the watermark's commit and the tool.
        let deadline = tokio::time::Instant::now()
            + std::time::Duration::from_secs_f64(timeout_seconds.max(0.0));
        let mut effect_sent = row.effect_sent_at.is_some();
        let not_started = |failure: ToolFailure, effect_sent: bool| {
            (
                Conclusion::failure(failure, false),
                Attempt {
                    executed: None,
                    effect_sent,
                },
            )
        };
        let writer = match self.artifacts.writer(&request.tenant_id, request.run_id) {
            Ok(writer) => writer,
            Err(_) => {
                let (finish, attempt) = not_started(
                    ToolFailure::new(
                        ToolFailureKind::Internal,
                        "artifact store unavailable; the tool did not start",
                    ),
                    effect_sent,
                );
                return self.settle(request, tool, &row, finish, attempt).await;
            }
        };
        if spec.needs_effect_watermark() {
            match self.commit_watermark(request, spec, &row, deadline).await {
                Watermark::Committed => effect_sent = true,
                Watermark::Lost => return self.reread(request, row.identity.id).await,
                Watermark::NotCommitted(failure) => {
                    let (finish, attempt) = not_started(failure, effect_sent);
                    return self.settle(request, tool, &row, finish, attempt).await;
                }
            }
        }
        self.reached(Point::WatermarkCommitted, request);
        let started = Instant::now();
        let (execution, secrets) = self
            .invoke(request, tool, &row, deadline, writer.clone())
            .await;
        let duration_ms = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
        let finish = Conclusion::of(
            execution,
            secrets,
            may_have_escaped(spec.idempotency, effect_sent),
        );
        let attempt = Attempt {
            executed: Some((writer, duration_ms)),
            effect_sent,
        };
        self.settle(request, tool, &row, finish, attempt).await
    }

    /// A suspending control tool: the await happens elsewhere; the row
    /// stays RUNNING with its marker, the lease is released, and the answer
    /// completes it.
    async fn suspend(
        &self,
        request: &CallRequest,
        row: &Held,
        kind: SuspensionKind,
    ) -> Result<CallOutcome, StoreError> {
        let reference = Uuid::new_v4().to_string();
        let suspended = self
            .invocations
            .suspend_invocation(
                &request.tenant_id,
                row.identity.id,
                row.fence,
                kind,
                &reference,
            )
            .await?;
        if !suspended {
            return self.reread(request, row.identity.id).await;
        }
        Ok(CallOutcome::Suspended {
            invocation_id: row.identity.id,
            kind,
            reference,
        })
    }

    /// The watermark commits before the tool starts, within the call's
    /// deadline; if it cannot, the tool never starts.
    async fn commit_watermark(
        &self,
        request: &CallRequest,
        spec: &ToolSpec,
        row: &Held,
        deadline: tokio::time::Instant,
    ) -> Watermark {
        let marked = tokio::time::timeout_at(
            deadline,
            self.invocations.mark_effect_sent(
                &request.tenant_id,
                row.identity.id,
                row.fence,
                self.clock.now(),
                Durability::of_watermark(spec),
            ),
        )
        .await;
        match marked {
            Ok(Ok(true)) => Watermark::Committed,
            Ok(Ok(false)) => Watermark::Lost,
            Ok(Err(error)) => {
                tracing::error!(error = %error, call_id = %request.call_id, "effect watermark not committed");
                Watermark::NotCommitted(ToolFailure::new(
                    ToolFailureKind::Internal,
                    "effect watermark not committed; the tool did not start",
                ))
            }
            Err(_) => Watermark::NotCommitted(ToolFailure::new(
                ToolFailureKind::Timeout,
                "the deadline passed before the effect watermark committed; the tool did not start",
            )),
        }
    }

    /// The tool itself, until `deadline`: how it ended, and the secrets it
    /// resolved (which its output is scrubbed of).
    async fn invoke(
        &self,
        request: &CallRequest,
        tool: &Arc<RegisteredTool>,
        row: &Held,
        deadline: tokio::time::Instant,
        writer: Arc<dyn ArtifactWriter>,
    ) -> (Execution, Vec<SecretValue>) {
        let spec = &tool.spec;
        // What is left of the deadline is the tool's.
        let timeout_seconds = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .as_secs_f64();
        let resolver = Arc::new(RecordingResolver {
            inner: self.credentials.clone(),
            resolved: Mutex::new(Vec::new()),
        });
        let cancellation = CancellationToken::new();
        let context = ToolExecutionContext {
            invocation_id: row.identity.id,
            call_id: row.identity.call_id.clone(),
            run_id: row.identity.run_id,
            session_id: row.identity.session_id,
            tenant_id: row.identity.tenant_id.clone(),
            principal: row.identity.principal.clone(),
            step_number: u64::try_from(row.identity.step_number).unwrap_or_default(),
            attempt_number: u32::try_from(row.attempt_number).unwrap_or(1),
            idempotency_key: row.identity.idempotency_key.clone(),
            deadline_at: system_time(self.clock.now(), timeout_seconds),
            timeout_seconds,
            maximum_output_bytes: spec.maximum_output_bytes,
            target: ExecutionTarget {
                kind: spec.target_kind,
                server_id: spec.server_id.clone(),
                device_id: spec.device_id.clone(),
            },
            workspace: None,
            artifacts: writer,
            credentials: resolver.clone(),
            cancellation: cancellation.clone(),
            mark_effect_sent: Arc::new(StoreWatermark {
                store: self.invocations.clone(),
                clock: self.clock.clone(),
                tenant_id: row.identity.tenant_id.clone(),
                id: row.identity.id,
                fence: row.fence,
                durability: Durability::of_watermark(spec),
            }),
            skills: request.pinned.skills().clone(),
        };
        // Polled on this task: a panic is contained, and a timed-out tool is
        // dropped where it stands; a spawned task would add a hand-off and a
        // wake-up to every call.
        let arguments = row.identity.arguments.clone();
        let execution = match contain(|| Contained(tool.tool.execute(arguments, context))) {
            Some(mut running) => {
                let ended = tokio::time::timeout_at(deadline, &mut running).await;
                // The tool's own destructor runs contained as well.
                contain(move || drop(running));
                match ended {
                    Ok(Some(result)) => Execution::Returned(Box::new(result)),
                    Ok(None) => Execution::Panicked,
                    Err(_) => Execution::TimedOut,
                }
            }
            None => Execution::Panicked,
        };
        if !matches!(execution, Execution::Returned(_)) {
            cancellation.cancel();
        }
        (execution, resolver.resolved())
    }
}

pub(super) struct Attempt {
    pub(super) executed: Option<(Arc<dyn crate::ports::ArtifactWriter>, i64)>,
    pub(super) effect_sent: bool,
}

/// How the effect watermark's commit ended.
enum Watermark {
    Committed,
    /// Another worker holds the row now.
    Lost,
    /// The tool does not start.
    NotCommitted(ToolFailure),
}

pub(super) fn suspension(spec: &ToolSpec) -> Option<SuspensionKind> {
    if spec.kind != ToolKind::Control {
        return None;
    }
    SUSPENDING
        .iter()
        .find(|(name, _)| *name == spec.name)
        .map(|(_, kind)| *kind)
}
