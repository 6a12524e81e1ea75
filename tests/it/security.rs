//! The security floor at the edges, tried as an attacker would against a
//! real `toolgate serve`: slow senders, a turn closed under a call, two
//! calls at once on one turn, and malformed requests of every kind.

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

use crate::serve::{Served, TENANT, exchange, http, json_of};

/// Tight deadlines and caps, so the tests see them act.
const TIGHT: &str = "[limits]\nrequest_header_timeout_seconds = 2\nrequest_body_timeout_seconds = 2\nturn_connections = 4\n";

/// Whether the peer has closed `stream` (within `wait`).
fn closed_by_peer(stream: &UnixStream, wait: Duration) -> bool {
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut buffer = [0u8; 256];
    let mut reader = stream;
    loop {
        match reader.read(&mut buffer) {
            Ok(0) => return true,
            // A refusal or timeout answer, then the close.
            Ok(_) => continue,
            Err(error) => {
                return !matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                );
            }
        }
    }
}

fn rows(served: &Served, run: Uuid) -> usize {
    let (status, body) = served.get(&format!("/v1/runs/{run}/invocations?tenant_id={TENANT}"));
    assert_eq!(status, 200);
    json_of(&body)["invocations"].as_array().unwrap().len()
}

fn bridge_call(socket: &Path, token: &str, body: &Value) -> (u16, Value) {
    let authorization = format!("Bearer {token}");
    let (status, _, body) = http(
        socket,
        "POST",
        "/v1/call",
        &[("Authorization", &authorization)],
        Some(body.to_string().as_bytes()),
    );
    (status, json_of(&body))
}

/// Hundreds of half-sent requests on one turn's socket: past the turn's
/// connection cap they are closed at once, the rest when the header
/// deadline passes, and meanwhile `/healthz` and another turn answer.
#[test]
fn slow_senders_are_cut_off_and_everyone_else_keeps_being_served() {
    let served = Served::here().start_configured(TIGHT);
    let session = served.session();
    let run = Uuid::new_v4();
    let (_, socket, _) = served.turn(session, run, "slow", None);
    let (_, other, other_token) = served.turn(session, run, "other", None);
    // A connection past the cap may be closed before its half request is
    // written: the write then fails, and the connection still counts.
    let held: Vec<UnixStream> = (0..300)
        .filter_map(|_| {
            let mut stream = UnixStream::connect(&socket).ok()?;
            let _ = stream.write_all(b"POST /v1/call HTTP/1.1\r\nHost: t\r\n");
            Some(stream)
        })
        .collect();
    assert!(held.len() > 250, "connections were accepted at all");
    let started = Instant::now();
    let (status, body) = served.get("/healthz");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "healthz was slow"
    );
    let (status, body) = bridge_call(
        &other,
        &other_token,
        &json!({"call": "demo.echo", "arguments": {"text": "still here"}}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "succeeded", "{body}");
    let refused = held
        .iter()
        .filter(|stream| closed_by_peer(stream, Duration::from_millis(200)))
        .count();
    assert!(
        refused >= held.len() - 4,
        "only {refused} of {} were closed past the per-turn cap",
        held.len()
    );
    // The admitted ones are cut at the header deadline.
    let deadline = Instant::now() + Duration::from_secs(5);
    for stream in &held {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            closed_by_peer(stream, left.max(Duration::from_millis(10))),
            "a half-sent request outlived the header deadline"
        );
    }
}

/// A body that never finishes is answered at the body deadline, and an
/// idle kept-alive connection is closed at the header deadline.
#[test]
fn slow_bodies_and_idle_connections_meet_their_deadlines() {
    let served = Served::here().start_configured(TIGHT);
    let session = served.session();
    let (_, socket, token) = served.turn(session, Uuid::new_v4(), "slow body", None);
    let mut stream = UnixStream::connect(&socket).unwrap();
    write!(
        stream,
        "POST /v1/call HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\nContent-Length: 100\r\n\r\n{{\"call\""
    )
    .unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(6)))
        .unwrap();
    let started = Instant::now();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("body_timeout"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(5));

    // Kept alive after one answer, then silent: closed at the deadline.
    let mut idle = UnixStream::connect(&served.socket).unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 512];
    let read = idle.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..read]).starts_with("HTTP/1.1 200"));
    let started = Instant::now();
    assert!(closed_by_peer(&idle, Duration::from_secs(6)));
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// The turn is closed while a call's body is still arriving: the call is
/// refused when it would be admitted, and nothing is recorded.
#[test]
fn a_call_finishing_after_its_turn_closed_is_refused_and_not_recorded() {
    let served = Served::here().start();
    let session = served.session();
    let run = Uuid::new_v4();
    let (turn, socket, token) = served.turn(session, run, "late", None);
    let body = json!({"call": "demo.echo", "arguments": {"text": "too late"}}).to_string();
    let (head, tail) = body.split_at(10);
    let mut stream = UnixStream::connect(&socket).unwrap();
    write!(
        stream,
        "POST /v1/call HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{head}",
        body.len()
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let (status, _, _) = http(
        &served.socket,
        "DELETE",
        &format!("/v1/turns/{turn}"),
        &[],
        None,
    );
    assert_eq!(status, 200);
    stream.write_all(tail.as_bytes()).unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 410"), "{text}");
    assert!(text.contains("turn_closed"), "{text}");
    assert_eq!(
        rows(&served, run),
        0,
        "a call of a closed turn was recorded"
    );
}

/// One call in flight per turn: a second request while the first waits (on
/// an approval) is refused, and the ordinals stay those of the script.
#[test]
fn a_second_concurrent_call_on_a_turn_is_refused() {
    let served = Served::here().start();
    let session = served.session();
    let run = Uuid::new_v4();
    let (_, socket, token) = served.turn(session, run, "one at a time", None);
    let first = {
        let (socket, token) = (socket.clone(), token.clone());
        std::thread::spawn(move || {
            bridge_call(
                &socket,
                &token,
                &json!({"call": "demo.external_write", "arguments": {"line": "held"}}),
            )
        })
    };
    let started = Instant::now();
    let approval = loop {
        let (_, body) = served.get(&format!("/v1/approvals?tenant_id={TENANT}"));
        if let Some(approval) = json_of(&body)["approvals"]
            .as_array()
            .and_then(|a| a.first())
        {
            break approval["approval_id"].as_str().unwrap().to_owned();
        }
        assert!(started.elapsed() < Duration::from_secs(20), "no approval");
        std::thread::sleep(Duration::from_millis(50));
    };
    let (status, body) = bridge_call(
        &socket,
        &token,
        &json!({"call": "demo.echo", "arguments": {"text": "at once"}}),
    );
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "call_in_flight", "{body}");
    let (status, _) = served.post(
        &format!("/v1/approvals/{approval}?tenant_id={TENANT}"),
        &json!({"decision": "approve", "approver": "ops"}),
    );
    assert_eq!(status, 200);
    let (status, body) = first.join().unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "succeeded", "{body}");
    // The refused request took no ordinal: the next call is the script's
    // second.
    let authorization = format!("Bearer {token}");
    let (status, head, _) = http(
        &socket,
        "POST",
        "/v1/call",
        &[("Authorization", &authorization)],
        Some(br#"{"call": "demo.echo", "arguments": {"text": "next"}}"#),
    );
    assert_eq!(status, 200);
    assert!(head.contains("toolgate-ordinal: 1"), "{head}");
    assert_eq!(rows(&served, run), 2);
}

/// Malformed input is refused rather than guessed at.
#[test]
fn malformed_requests_are_refused_not_guessed() {
    let served = Served::here().start();
    let session = served.session();
    let run = Uuid::new_v4();
    let code = |status: u16, body: &Value| (status, body["error"]["code"].clone());

    // A query key given twice.
    let (status, body) = served.get(&format!(
        "/v1/runs/{run}/invocations?tenant_id={TENANT}&tenant_id=other"
    ));
    assert_eq!(
        code(status, &json_of(&body)),
        (400, json!("invalid_request"))
    );
    // A query key the route does not take.
    let (status, body) = served.get(&format!(
        "/v1/runs/{run}/invocations?tenant_id={TENANT}&tenant=other"
    ));
    assert_eq!(
        code(status, &json_of(&body)),
        (400, json!("invalid_request"))
    );

    // Negative steps, on a batch and on a turn.
    for step in [-1, -7] {
        let (status, body) = served.post(
            "/v1/calls",
            &json!({"session_id": session, "run_id": run, "step_number": step, "origin_trust": "user",
                    "calls": [{"call_id": "c", "name": "demo.echo", "arguments": {"text": "hi"}}]}),
        );
        assert_eq!(
            code(status, &body),
            (400, json!("invalid_request")),
            "{body}"
        );
        let (status, body) = served.post(
            "/v1/turns",
            &json!({"session_id": session, "run_id": run, "step_number": step,
                    "script_sha256": "a".repeat(64), "origin_trust": "user"}),
        );
        assert_eq!(
            code(status, &body),
            (400, json!("invalid_request")),
            "{body}"
        );
    }
    assert_eq!(rows(&served, run), 0);

    // An integer JSON cannot carry exactly, on both edges.
    let huge = format!(
        r#"{{"session_id": "{session}", "run_id": "{run}", "step_number": 1, "origin_trust": "user",
            "calls": [{{"call_id": "c", "name": "demo.echo", "arguments": {{"text": "hi", "n": 18446744073709551616}}}}]}}"#
    );
    let (status, _, body) = http(
        &served.socket,
        "POST",
        "/v1/calls",
        &[],
        Some(huge.as_bytes()),
    );
    assert_eq!(
        code(status, &json_of(&body)),
        (400, json!("invalid_request"))
    );
    let (_, socket, token) = served.turn(session, run, "huge", None);
    let authorization = format!("Bearer {token}");
    let (status, _, body) = http(
        &socket,
        "POST",
        "/v1/call",
        &[("Authorization", &authorization)],
        Some(br#"{"call": "demo.echo", "arguments": {"text": "x", "n": -9223372036854775809}}"#),
    );
    assert_eq!(
        code(status, &json_of(&body)),
        (400, json!("invalid_request"))
    );
    assert_eq!(rows(&served, run), 0);

    // Unbounded caller text where only identifiers belong.
    let (status, body) = served.post(
        "/v1/calls",
        &json!({"session_id": session, "run_id": run, "step_number": 1, "origin_trust": "user",
                "calls": [{"call_id": "c".repeat(10_000), "name": "demo.echo", "arguments": {"text": "hi"}}]}),
    );
    assert_eq!(
        code(status, &body),
        (400, json!("invalid_request")),
        "{body}"
    );
    let (status, body) = served.post(
        "/v1/calls",
        &json!({"session_id": session, "run_id": run, "step_number": 1, "origin_trust": "user",
                "calls": [{"call_id": "line\nbreak", "name": "demo.echo", "arguments": {"text": "hi"}}]}),
    );
    assert_eq!(
        code(status, &body),
        (400, json!("invalid_request")),
        "{body}"
    );
    let (status, body) = served.post(
        "/v1/sessions",
        &json!({"session_id": Uuid::new_v4(), "tenant_id": TENANT,
                "principal": {"id": "p".repeat(1000), "scopes": []}, "agent": {"tools": ["demo.*"]}}),
    );
    assert_eq!(
        code(status, &body),
        (400, json!("invalid_request")),
        "{body}"
    );
    assert_eq!(rows(&served, run), 0);

    // Bad cursors and limits on the event stream.
    for query in [
        "after=abc",
        "after=-1",
        "limit=0",
        "limit=10001",
        "limit=1.5",
        "follow=yes",
    ] {
        let (status, body) = served.get(&format!("/v1/events?{query}"));
        assert_eq!(
            code(status, &json_of(&body)),
            (400, json!("invalid_request")),
            "{query}"
        );
    }

    // A body that breaks off (bad chunked framing) is a bad request, not a
    // large one.
    let stream = UnixStream::connect(&served.socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let (status, _, body) = exchange(
        ChunkedGarbage(stream),
        "POST",
        "/v1/sessions",
        &[("Transfer-Encoding", "chunked")],
        None,
    );
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));

    // The bearer scheme is case-insensitive (RFC 6750).
    let lower = format!("bearer  {token}");
    let (status, _, body) = http(
        &socket,
        "POST",
        "/v1/call",
        &[("Authorization", &lower)],
        Some(br#"{"call": "demo.echo", "arguments": {"text": "lower"}}"#),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
}

/// Writes an HTTP head as given, then a chunked body whose size line is not
/// hexadecimal; a wrapper so `exchange` can be reused.
struct ChunkedGarbage(UnixStream);

impl std::io::Write for ChunkedGarbage {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        // exchange writes the head (with a Content-Length of 0, which the
        // chunked header overrides... hyper refuses both at once), so the
        // head is rewritten without it.
        let text = String::from_utf8_lossy(bytes).replace("Content-Length: 0\r\n", "");
        self.0.write_all(text.as_bytes())?;
        if text.ends_with("\r\n\r\n") {
            self.0.write_all(b"zz\r\n{}\r\n0\r\n\r\n")?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl std::io::Read for ChunkedGarbage {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buffer)
    }
}

/// The event stream filtered to a tenant holds only that tenant's events,
/// and a name a caller made up reaches no event whole.
#[test]
fn events_are_filtered_by_tenant_and_carry_no_outside_text() {
    let served = Served::here().start();
    let session = served.session();
    let other_session = Uuid::new_v4();
    let (status, body) = served.post(
        "/v1/sessions",
        &json!({"session_id": other_session, "tenant_id": "tenant-other",
                "principal": {"id": "u", "scopes": ["demo.use"]}, "agent": {"tools": ["demo.*"]}}),
    );
    assert_eq!(status, 200, "{body}");
    let (status, _) = served.echo(other_session, Uuid::new_v4(), 1, "c-other", "demo.echo");
    assert_eq!(status, 200);
    let made_up = format!("\u{1b}[2J{}", "z".repeat(900_000));
    let (status, body) = served.post(
        "/v1/calls",
        &json!({"session_id": session, "run_id": Uuid::new_v4(), "step_number": 1, "origin_trust": "user",
                "calls": [{"call_id": "c-unknown", "name": made_up, "arguments": {}}]}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["results"][0]["outcome"]["reason_code"],
        "policy.matrix.unknown_tool"
    );
    let (status, events) = served.get(&format!("/v1/events?after=0&tenant_id={TENANT}"));
    assert_eq!(status, 200);
    let events: Vec<Value> = String::from_utf8(events)
        .unwrap()
        .lines()
        .map(|line| json_of(line.as_bytes()))
        .collect();
    assert!(!events.is_empty());
    assert!(
        events.iter().all(|event| event["tenant_id"] == TENANT),
        "another tenant's (or no tenant's) events reached a tenant-filtered reader"
    );
    // Refused before it ran: its end is its one event.
    let refused: Vec<&Value> = events
        .iter()
        .filter(|event| event["payload"]["call_id"] == "c-unknown")
        .collect();
    assert_eq!(
        refused
            .iter()
            .map(|event| event["event_type"].as_str().unwrap_or_default())
            .collect::<Vec<_>>(),
        ["tool.call.denied"]
    );
    let denied = refused[0];
    let name = denied["payload"]["tool_name"].as_str().unwrap();
    assert!(
        name.len() <= 64 && name.bytes().all(|b| b.is_ascii_graphic()),
        "an outside name reached an event as sent ({} bytes)",
        name.len()
    );
    // The row keeps the bounded name too.
    let (_, whole) = served.get("/v1/events?after=0");
    assert!(whole.len() < 100_000, "{} bytes of events", whole.len());
}

/// The probe server's catalog, as another configured stdio server.
pub fn probe_server(run_as: Option<&str>) -> String {
    let run_as = run_as
        .map(|user| format!("run_as = \"{user}\"\n"))
        .unwrap_or_default();
    format!(
        r#"
[[mcp.servers]]
server_id = "probe"
command = "{server}"
{run_as}env = {{ SCRIPTED_CATALOG = "probe" }}
side_effect = "external_read"
risk = "low"
idempotency = "read_only"
required_scopes = ["mcp.probe.use"]
"#,
        server = crate::mcp::scripted_server().display(),
    )
}

/// The uid and gid of `nobody`, the user the children tests hand things to.
fn nobody() -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    let line = passwd.lines().find(|line| line.starts_with("nobody:"))?;
    let fields: Vec<&str> = line.split(':').collect();
    Some((fields.get(2)?.parse().ok()?, fields.get(3)?.parse().ok()?))
}

/// Whether this test process can switch users (it runs as root); CI must.
fn can_switch_users() -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with("Uid:"))
                .map(|line| line.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    assert!(
        root || !std::env::var("CI").is_ok_and(|ci| ci == "true"),
        "the children tests need to switch users; CI runs as root"
    );
    root && nobody().is_some()
}

/// Calls the probe tool through a session that may use it.
pub fn probe(served: &Served, tool: &str, arguments: Value) -> Value {
    let session = Uuid::new_v4();
    let (status, body) = served.post(
        "/v1/sessions",
        &json!({"session_id": session, "tenant_id": TENANT,
                "principal": {"id": "u", "scopes": ["mcp.probe.use"]},
                "agent": {"tools": ["mcp.probe.*"]}}),
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = served.post(
        "/v1/calls",
        &json!({"session_id": session, "run_id": Uuid::new_v4(), "step_number": 1,
                "origin_trust": "user",
                "calls": [{"call_id": "p", "name": tool, "arguments": arguments}]}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["results"][0]["outcome"]["status"], "succeeded",
        "{body}"
    );
    body["results"][0]["content"][0]["text"].clone()
}

/// The JSON the probe tool wrote, out of its untrusted envelope.
fn probed(text: &Value) -> Value {
    let text = text.as_str().unwrap();
    let start = text.find('{').unwrap();
    let end = text.rfind('}').unwrap();
    serde_json::from_str(&text[start..=end]).unwrap()
}

/// A stdio server run as another user reaches none of toolgate's secrets:
/// not its environment (the store URL, the control token), not its control
/// socket, not its database.
#[test]
fn a_server_run_as_another_user_cannot_reach_toolgate() {
    if !can_switch_users() {
        eprintln!("not root: the run_as test is skipped");
        return;
    }
    let served = Served::start_configured(&probe_server(Some("nobody")));
    let database = served.folder.path().join("toolgate.db");
    let reached = probed(&probe(
        &served,
        "mcp.probe.probe",
        json!({"socket": served.socket, "database": database}),
    ));
    for (key, expected) in [
        ("environ", json!("refused")),
        ("socket", json!("refused")),
        ("database", json!("refused")),
        ("uid", json!(nobody().unwrap().0)),
    ] {
        assert_eq!(reached[key], expected, "{key}: {reached}");
    }
}

/// What the kernel says of a child: no capability in any set, and no
/// program it runs may gain one.
fn unprivileged(reached: &Value) {
    let privileges = &reached["privileges"];
    for set in ["CapEff", "CapPrm", "CapAmb", "CapInh"] {
        assert_eq!(privileges[set], "0000000000000000", "{set}: {reached}");
    }
    assert_eq!(privileges["NoNewPrivs"], "1", "{reached}");
}

/// Run as root, toolgate never makes root a child's default: a stdio server
/// that names no user runs as `nobody`, with no capability, and cannot read
/// toolgate's environment (its database URL, its secrets). Only an explicit
/// `run_as = "root"` runs one as root, with a warning, and even then it
/// holds no capability (its bounding set empty) and cannot read toolgate's
/// environment.
#[test]
fn children_never_hold_toolgates_privileges() {
    if !can_switch_users() {
        eprintln!("not root: the children's privileges test is skipped");
        return;
    }
    let served = Served::start_configured(&probe_server(None));
    let database = served.folder.path().join("toolgate.db");
    let arguments = json!({"socket": served.socket, "database": database});
    let reached = probed(&probe(&served, "mcp.probe.probe", arguments.clone()));
    assert_eq!(reached["uid"], nobody().unwrap().0, "{reached}");
    assert_eq!(reached["environ"], "refused", "{reached}");
    unprivileged(&reached);
    drop(served);

    let served = Served::start_configured(&probe_server(Some("root")));
    let database = served.folder.path().join("toolgate.db");
    let arguments = json!({"socket": served.socket, "database": database});
    let reached = probed(&probe(&served, "mcp.probe.probe", arguments));
    assert_eq!(reached["uid"], 0, "{reached}");
    assert_eq!(reached["environ"], "refused", "{reached}");
    unprivileged(&reached);
    assert_eq!(
        reached["privileges"]["CapBnd"], "0000000000000000",
        "{reached}"
    );
    assert!(
        served.logs.lock().unwrap().contains("runs as root"),
        "the operator is warned"
    );
}

/// A server run as toolgate's own user still cannot read toolgate's
/// environment or memory: toolgate is not dumpable.
#[test]
fn a_server_of_toolgates_own_user_cannot_read_its_environment() {
    if !can_switch_users() {
        eprintln!("not root: the same-user test is skipped");
        return;
    }
    let served = Served::start_as(nobody().unwrap(), &probe_server(None));
    let database = served.folder.path().join("toolgate.db");
    let reached = probed(&probe(
        &served,
        "mcp.probe.probe",
        json!({"socket": served.socket, "database": database}),
    ));
    assert_eq!(reached["uid"], nobody().unwrap().0, "{reached}");
    assert_eq!(reached["environ"], "refused", "{reached}");
}

/// What toolgate creates is its own: the database and its WAL, artifact
/// folders, sockets and state folders carry no group or other bits.
#[test]
fn files_and_folders_toolgate_creates_are_its_own() {
    use std::os::unix::fs::PermissionsExt as _;
    let served = Served::start();
    let session = served.session();
    // A large output, so an artifact is written.
    let (status, body) = served.post(
        "/v1/calls",
        &json!({"session_id": session, "run_id": Uuid::new_v4(), "step_number": 1,
                "origin_trust": "user",
                "calls": [{"call_id": "big", "name": "demo.echo", "arguments": {"text": "x".repeat(20_000)}}]}),
    );
    assert_eq!(status, 200, "{body}");
    let (_, socket, _) = served.turn(session, Uuid::new_v4(), "modes", None);
    let root = served.folder.path();
    let mut checked = Vec::new();
    let mut walk = vec![root.join("state/artifacts"), root.join("run")];
    while let Some(path) = walk.pop() {
        let Ok(metadata) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if metadata.is_dir() {
            walk.extend(
                std::fs::read_dir(&path)
                    .unwrap()
                    .flatten()
                    .map(|e| e.path()),
            );
        }
        checked.push((path, metadata.permissions().mode() & 0o777));
    }
    for name in ["toolgate.db", "toolgate.db-wal", "toolgate.db-shm"] {
        let path = root.join(name);
        if let Ok(metadata) = std::fs::metadata(&path) {
            checked.push((path, metadata.permissions().mode() & 0o777));
        }
    }
    assert!(
        checked
            .iter()
            .any(|(path, _)| path.ends_with("toolgate.db"))
    );
    assert!(checked.len() > 6, "{checked:?}");
    // The turns' folder (and the one above it) may be traversed by the
    // sandboxes' uids, never listed; nothing else is open to anyone.
    let open: Vec<_> = checked
        .iter()
        .filter(|(path, mode)| {
            let traversable = path.is_dir() && mode & 0o077 == 0o011;
            mode & 0o077 != 0 && !traversable
        })
        .collect();
    assert!(open.is_empty(), "readable by others: {open:?}");
    let socket_mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(socket_mode, 0o600);
    let control = std::fs::metadata(&served.socket)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(control, 0o600);
}

/// A server's stderr reaches the operator's log escaped and within its
/// budget: 8 MiB of it is not 8 MiB of log, and no terminal sequence or
/// forged line gets through as written.
#[test]
fn a_servers_stderr_is_escaped_and_bounded_in_the_log() {
    let served = Served::start_configured(&probe_server(None));
    let flooded = probe(&served, "mcp.probe.stderr", json!({"bytes": 8 << 20}));
    assert!(flooded.as_str().unwrap().contains("flooded"));
    // The forged line is written first and the flood after it: the log is
    // read once that line is in it, and the budget bounds what follows.
    let started = std::time::Instant::now();
    while !served.logs.lock().unwrap().contains("fake operator line") {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the server's stderr reaches the log"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let logs = served.logs.lock().unwrap().clone();
    // The log is JSON lines: what matters is the text they decode to.
    let lines: Vec<String> = logs
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["fields"]["message"] == "mcp server stderr")
        .filter_map(|line| line["fields"]["line"].as_str().map(str::to_owned))
        .collect();
    assert!(!lines.is_empty(), "{logs}");
    assert!(
        lines.iter().all(|line| !line.chars().any(char::is_control)),
        "a control character reached the log as written"
    );
    let stderr_bytes: usize = lines.iter().map(String::len).sum();
    assert!(
        stderr_bytes < 64 * 1024,
        "{stderr_bytes} bytes of one server's stderr were logged"
    );
    assert!(
        lines.iter().any(|line| line.contains("fake operator line")),
        "the line is kept, escaped"
    );
}
