//! A script's call entering the pipeline: the bridge, not the script,
//! assigns the ordinal (so the call id); the cap counts every call; a call
//! that needs an approval is held until the decision wakes it, and past the
//! hold the turn is suspended and closed.

use std::sync::Arc;

use hyper::StatusCode;
use hyper::header::HeaderValue;
use serde::Deserialize;
use serde_json::{Value, json};

use super::Bridge;
use super::refusal::Refusal;
use super::turn::{Admission, CallInFlight, Turn, Waiting, call_id};
use crate::domain::{ReasonCode, ToolOutcome};
use crate::edge::{Reply, reply_text};
use crate::pipeline::approvals::{Held, Hold, HoldObserver};
use crate::pipeline::sessions::{CallPlace, Session};
use crate::pipeline::{CallOutcome, Finished, RenderedPart, Replay, ResultData};
use crate::ports::BoxFuture;

/// The bridge's `POST /v1/call`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ScriptCall {
    call: String,
    #[serde(default = "empty_object")]
    arguments: Value,
}

fn empty_object() -> Value {
    json!({})
}

/// The answer a script reads, `status` first: a success's result as data
/// (`result`: content, structured, artifacts), or the six-field outcome of
/// the other four statuses with what the model would read beside it.
fn outcome_text(
    outcome: &ToolOutcome,
    content: &[RenderedPart],
    data: Option<&ResultData>,
) -> String {
    let mut fields = match serde_json::to_value(outcome) {
        Ok(Value::Object(fields)) => fields,
        _ => serde_json::Map::new(),
    };
    let status = fields.remove("status").unwrap_or(Value::Null);
    let mut text = format!("{{\"status\":{status}");
    for (name, value) in fields {
        text.push_str(&format!(",{}:{value}", Value::String(name)));
    }
    if matches!(outcome, ToolOutcome::Succeeded { .. }) {
        let result = match data {
            Some(data) => serde_json::to_value(data).unwrap_or_else(|_| json!({})),
            // A row recorded before results were kept as data: what the
            // model read, as it read it.
            None => json!({"content": content, "structured": null, "artifacts": []}),
        };
        text.push_str(&format!(",\"result\":{result}}}"));
    } else {
        let content = serde_json::to_value(content).unwrap_or_else(|_| json!([]));
        text.push_str(&format!(",\"content\":{content}}}"));
    }
    text
}

/// What the script's client is told while its call is held: the approval,
/// the tool, and when the hold ends (`GET /v1/waiting`).
struct Blocked<'a> {
    in_flight: &'a CallInFlight,
    call: String,
    held_until: chrono::DateTime<chrono::Utc>,
}

impl HoldObserver for Blocked<'_> {
    fn waiting(&self, approval_id: uuid::Uuid, _waited: std::time::Duration) -> BoxFuture<'_, ()> {
        self.in_flight.wait(Waiting {
            approval_id,
            call: self.call.clone(),
            held_until: self.held_until,
        });
        Box::pin(std::future::ready(()))
    }
}

/// Runs one script call through the pipeline.
pub(super) async fn run(
    bridge: &Arc<Bridge>,
    turn: &Arc<Turn>,
    in_flight: &CallInFlight,
    session: &Session,
    script_call: ScriptCall,
) -> Result<Reply, Refusal> {
    let settings = &bridge.parts.settings;
    // Admitted only now that the whole request has arrived: a turn closed
    // (or expired) meanwhile runs and records nothing.
    let ordinal = match turn.admit(settings.turn_call_cap, bridge.parts.clock.now()) {
        Ok(ordinal) => ordinal,
        Err(Admission::Closed) => return Err(Refusal::TurnClosed),
        Err(Admission::CapReached) => {
            let outcome = ToolOutcome::not_succeeded(script_call.call, ReasonCode::BridgeCallLimit);
            return Ok(reply_text(
                StatusCode::OK,
                outcome_text(&outcome, &[], None),
            ));
        }
    };
    let place = CallPlace {
        run_id: turn.binding.run_id,
        step_number: turn.binding.step_number,
        origin_trust: turn.binding.origin_trust,
        deadline_at: turn.binding.deadline_at,
        parallel_group: None,
    };
    let call_id = call_id(&turn.binding.script_sha256, ordinal);
    let replay = turn.binding.recorded.get(&call_id).map(|recorded| Replay {
        invocation_id: recorded.invocation_id,
        tool_name: recorded.tool_name.clone(),
        arguments_hash: recorded.arguments_hash.clone(),
        divergence: settings.replay_divergence,
    });
    let name = script_call.call.clone();
    let mut request = session.call_request(place, call_id, script_call.call, script_call.arguments);
    request.caller.replay = replay;
    let hold = settings
        .tenant_approval_holds
        .get(&session.tenant_id)
        .copied()
        .unwrap_or(settings.approval_hold);
    // Held, not failed: the script blocks while a human decides.
    let held = bridge
        .parts
        .approvals
        .call_held(
            &bridge.parts.pipeline,
            request,
            Hold {
                until: tokio::time::Instant::now() + hold,
                turn_id: Some(turn.id),
                every: hold,
                withdrawn: None,
                observer: &Blocked {
                    in_flight,
                    call: name,
                    held_until: bridge.parts.clock.now()
                        + chrono::Duration::from_std(hold).unwrap_or(chrono::Duration::MAX),
                },
            },
        )
        .await;
    let outcome = match held {
        Held::Outcome(outcome) => outcome,
        // A script cannot take a call back.
        Held::Withdrawn => return Err(Refusal::StillPending),
        Held::Undecided { .. } => {
            // Past the hold the turn is suspended and closed; the same
            // script in a new turn resumes through deduplication.
            bridge
                .close_turn(turn.id, crate::domain::TurnState::Suspended)
                .await;
            return Err(Refusal::TurnSuspended);
        }
    };
    match outcome {
        CallOutcome::Finished(Finished {
            outcome,
            retry_after_seconds,
            consent,
            content,
            ..
        }) if outcome.reason_code().is_some_and(ReasonCode::is_unsettled) => {
            // No settled outcome: the call is in flight elsewhere (another
            // node, or recovery), its record could not be written, a rate
            // limit held it back, or the person has not consented at the
            // server. Its ordinal is given back, so the script's retry is
            // the same call id and reads the outcome the call's row ends
            // with; a new ordinal would make it a second call.
            turn.return_ordinal(ordinal);
            let mut text = outcome_text(&outcome, &[], None);
            // Where the person consents, beside the outcome (with what the
            // model would read), for the client's typed exception.
            if let Some(consent) = consent {
                text = outcome_text(&outcome, &content, None);
                text.pop();
                text.push_str(&format!(
                    ",\"consent\":{}}}",
                    json!({"server_id": consent.server_id, "url": consent.url})
                ));
            }
            let mut response = reply_text(StatusCode::OK, text);
            if let Some(seconds) = retry_after_seconds {
                response.headers_mut().insert(
                    hyper::header::RETRY_AFTER,
                    hyper::header::HeaderValue::from(seconds),
                );
            }
            Ok(response)
        }
        CallOutcome::Finished(Finished {
            outcome,
            content,
            data,
            ..
        }) => {
            let mut response = reply_text(
                StatusCode::OK,
                outcome_text(&outcome, &content, data.as_ref()),
            );
            if let Ok(value) = HeaderValue::from_str(&ordinal.to_string()) {
                response.headers_mut().insert("Toolgate-Ordinal", value);
            }
            Ok(response)
        }
        // A script cannot take a call back, so neither ends it here.
        CallOutcome::Pending { .. } | CallOutcome::Withdrawn => Err(Refusal::StillPending),
        // A script cannot wait hours for a user or a child run.
        CallOutcome::Suspended { .. } => Err(Refusal::CallSuspended),
    }
}
