//! What the control API tells a runtime beyond each outcome: the run-level
//! signals (answer before the loop limit; the run has failed), per call and
//! per batch.

use serde_json::{Value, json};
use uuid::Uuid;

use crate::serve::Served;

fn batch(served: &Served, session: Uuid, run: Uuid, step: u32, calls: Value) -> Value {
    let (status, body) = served.post(
        "/v1/calls",
        &json!({"session_id": session, "run_id": run, "step_number": step,
                "origin_trust": "user", "calls": calls}),
    );
    assert_eq!(status, 200, "{body}");
    body
}

/// Identical calls in a run: the one that leaves the count one below the
/// loop limit says `synthesis_only`, per call and for its batch; the third
/// identical denial says `fails_run`.
#[test]
fn the_run_level_signals_are_on_the_wire() {
    let served = Served::here().start();
    let session = served.session();
    let run = Uuid::new_v4();
    let mut signals = Vec::new();
    for step in 1..=4 {
        let answer = batch(
            &served,
            session,
            run,
            step,
            json!([{"call_id": format!("echo-{step}"), "name": "demo.echo",
                    "arguments": {"text": "the same"}}]),
        );
        let result = &answer["results"][0];
        assert_eq!(result["outcome"]["status"], "succeeded", "{answer}");
        assert_eq!(result["synthesis_only"], answer["synthesis_only"]);
        assert_eq!(answer["fails_run"], false, "{answer}");
        signals.push(answer["synthesis_only"].as_bool().unwrap());
    }
    assert_eq!(signals, [false, false, false, true]);

    let run = Uuid::new_v4();
    let mut failed = Vec::new();
    for step in 1..=3 {
        let answer = batch(
            &served,
            session,
            run,
            step,
            json!([{"call_id": format!("write-{step}"), "name": "demo.keyed_write",
                    "arguments": {"line": "no"}}]),
        );
        let result = &answer["results"][0];
        assert_eq!(result["outcome"]["status"], "denied", "{answer}");
        assert_eq!(result["fails_run"], answer["fails_run"]);
        failed.push(answer["fails_run"].as_bool().unwrap());
    }
    assert_eq!(failed, [false, false, true]);
}
