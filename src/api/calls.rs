//! `POST /v1/calls`: one step's batch, onto batch admission; the answer is
//! the model-facing rendering of each outcome.

use hyper::StatusCode;
use serde_json::{Value, json};

use super::listen::Routed;
use super::wire::{CallsRequest, rendered_content};
use super::{ApiError, ControlApi};
use crate::domain::ArgumentTrust;
use crate::edge::{Reply, reply};
use crate::pipeline::CallOutcome;
use crate::pipeline::admission::{Batch, BatchCall};

impl ControlApi {
    pub(super) async fn calls(&self, routed: Routed) -> Result<Reply, ApiError> {
        let request: CallsRequest = self.body(routed.request).await?;
        let session = self.parts.sessions.get(request.session_id).await?;
        let call_ids: Vec<String> = request
            .calls
            .iter()
            .map(|call| call.call_id.clone())
            .collect();
        let batch = Batch {
            run_id: request.run_id,
            step_number: request.step_number,
            deadline_at: request.deadline_at,
            origin_trust: request.origin_trust,
            remaining_tool_calls: request.remaining_tool_calls,
            calls: request
                .calls
                .into_iter()
                .map(|call| {
                    let argument_trust = ArgumentTrust::from_pointers(
                        call.argument_trust
                            .iter()
                            .map(|(pointer, label)| (pointer.as_str(), *label)),
                    )
                    .map_err(|refused| ApiError::Invalid(refused.to_string()))?;
                    Ok(BatchCall {
                        call_id: call.call_id,
                        name: call.name,
                        arguments: call.arguments,
                        argument_trust,
                    })
                })
                .collect::<Result<_, ApiError>>()?,
        };
        let ran = self.parts.admission.run(&session, batch).await?;
        let results: Vec<Value> = call_ids
            .iter()
            .zip(&ran.outcomes)
            .map(|(call_id, outcome)| match outcome {
                CallOutcome::Finished(finished) => {
                    let mut result = json!({
                        "call_id": call_id,
                        "invocation_id": finished.invocation_id,
                        "outcome": finished.outcome,
                        "content": rendered_content(&finished.content),
                        "synthesis_only": finished.synthesis_only,
                        "fails_run": finished.fails_run(),
                        "retry_after_seconds": finished.retry_after_seconds,
                    });
                    // Nothing was recorded: the same call asked again once
                    // the person has consented runs.
                    if let Some(consent) = &finished.consent {
                        result["pending"] = json!({"consent": {
                            "server_id": consent.server_id, "url": consent.url}});
                    }
                    result
                }
                CallOutcome::Pending {
                    invocation_id,
                    approval_id,
                } => json!({
                    "call_id": call_id,
                    "invocation_id": invocation_id,
                    "pending": {"approval_id": approval_id},
                }),
                CallOutcome::Suspended {
                    invocation_id,
                    kind,
                    reference,
                } => json!({
                    "call_id": call_id,
                    "invocation_id": invocation_id,
                    "suspended": {"kind": kind, "reference": reference},
                }),
                // The control API gives no way to take a call back.
                CallOutcome::Withdrawn => json!({"call_id": call_id, "withdrawn": true}),
            })
            .collect();
        // The run-level signals: the next model turn must answer from what
        // it has (ADR-0136), or the run has failed (a third identical
        // denial). Either in one call holds for the batch.
        let finished = || {
            ran.outcomes.iter().filter_map(|outcome| match outcome {
                CallOutcome::Finished(finished) => Some(finished),
                _ => None,
            })
        };
        let synthesis_only = finished().any(|finished| finished.synthesis_only);
        let fails_run = finished().any(|finished| finished.fails_run());
        let retry_after = finished()
            .filter_map(|finished| finished.retry_after_seconds)
            .max();
        let mut answer = reply(
            StatusCode::OK,
            &json!({"parallel_group": ran.parallel_group, "parallel": ran.parallel,
                    "synthesis_only": synthesis_only,
                    "fails_run": fails_run, "results": results}),
        );
        // A rate-limited call says when to ask again, as HTTP does.
        if let Some(seconds) = retry_after {
            answer.headers_mut().insert(
                hyper::header::RETRY_AFTER,
                hyper::header::HeaderValue::from(seconds),
            );
        }
        Ok(answer)
    }
}
