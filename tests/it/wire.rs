//! Floods and faults on a stdio server's wire: a server that sends tens of
//! thousands of notifications before its answer still answers within its
//! timeout, and one that answers with garbage (not JSON, a null or an
//! array result) ends that call promptly and leaves the next ones served.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

use crate::serve::Served;

/// One call through `/v1/calls`: its outcome and how long it took.
fn call(served: &Served, session: Uuid, name: &str, arguments: Value) -> (Value, Duration) {
    let started = Instant::now();
    let (status, body) = served.post(
        "/v1/calls",
        &json!({"session_id": session, "run_id": Uuid::new_v4(), "step_number": 1,
                "origin_trust": "user",
                "calls": [{"call_id": "c", "name": name, "arguments": arguments}]}),
    );
    assert_eq!(status, 200, "{body}");
    (body["results"][0]["outcome"].clone(), started.elapsed())
}

/// A server that sends 20,000 progress notifications before answering:
/// the answer arrives, within the tool's ten-second timeout, however busy
/// the machine is; the notifications cost the reader, not the call.
#[test]
fn a_notification_flood_never_turns_an_answer_into_a_timeout() {
    let served = Served::here().start_edited(
        |_, config| {
            config.replace(
                "required_scopes = [\"mcp.reads.use\"]",
                "required_scopes = [\"mcp.reads.use\"]\ntimeout_seconds = 10",
            )
        },
        &[],
    );
    let session = served.session();
    let (outcome, took) = call(
        &served,
        session,
        "mcp.reads.progress_flood",
        json!({"count": 20_000}),
    );
    eprintln!("20,000 notifications, then the answer: {took:?}");
    assert_eq!(outcome["status"], "succeeded", "{outcome} after {took:?}");
    let (outcome, _) = call(&served, session, "mcp.reads.echo", json!({"text": "after"}));
    assert_eq!(outcome["status"], "succeeded", "{outcome}");
}

/// A null result or an array result ends its own call promptly (long
/// before its timeout) as the server's error; garbage (not JSON) is noise,
/// and the call it stood for, never answered, ends at its timeout. Either
/// way the connection stays, and the calls after it are answered at once,
/// with no reconnection to pay.
#[test]
fn garbage_on_the_wire_ends_its_call_and_leaves_the_next_served() {
    let served = Served::here().start_edited(
        |_, config| {
            config.replace(
                "required_scopes = [\"mcp.reads.use\"]",
                "required_scopes = [\"mcp.reads.use\"]\ntimeout_seconds = 3",
            )
        },
        &[],
    );
    let session = served.session();
    for (kind, ends_as) in [
        ("null", "tool.upstream_error"),
        ("array", "tool.upstream_error"),
        ("garbage", "tool.timeout"),
    ] {
        let (outcome, took) = call(
            &served,
            session,
            "mcp.reads.malformed",
            json!({"kind": kind}),
        );
        eprintln!("{kind}: ended as {} in {took:?}", outcome["reason_code"]);
        assert_eq!(
            outcome["reason_code"], ends_as,
            "{kind}: {outcome} in {took:?}"
        );
        if ends_as != "tool.timeout" {
            assert!(took < Duration::from_secs(2), "{kind}: ended in {took:?}");
        }
        for attempt in 0..3 {
            let (outcome, took) = call(&served, session, "mcp.reads.echo", json!({"text": "next"}));
            eprintln!("{kind} then call {attempt}: {took:?}");
            assert_eq!(
                outcome["status"], "succeeded",
                "{kind} then call {attempt}: {outcome}"
            );
            assert!(
                took < Duration::from_secs(2),
                "{kind} then call {attempt}: {took:?}"
            );
        }
    }
    // One connection throughout: no call paid for a reconnection.
    let (_, events) = served.get("/v1/events?after=0");
    let events = String::from_utf8_lossy(&events);
    assert!(!events.contains("mcp.server.disconnected"), "{events}");
}

/// A server that crashes mid-call is started again at once, in the
/// background: the calls after the crash find it ready and are answered
/// promptly, however slowly a start-up would have gone inside their own
/// timeout.
#[test]
fn a_crashed_server_is_ready_again_for_the_next_call() {
    let served = Served::here().start();
    let session = served.session();
    let (outcome, _) = call(&served, session, "mcp.reads.die", json!({}));
    assert_ne!(outcome["status"], "succeeded", "{outcome}");
    // The restart happens without any call asking for it.
    let started = Instant::now();
    loop {
        let (_, events) = served.get("/v1/events?after=0");
        let events = String::from_utf8_lossy(&events).into_owned();
        let connected = events.matches("mcp.server.connected").count()
            + events.matches("mcp.server.pinned").count();
        if events.contains("mcp.server.disconnected") && connected >= 3 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "restarted in the background: {events}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (outcome, took) = call(&served, session, "mcp.reads.echo", json!({"text": "after"}));
    assert_eq!(outcome["status"], "succeeded", "{outcome}");
    assert!(took < Duration::from_secs(2), "{took:?}");
}
