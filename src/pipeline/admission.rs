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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::json;

    use super::*;
    use crate::domain::{
        AgentSpec, PolicyProfile, Principal, RuntimeEnvironment, TargetKind, ToolResult, ToolSpec,
    };
    use crate::pipeline::registry::{RegistryLimits, ToolRegistry};
    use crate::ports::{BoxFuture, Tool, ToolExecutionContext};

    struct Fixed(ToolSpec);

    impl Tool for Fixed {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }
        fn execute<'a>(&'a self, _: Value, _: ToolExecutionContext) -> BoxFuture<'a, ToolResult> {
            Box::pin(async { ToolResult::text("") })
        }
    }

    /// A read-only tool with `timeout_seconds`, declared parallel-safe or not.
    fn read(name: &str, timeout_seconds: u32, allow_parallel: bool) -> Arc<dyn Tool> {
        let spec: ToolSpec = serde_json::from_value(json!({
            "name": name, "version": "1", "description": "d",
            "input_schema": {"type": "object"}, "output_schema": null,
            "side_effect": "none", "risk": "low", "idempotency": "read_only",
            "required_scopes": [], "timeout_seconds": timeout_seconds,
            "maximum_output_bytes": 1024, "allow_parallel": allow_parallel,
            "output_trust": "internal_tool"
        }))
        .expect("a spec");
        Arc::new(Fixed(spec))
    }

    fn pinned(tools: Vec<Arc<dyn Tool>>) -> Arc<PinnedToolSet> {
        let limits = RegistryLimits {
            maximum_output_bytes_ceiling: 1 << 20,
            tenant_catalog_tools: 10_000,
        };
        let registry = ToolRegistry::with_builtins(limits, tools).expect("the tools register");
        registry.specs_for_session(
            "tenant-a",
            &AgentSpec {
                tools: vec!["*".into()],
            },
            &Principal {
                id: "p".into(),
                scopes: BTreeSet::new(),
            },
            &PolicyProfile::default(),
            &RuntimeEnvironment {
                targets: [TargetKind::InProcess].into(),
            },
        )
    }

    fn calls(names: &[&str]) -> Vec<BatchCall> {
        names
            .iter()
            .enumerate()
            .map(|(index, name)| BatchCall {
                call_id: format!("c{index}"),
                name: (*name).to_owned(),
                arguments: json!({}),
                argument_trust: ArgumentTrust::default(),
            })
            .collect()
    }

    #[test]
    fn a_batch_runs_at_once_only_while_every_timeout_fits_the_time_left() {
        let pinned = pinned(vec![
            read("demo.quick", 5, true),
            read("demo.slow", 30, true),
        ]);
        let quick = calls(&["demo.quick", "demo.quick"]);
        assert!(parallel_ok(&pinned, &quick, None, None), "no deadline");
        assert!(parallel_ok(&pinned, &quick, Some(5.0), None), "just fits");
        assert!(!parallel_ok(&pinned, &quick, Some(4.9), None), "past it");
        let mixed = calls(&["demo.quick", "demo.slow"]);
        assert!(parallel_ok(&pinned, &mixed, Some(30.0), None));
        assert!(
            !parallel_ok(&pinned, &mixed, Some(29.0), None),
            "one call's timeout past the time left holds the batch in order"
        );
    }

    #[test]
    fn a_read_not_declared_parallel_safe_keeps_its_batch_in_order() {
        // Read-only yet not parallel-safe, as every MCP tool is.
        let pinned = pinned(vec![
            read("demo.quick", 5, true),
            read("demo.serial", 5, false),
        ]);
        assert!(parallel_ok(
            &pinned,
            &calls(&["demo.quick", "demo.quick"]),
            None,
            None
        ));
        assert!(!parallel_ok(
            &pinned,
            &calls(&["demo.quick", "demo.serial"]),
            None,
            None
        ));
        assert!(!parallel_ok(
            &pinned,
            &calls(&["demo.serial", "demo.serial"]),
            None,
            None
        ));
    }

    #[test]
    fn a_batch_past_the_runs_tool_budget_runs_in_order() {
        let pinned = pinned(vec![read("demo.quick", 5, true)]);
        let three = calls(&["demo.quick", "demo.quick", "demo.quick"]);
        assert!(parallel_ok(&pinned, &three, None, Some(3)));
        assert!(!parallel_ok(&pinned, &three, None, Some(2)));
        assert!(
            !parallel_ok(&pinned, &calls(&["demo.quick"]), None, None),
            "one call is no batch"
        );
    }
}
