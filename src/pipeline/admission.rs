//! Batch admission: a step's calls run in parallel only when the whole batch
//! qualifies (the design document's admission check); otherwise in the
//! order the provider emitted them. No partial parallelism.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::call::{CallOutcome, CallRequest, named_tool};
use super::executor::Pipeline;
use super::registry::PinnedToolSet;
use super::sessions::{CallPlace, Session};
use crate::domain::{ArgumentTrust, IdempotencyClass, SideEffectClass, TrustLevel, valid_call_id};
use crate::ports::Clock;

/// Why a batch did not run to its end.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    /// Steps count from zero.
    #[error("step_number must not be negative")]
    NegativeStep,
    /// A call id is empty, too long, or not printable ASCII.
    #[error("call_id must be 1 to 256 printable ASCII characters")]
    InvalidCallId,
    /// A call of a parallel batch ended its task without an outcome.
    #[error("a call of the batch did not finish")]
    CallLost,
}

/// One call of a batch, as the model emitted it.
#[derive(Debug, Clone)]
pub struct BatchCall {
    /// The provider's call id.
    pub call_id: String,
    /// A registry name or its wire alias.
    pub name: String,
    /// The model's arguments.
    pub arguments: Value,
    /// Where arguments came from, as the caller carried it: an argument
    /// nobody labelled is the model's, `ExternalUntrusted`.
    pub argument_trust: ArgumentTrust,
}

/// One step's batch.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The run.
    pub run_id: Uuid,
    /// The step every call shares.
    pub step_number: i64,
    /// The run's deadline.
    pub deadline_at: Option<DateTime<Utc>>,
    /// Minimum trust over the context that proposed the batch.
    pub origin_trust: TrustLevel,
    /// How many more tool calls the run's budget allows, when the runtime
    /// keeps one; a batch larger than this does not run in parallel.
    pub remaining_tool_calls: Option<u64>,
    /// The calls, in the provider's order.
    pub calls: Vec<BatchCall>,
}

/// What a batch came to: its group, whether it ran in parallel, and one
/// outcome per call in the order given.
#[derive(Debug, Clone)]
pub struct BatchOutcome {
    /// Shared by every row of the batch, parallel or not, so the batch can
    /// be rebuilt from the table alone.
    pub parallel_group: Uuid,
    /// Whether the admission check let its calls run at once.
    pub parallel: bool,
    /// One per call, in order.
    pub outcomes: Vec<CallOutcome>,
}

/// The admission check: a batch runs in parallel only when every call is a
/// read-only, parallel-safe tool of the pinned set whose timeout fits the
/// run's remaining time, and the batch fits the run's remaining tool
/// budget. `tool.call` is judged as the tool it names. No two calls can
/// share a workspace write path because none of them writes.
pub fn parallel_ok(
    pinned: &PinnedToolSet,
    calls: &[BatchCall],
    remaining_seconds: Option<f64>,
    remaining_tool_calls: Option<u64>,
) -> bool {
    calls.len() > 1
        && remaining_tool_calls.is_none_or(|remaining| calls.len() as u64 <= remaining)
        && calls.iter().all(|call| {
            pinned
                .resolve(named_tool(&call.name, &call.arguments))
                .is_some_and(|pinned| {
                    let spec = &pinned.tool.spec;
                    let fits = remaining_seconds
                        .is_none_or(|remaining| f64::from(spec.timeout_seconds) <= remaining);
                    fits && spec.allow_parallel
                        && spec.idempotency == IdempotencyClass::ReadOnly
                        && matches!(
                            spec.side_effect,
                            SideEffectClass::None
                                | SideEffectClass::WorkspaceRead
                                | SideEffectClass::NetworkRead
                                | SideEffectClass::ExternalRead
                        )
                })
        })
}

/// Runs batches through the one pipeline.
pub struct Admission {
    pipeline: Arc<Pipeline>,
    clock: Arc<dyn Clock>,
    /// Calls of one parallel batch that run at once.
    concurrency: usize,
}

impl Admission {
    /// Batches over `pipeline`, at most `concurrency` calls at once.
    pub fn new(pipeline: Arc<Pipeline>, clock: Arc<dyn Clock>, concurrency: usize) -> Self {
        Admission {
            pipeline,
            clock,
            concurrency: concurrency.max(1),
        }
    }

    /// Runs one step's batch for `session`.
    pub async fn run(
        &self,
        session: &Session,
        batch: Batch,
    ) -> Result<BatchOutcome, AdmissionError> {
        if batch.step_number < 0 {
            return Err(AdmissionError::NegativeStep);
        }
        if !batch.calls.iter().all(|call| valid_call_id(&call.call_id)) {
            return Err(AdmissionError::InvalidCallId);
        }
        let remaining = batch
            .deadline_at
            .map(|deadline| (deadline - self.clock.now()).num_milliseconds() as f64 / 1000.0);
        let parallel = parallel_ok(
            &session.pinned,
            &batch.calls,
            remaining,
            batch.remaining_tool_calls,
        );
        let parallel_group = Uuid::new_v4();
        let place = CallPlace {
            run_id: batch.run_id,
            step_number: batch.step_number,
            origin_trust: batch.origin_trust,
            deadline_at: batch.deadline_at,
            parallel_group: Some(parallel_group),
        };
        let requests: Vec<_> = batch
            .calls
            .into_iter()
            .map(|call| CallRequest {
                argument_trust: call.argument_trust,
                ..session.call_request(place, call.call_id, call.name, call.arguments)
            })
            .collect();
        let outcomes = if parallel {
            let slots = Arc::new(tokio::sync::Semaphore::new(self.concurrency));
            let tasks: Vec<_> = requests
                .into_iter()
                .map(|request| {
                    let (pipeline, slots) = (self.pipeline.clone(), slots.clone());
                    tokio::spawn(async move {
                        let _slot = slots.acquire_owned().await;
                        pipeline.call(request).await
                    })
                })
                .collect();
            let mut outcomes = Vec::with_capacity(tasks.len());
            for task in tasks {
                outcomes.push(task.await.map_err(|_| AdmissionError::CallLost)?);
            }
            outcomes
        } else {
            // A mixed batch runs sequentially, in the order given.
            let mut outcomes = Vec::with_capacity(requests.len());
            for request in requests {
                outcomes.push(self.pipeline.call(request).await);
            }
            outcomes
        };
        Ok(BatchOutcome {
            parallel_group,
            parallel,
            outcomes,
        })
    }
}
