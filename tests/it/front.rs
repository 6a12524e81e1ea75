//! The MCP front door on a real `toolgate serve`: JSON-RPC over HTTP as a
//! client sends it (sessions, listing, calls and their identity, approvals
//! held and resumed, cancellation), every credential path (API keys and
//! their rotation, JWTs from a key set file and through egress), and what a
//! hostile client sends (wrong credentials, other tenants' sessions, bad
//! hosts, malformed and oversized bodies, floods of sessions).

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

use crate::serve::{Served, StartNode, TENANT, json_of};
use crate::support::free_port;

/// Tenant A's key: the e2e tenant's user-1, every tool.
pub const KEY_A: &str = "tgk_front_alpha_0000000000000000000000000000000000000000000000000001";
/// Tenant A's other principal.
pub const KEY_A2: &str = "tgk_front_alpha_0000000000000000000000000000000000000000000000000002";
/// Another tenant's key.
pub const KEY_B: &str = "tgk_front_bravo_0000000000000000000000000000000000000000000000000003";

/// The `[front]` table: TCP on `port`, the three keys, and `extra` lines.
pub fn front_table(port: u16, extra: &str) -> String {
    let hash = |key: &str| toolgate::domain::sha256_hex(key.as_bytes());
    format!(
        r#"
[front]
listen = "127.0.0.1:{port}"
{hold}
{extra}

[[front.api_keys]]
id = "alpha"
sha256 = "{a}"
tenant_id = "{TENANT}"
principal = {{ id = "user-1", scopes = ["demo.use", "mcp.reads.use", "mcp.writes.use", "mcp.media.use"] }}
tools = ["demo.*", "mcp.*", "skill.load"]

[[front.api_keys]]
id = "alpha-2"
sha256 = "{a2}"
tenant_id = "{TENANT}"
principal = {{ id = "user-2", scopes = ["demo.use"] }}
tools = ["demo.*"]

[[front.api_keys]]
id = "bravo"
sha256 = "{b}"
tenant_id = "tenant-other"
principal = {{ id = "user-1", scopes = ["demo.use", "mcp.reads.use", "mcp.writes.use"] }}
tools = ["demo.*", "mcp.*"]
"#,
        hold = if extra.contains("approval_hold_seconds") {
            ""
        } else {
            "approval_hold_seconds = 2"
        },
        a = hash(KEY_A),
        a2 = hash(KEY_A2),
        b = hash(KEY_B),
    )
}

/// A server of images and large results (the scripted server's probe
/// catalog), whose calls the first key's principal may make.
pub fn media_server() -> String {
    format!(
        r#"
[[mcp.servers]]
server_id = "media"
command = "{server}"
env = {{ SCRIPTED_CATALOG = "probe" }}
side_effect = "external_read"
risk = "low"
idempotency = "read_only"
maximum_output_bytes = 65536
required_scopes = ["mcp.media.use"]
"#,
        server = crate::mcp::scripted_server().display(),
    )
}

/// One answer of the front door.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub head: String,
    /// The JSON-RPC messages: a JSON body's one, or an SSE body's events.
    pub messages: Vec<Value>,
}

impl Answer {
    /// The session id the answer carries.
    pub fn session(&self) -> Option<String> {
        header(&self.head, "mcp-session-id")
    }

    /// The last message: the response.
    pub fn last(&self) -> &Value {
        self.messages.last().unwrap_or(&Value::Null)
    }
}

pub fn header(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim()
            .eq_ignore_ascii_case(name)
            .then(|| value.trim().to_owned())
    })
}

fn messages_of(head: &str, body: &[u8]) -> Vec<Value> {
    let sse =
        header(head, "content-type").is_some_and(|kind| kind.starts_with("text/event-stream"));
    if sse {
        String::from_utf8_lossy(body)
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .filter_map(|data| serde_json::from_str(data).ok())
            .collect()
    } else {
        serde_json::from_slice(body).ok().into_iter().collect()
    }
}

/// A sidecar with its front door on TCP.
pub struct Door {
    pub served: Served,
    pub port: u16,
    client: Client,
}

/// A client of a front door on a port.
#[derive(Debug, Clone, Copy)]
pub struct Client {
    pub port: u16,
}

impl std::ops::Deref for Door {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Door {
    /// `serve` with the front door and `front_extra` in `[front]`, plus
    /// `extra` whole tables.
    pub fn start(front_extra: &str, extra: &str) -> Door {
        Door::start_on(Served::here(), front_extra, extra)
    }

    /// As [`Door::start`], its node a `toolgate serve` process (for what it
    /// logs).
    pub fn start_in_a_process(front_extra: &str, extra: &str) -> Door {
        Door::start_on(Served::process(), front_extra, extra)
    }

    fn start_on(start: StartNode, front_extra: &str, extra: &str) -> Door {
        let port = free_port();
        let served =
            start.start_configured(&format!("{}\n{extra}", front_table(port, front_extra)));
        Door::wait(served, port)
    }

    /// A door whose writes server answers 1.5 s after its effect, so a
    /// client can lose the answer of a call that acted.
    pub fn slow_answers(front_extra: &str) -> Door {
        Door::slow_answers_on(None, front_extra)
    }

    /// As [`Door::slow_answers`], on the database at `store_url` when given.
    pub fn slow_answers_on(store_url: Option<&str>, front_extra: &str) -> Door {
        let port = free_port();
        let served = Served::here().start_edited_on(store_url, |_, config| {
            config.replace(
                    "SCRIPTED_CATALOG = \"basic\", SCRIPTED_EFFECTS",
                    "SCRIPTED_CATALOG = \"basic\", SCRIPTED_WRITE_AFTER_MS = \"1500\", SCRIPTED_EFFECTS",
                ) + &front_table(port, front_extra)
        });
        Door::wait(served, port)
    }

    pub fn wait(served: Served, port: u16) -> Door {
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the front door did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Door {
            served,
            port,
            client: Client { port },
        }
    }

    /// The effects the writes server applied, counted from outside.
    pub fn writes(&self) -> usize {
        std::fs::read_to_string(self.served.folder.path().join("writes.effects"))
            .unwrap_or_default()
            .lines()
            .count()
    }
}

impl Client {
    /// One raw exchange; `Connection: close`, so the whole answer is read.
    pub fn raw(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, String)],
        body: &[u8],
    ) -> (u16, String, Vec<u8>) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let mut request = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
        if !headers
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("host"))
        {
            request.push_str(&format!("Host: 127.0.0.1:{}\r\n", self.port));
        }
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        stream.write_all(request.as_bytes()).unwrap();
        let _ = stream.write_all(body);
        let mut response = Vec::new();
        let _ = stream.read_to_end(&mut response);
        let split = response
            .windows(4)
            .position(|window| window == b"\r\n\r\n")
            .unwrap_or_else(|| {
                panic!(
                    "no complete response: {}",
                    String::from_utf8_lossy(&response)
                )
            });
        let head = String::from_utf8_lossy(&response[..split]).into_owned();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap();
        let mut body = response[split + 4..].to_vec();
        if header(&head, "transfer-encoding")
            .is_some_and(|coding| coding.eq_ignore_ascii_case("chunked"))
        {
            body = unchunk(&body);
        }
        (status, head, body)
    }

    pub fn headers(key: Option<&str>, session: Option<&str>) -> Vec<(&'static str, String)> {
        let mut headers = vec![
            ("Content-Type", "application/json".to_owned()),
            ("Accept", "application/json, text/event-stream".to_owned()),
        ];
        if let Some(key) = key {
            headers.push(("Authorization", format!("Bearer {key}")));
        }
        if let Some(session) = session {
            headers.push(("Mcp-Session-Id", session.to_owned()));
            headers.push(("MCP-Protocol-Version", "2025-06-18".to_owned()));
        }
        headers
    }

    /// One JSON-RPC message to `/mcp`.
    pub fn rpc(&self, key: Option<&str>, session: Option<&str>, message: &Value) -> Answer {
        let (status, head, body) = self.raw(
            "POST",
            "/mcp",
            &Client::headers(key, session),
            message.to_string().as_bytes(),
        );
        Answer {
            status,
            messages: messages_of(&head, &body),
            head,
        }
    }

    /// `initialize` and `notifications/initialized`: the session id.
    pub fn open(&self, key: &str) -> String {
        let answer = self.rpc(
            Some(key),
            None,
            &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                               "clientInfo": {"name": "front-test", "version": "1"}}}),
        );
        assert_eq!(answer.status, 200, "{answer:?}");
        let session = answer
            .session()
            .unwrap_or_else(|| panic!("no session: {answer:?}"));
        let initialized = self.rpc(
            Some(key),
            Some(&session),
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        );
        assert_eq!(initialized.status, 202);
        session
    }

    /// `tools/call`: the result (or the JSON-RPC error object).
    pub fn call(
        &self,
        key: &str,
        session: &str,
        id: Value,
        name: &str,
        arguments: Value,
        meta: Option<Value>,
    ) -> Value {
        let mut params = json!({"name": name, "arguments": arguments});
        if let Some(meta) = meta {
            params["_meta"] = meta;
        }
        let answer = self.rpc(
            Some(key),
            Some(session),
            &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}),
        );
        assert_eq!(answer.status, 200, "{answer:?}");
        let last = answer.last();
        last.get("result")
            .or_else(|| last.get("error"))
            .cloned()
            .unwrap_or(Value::Null)
    }

    pub fn list(&self, key: &str, session: &str) -> Vec<Value> {
        let answer = self.rpc(
            Some(key),
            Some(session),
            &json!({"jsonrpc": "2.0", "id": "list", "method": "tools/list"}),
        );
        assert_eq!(answer.status, 200, "{answer:?}");
        answer.last()["result"]["tools"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

fn unchunk(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(end) = rest.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&rest[..end]).trim(), 16).unwrap_or(0);
        rest = &rest[end + 2..];
        if size == 0 || rest.len() < size {
            break;
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[(size + 2).min(rest.len())..];
    }
    out
}

/// The event types recorded for one invocation, in order.
fn recorded_steps(served: &Served, invocation_id: &str) -> Vec<String> {
    let (_, events) = served.get(&format!("/v1/events?after=0&tenant_id={TENANT}"));
    String::from_utf8_lossy(&events)
        .lines()
        .map(|line| json_of(line.as_bytes()))
        .filter(|event| event["payload"]["invocation_id"] == invocation_id)
        .map(|event| event["event_type"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn invocation(served: &Served, id: &str) -> Value {
    let (status, body) = served.get(&format!("/v1/invocations/{id}?tenant_id={TENANT}"));
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    json_of(&body)
}

#[test]
fn the_front_door_opens_sessions_lists_the_pinned_set_and_calls_through_the_pipeline() {
    let door = Door::start("", "");
    // The revision the client asks for, when it is one toolgate speaks; a
    // later one is answered with the latest toolgate speaks.
    for (asked, agreed) in [
        ("2025-06-18", "2025-06-18"),
        ("2025-03-26", "2025-03-26"),
        ("2026-07-28", "2025-11-25"),
    ] {
        let answer = door.rpc(
            Some(KEY_A),
            None,
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": {"protocolVersion": asked, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}),
        );
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(
            answer.last()["result"]["protocolVersion"],
            agreed,
            "{answer:?}"
        );
        assert!(answer.session().unwrap().parse::<Uuid>().is_ok());
    }
    let session = door.open(KEY_A);

    // The pinned set: names every client accepts, the operator's
    // classification as annotations, a server's description marked.
    let tools = door.list(KEY_A, &session);
    let named = |name: &str| {
        tools
            .iter()
            .find(|tool| tool["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} not listed: {tools:?}"))
    };
    for tool in &tools {
        let name = tool["name"].as_str().unwrap();
        assert!(
            (1..=64).contains(&name.len())
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
            "{name}"
        );
        assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
    }
    let echo = named("demo-echo");
    assert_eq!(
        echo["annotations"],
        json!({"readOnlyHint": true, "destructiveHint": false, "idempotentHint": true, "openWorldHint": false})
    );
    let reads = named("mcp-reads-echo");
    assert_eq!(reads["annotations"]["readOnlyHint"], true);
    assert_eq!(reads["annotations"]["openWorldHint"], true);
    assert!(
        reads["description"]
            .as_str()
            .unwrap()
            .starts_with("[Tool of MCP server \"reads\""),
        "{reads}"
    );
    let write = named("mcp-writes-write");
    assert_eq!(write["annotations"]["readOnlyHint"], false, "{write}");
    assert_eq!(write["annotations"]["idempotentHint"], false, "{write}");
    assert_eq!(
        door.list(KEY_A, &session),
        tools,
        "the list never changes within a session"
    );

    // A call is a pipeline call, recorded in the session's run.
    let result = door.call(
        KEY_A,
        &session,
        json!(3),
        "demo-echo",
        json!({"text": "hi"}),
        None,
    );
    assert_eq!(result["isError"], false, "{result}");
    let text = result["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("hi") && text.contains("EXTERNAL_UNTRUSTED"),
        "{text}"
    );
    let id = result["_meta"]["toolgate/invocation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let row = invocation(&door.served, &id);
    assert_eq!(
        (
            row["session_id"].as_str(),
            row["run_id"].as_str(),
            row["step_number"].as_i64(),
            row["call_id"].as_str()
        ),
        (
            Some(session.as_str()),
            result["_meta"]["toolgate/run_id"].as_str(),
            Some(0),
            Some("mcp:3")
        ),
        "{row}"
    );
    assert_ne!(
        row["run_id"], session,
        "the session's run for the breaker's period, not the session"
    );

    // The same steps as the same call through the control API.
    let (status, body) = door.served.echo(
        session.parse().unwrap(),
        Uuid::new_v4(),
        1,
        "c1",
        "demo.echo",
    );
    assert_eq!(status, 200, "{body}");
    let control = body["results"][0]["invocation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (front_steps, control_steps) = (
        recorded_steps(&door.served, &id),
        recorded_steps(&door.served, &control),
    );
    assert_eq!(
        front_steps,
        ["tool.call.started", "tool.call.completed"],
        "a call allowed and started in one commit"
    );
    assert_eq!(front_steps, control_steps);

    // An MCP server's tool, through the same door.
    let result = door.call(
        KEY_A,
        &session,
        json!(4),
        "mcp-reads-echo",
        json!({"text": "remote"}),
        None,
    );
    assert_eq!(result["isError"], false, "{result}");
    assert!(
        result["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("remote")
    );
}

#[test]
fn a_call_is_named_by_its_meta_or_its_request_and_asked_again_it_runs_once() {
    let door = Door::start("", "");
    let session = door.open(KEY_A);
    let line = |text: &str| json!({"line": text});

    // Without _meta: the session is the run and the request id the call.
    let first = door.call(
        KEY_A,
        &session,
        json!(10),
        "mcp-writes-write",
        line("a"),
        None,
    );
    assert_eq!(first["isError"], false, "{first}");
    let again = door.call(
        KEY_A,
        &session,
        json!(10),
        "mcp-writes-write",
        line("a"),
        None,
    );
    assert_eq!(
        again["_meta"]["toolgate/invocation_id"],
        first["_meta"]["toolgate/invocation_id"]
    );
    assert_eq!(door.writes(), 1, "the same request asked again ran once");
    let string_id = door.call(
        KEY_A,
        &session,
        json!("10"),
        "mcp-writes-write",
        line("a"),
        None,
    );
    assert_ne!(
        string_id["_meta"]["toolgate/invocation_id"],
        first["_meta"]["toolgate/invocation_id"]
    );
    assert_eq!(door.writes(), 2, "a new request is a new call");

    // With _meta: exactly /v1/calls's deduplication.
    let run = Uuid::new_v4();
    let meta =
        json!({"toolgate/run_id": run.to_string(), "toolgate/step": 1, "toolgate/call_id": "c1"});
    let named = door.call(
        KEY_A,
        &session,
        json!(11),
        "mcp-writes-write",
        line("b"),
        Some(meta.clone()),
    );
    assert_eq!(named["isError"], false, "{named}");
    let renamed = door.call(
        KEY_A,
        &session,
        json!(12),
        "mcp-writes-write",
        line("b"),
        Some(meta.clone()),
    );
    assert_eq!(
        renamed["_meta"]["toolgate/invocation_id"],
        named["_meta"]["toolgate/invocation_id"]
    );
    let (status, body) = door.served.post(
        "/v1/calls",
        &json!({"session_id": session, "run_id": run, "step_number": 1, "origin_trust": "user",
                "calls": [{"call_id": "c1", "name": "mcp.writes.write", "arguments": {"line": "b"}}]}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["results"][0]["invocation_id"],
        named["_meta"]["toolgate/invocation_id"]
    );
    assert_eq!(door.writes(), 3, "one call, whichever door asks");
    let row = invocation(
        &door.served,
        named["_meta"]["toolgate/invocation_id"].as_str().unwrap(),
    );
    assert_eq!(
        (
            row["run_id"].as_str(),
            row["step_number"].as_i64(),
            row["call_id"].as_str()
        ),
        (Some(run.to_string().as_str()), Some(1), Some("c1"))
    );

    // _meta that names a call half, or badly, is refused before anything.
    for bad in [
        json!({"toolgate/run_id": run.to_string()}),
        json!({"toolgate/run_id": "not-a-uuid", "toolgate/step": 1, "toolgate/call_id": "c"}),
        json!({"toolgate/run_id": run.to_string(), "toolgate/step": -1, "toolgate/call_id": "c"}),
        json!({"toolgate/origin_trust": "platform-root"}),
    ] {
        let refused = door.call(
            KEY_A,
            &session,
            json!(13),
            "mcp-writes-write",
            line("c"),
            Some(bad.clone()),
        );
        assert_eq!(refused["code"], -32602, "{bad} → {refused}");
    }
    assert_eq!(door.writes(), 3);
}

#[test]
fn a_client_that_drops_mid_call_and_asks_again_gets_the_one_execution() {
    let port = free_port();
    let served = Served::here().start_edited(
        |_, config| {
            config.replace("SCRIPTED_CATALOG = \"basic\", SCRIPTED_EFFECTS", "SCRIPTED_CATALOG = \"basic\", SCRIPTED_WRITE_DELAY_MS = \"1500\", SCRIPTED_EFFECTS") + &front_table(port, "")
        },
        &[],
    );
    let door = Door::wait(served, port);
    let session = door.open(KEY_A);
    let message = json!({"jsonrpc": "2.0", "id": 21, "method": "tools/call",
                         "params": {"name": "mcp-writes-write", "arguments": {"line": "once"}}});
    for _ in 0..3 {
        // The request is sent and the connection dropped before the answer.
        let mut stream = TcpStream::connect(("127.0.0.1", door.port)).unwrap();
        let body = message.to_string();
        let mut request = format!("POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n", door.port);
        for (name, value) in Client::headers(Some(KEY_A), Some(&session)) {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
        stream.write_all(request.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        drop(stream);
    }
    let answer = door.rpc(Some(KEY_A), Some(&session), &message);
    let result = &answer.last()["result"];
    assert_eq!(result["isError"], false, "{answer:?}");
    assert_eq!(
        result["content"][0]["text"]
            .as_str()
            .map(|t| t.contains("written once")),
        Some(true),
        "{result}"
    );
    // Every request that reached the door is settled by now; one effect.
    std::thread::sleep(Duration::from_millis(1600));
    assert_eq!(door.writes(), 1);
    let (_, runs) = door.served.get(&format!(
        "/v1/invocations?session_id={session}&tenant_id={TENANT}"
    ));
    let rows = json_of(&runs);
    assert_eq!(
        rows["invocations"].as_array().map(Vec::len),
        Some(1),
        "{rows}"
    );
}

/// Sends a `tools/call` of `message` on a connection of its own, in
/// `session` (the 2025 era) or on its own (2026-07-28, when `None`), and
/// closes that connection once `effects` effects are counted from outside:
/// the call has acted and its answer is still to come.
fn send_then_break(door: &Door, session: Option<&str>, key: &str, message: &Value, effects: usize) {
    let mut message = message.clone();
    let mut headers = Client::headers(Some(key), session);
    if session.is_none() {
        message["params"]["_meta"] = stateless::request_meta(json!({}));
        let name = message["params"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        headers.extend([
            ("MCP-Protocol-Version", stateless::REVISION.to_owned()),
            ("Mcp-Method", "tools/call".to_owned()),
            ("Mcp-Name", name),
        ]);
    }
    let body = message.to_string();
    let mut stream = TcpStream::connect(("127.0.0.1", door.port)).unwrap();
    let mut request = format!("POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n", door.port);
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).unwrap();
    let started = Instant::now();
    while door.writes() < effects {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the effect did not happen"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    stream.shutdown(std::net::Shutdown::Both).unwrap();
}

/// Whether a result's first block says `text` (inside its envelope).
fn said(result: &Value, text: &str) -> bool {
    result["content"][0]["text"]
        .as_str()
        .is_some_and(|said| said.contains(text))
}

fn write_call(id: i64, line: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "mcp-writes-write", "arguments": {"line": line}}})
}

/// The events of one type about one invocation, waited for (they are
/// written when the call's run ends, beside its answer).
fn events_of(served: &Served, invocation_id: &str, event_type: &str, count: usize) -> Vec<Value> {
    let started = Instant::now();
    loop {
        let (_, events) = served.get(&format!("/v1/events?after=0&tenant_id={TENANT}"));
        let found: Vec<Value> = String::from_utf8_lossy(&events)
            .lines()
            .map(|line| json_of(line.as_bytes()))
            .filter(|event| {
                event["payload"]["invocation_id"] == invocation_id
                    && event["event_type"] == event_type
            })
            .collect();
        if found.len() >= count || started.elapsed() > Duration::from_secs(30) {
            return found;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The re-issue rule as a 2025-era client meets it: a call's stream
/// breaks after its effect, the client reconnects (a new session) and asks
/// for the same call with a new request id; it gets the one execution's
/// answer. A delivered answer makes the next identical call a new one;
/// another tenant's principal and other arguments are never the same call.
#[test]
fn a_call_whose_answer_was_never_delivered_is_the_same_call_asked_again() {
    let door = Door::slow_answers("");
    let first = door.open(KEY_A);
    send_then_break(&door, Some(&first), KEY_A, &write_call(1, "once"), 1);
    // The client's reconnect: a new session, a new request id.
    let second = door.open(KEY_A);
    let result = door.call(
        KEY_A,
        &second,
        json!(1),
        "mcp-writes-write",
        json!({"line": "once"}),
        None,
    );
    assert_eq!(door.writes(), 1, "the re-issue ran it again: {result}");
    assert_eq!(result["isError"], false, "{result}");
    assert!(said(&result, "written once"), "{result}");
    assert_eq!(result["_meta"]["toolgate/reissue"], "same_call", "{result}");
    let invocation_id = result["_meta"]["toolgate/invocation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let row = invocation(&door.served, &invocation_id);
    assert_eq!(
        row["session_id"], first,
        "the call of the broken stream: {row}"
    );
    assert_eq!(row["run_id"], result["_meta"]["toolgate/run_id"], "{row}");
    let undelivered = events_of(
        &door.served,
        &invocation_id,
        "tool.call.answer_undelivered",
        1,
    );
    assert_eq!(undelivered.len(), 1, "{undelivered:?}");
    assert_eq!(undelivered[0]["payload"]["session_id"], first);
    let reissued = events_of(&door.served, &invocation_id, "tool.call.reissued", 1);
    assert_eq!(reissued[0]["payload"]["reissue"], "same_call");
    assert_eq!(reissued[0]["payload"]["session_id"], second);

    // Delivered: the same call asked again is a new one (a model that
    // means two writes gets two).
    let again = door.call(
        KEY_A,
        &second,
        json!(2),
        "mcp-writes-write",
        json!({"line": "once"}),
        None,
    );
    assert_eq!(again["isError"], false, "{again}");
    assert!(again["_meta"].get("toolgate/reissue").is_none(), "{again}");
    assert_eq!(door.writes(), 2);
    // Its own request id asked again in its session is still that call.
    let retried = door.call(
        KEY_A,
        &second,
        json!(2),
        "mcp-writes-write",
        json!({"line": "once"}),
        None,
    );
    assert_eq!(
        retried["_meta"]["toolgate/invocation_id"],
        again["_meta"]["toolgate/invocation_id"]
    );
    assert_eq!(door.writes(), 2);

    // Undelivered again; another tenant's principal and other arguments
    // are new calls, the same principal's same call is not.
    send_then_break(&door, Some(&second), KEY_A, &write_call(3, "twice"), 3);
    let other = door.open(KEY_B);
    let theirs = door.call(
        KEY_B,
        &other,
        json!(3),
        "mcp-writes-write",
        json!({"line": "twice"}),
        None,
    );
    assert_eq!(theirs["isError"], false, "{theirs}");
    assert_eq!(door.writes(), 4);
    let different = door.call(
        KEY_A,
        &second,
        json!(4),
        "mcp-writes-write",
        json!({"line": "thrice"}),
        None,
    );
    assert_eq!(different["isError"], false, "{different}");
    assert_eq!(door.writes(), 5);
    let third = door.open(KEY_A);
    let reissue = door.call(
        KEY_A,
        &third,
        json!(9),
        "mcp-writes-write",
        json!({"line": "twice"}),
        None,
    );
    assert_eq!(
        reissue["_meta"]["toolgate/reissue"], "same_call",
        "{reissue}"
    );
    assert!(said(&reissue, "written twice"), "{reissue}");
    assert_eq!(door.writes(), 5);
    let lines = std::fs::read_to_string(door.served.folder.path().join("writes.effects")).unwrap();
    assert_eq!(lines, "once\nonce\ntwice\ntwice\nthrice\n");
}

/// Past the window: a write whose answer never arrived is not run blind
/// when asked again; the answer is its recorded outcome with a first block
/// saying why, marked `past_window` (a read past the window is a new call:
/// `front::reissue`'s unit tests).
#[test]
fn past_the_window_an_undelivered_write_answers_its_record_and_says_so() {
    let door = Door::slow_answers("reissue_window_seconds = 1");
    let session = door.open(KEY_A);
    send_then_break(&door, Some(&session), KEY_A, &write_call(1, "late"), 1);
    // The write ends (its answer undelivered), then the window passes.
    let started = Instant::now();
    let undelivered = loop {
        let (_, events) = door
            .served
            .get(&format!("/v1/events?after=0&tenant_id={TENANT}"));
        let found = String::from_utf8_lossy(&events)
            .lines()
            .map(|line| json_of(line.as_bytes()))
            .find(|event| event["event_type"] == "tool.call.answer_undelivered");
        if let Some(found) = found {
            break found;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the write did not end"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    std::thread::sleep(Duration::from_millis(1100));
    let late = door.call(
        KEY_A,
        &session,
        json!(2),
        "mcp-writes-write",
        json!({"line": "late"}),
        None,
    );
    assert_eq!(door.writes(), 1, "nothing ran again: {late}");
    assert_eq!(late["_meta"]["toolgate/reissue"], "past_window", "{late}");
    assert_eq!(
        late["_meta"]["toolgate/invocation_id"], undelivered["payload"]["invocation_id"],
        "{late}"
    );
    assert!(
        late["content"][0]["text"]
            .as_str()
            .is_some_and(|text| text.contains("nothing ran again")),
        "{late}"
    );
}

/// The re-issue rule on PostgreSQL, in both eras: a write whose stream
/// broke after its effect, asked again with a new request id (a new
/// session in the 2025 era, a request on its own in 2026-07-28), acts once.
#[test]
fn the_reissue_rule_holds_on_postgresql_in_both_eras() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let Some(schema) = runtime.block_on(crate::store::PgSchema::create()) else {
        eprintln!("DATABASE_URL unset: the PostgreSQL re-issue test runs on PostgreSQL only");
        return;
    };
    let door = Door::slow_answers_on(Some(&schema.url), "");
    let first = door.open(KEY_A);
    send_then_break(&door, Some(&first), KEY_A, &write_call(1, "pg-2025"), 1);
    let second = door.open(KEY_A);
    let result = door.call(
        KEY_A,
        &second,
        json!(7),
        "mcp-writes-write",
        json!({"line": "pg-2025"}),
        None,
    );
    assert_eq!(door.writes(), 1, "the 2025 re-issue ran it again: {result}");
    assert_eq!(result["_meta"]["toolgate/reissue"], "same_call", "{result}");

    send_then_break(&door, None, KEY_A, &write_call(1, "pg-2026"), 2);
    let again = stateless::send(
        &door,
        KEY_A,
        "tools/call",
        json!({"name": "mcp-writes-write", "arguments": {"line": "pg-2026"}}),
        &[],
    );
    let again = &again.last()["result"];
    assert_eq!(door.writes(), 2, "the 2026 re-issue ran it again: {again}");
    assert_eq!(again["_meta"]["toolgate/reissue"], "same_call", "{again}");
    // The sidecar stops before its schema is dropped.
    drop(door);
    drop(schema);
}

#[test]
fn an_approval_holds_the_call_then_pends_and_the_same_call_asked_again_resumes_it_once() {
    let door = Door::start("", "");
    let session = door.open(KEY_A);
    let ask = |id: i64, progress: bool| {
        let mut params = json!({"name": "demo-external_write", "arguments": {"line": "held"}});
        if progress {
            params["_meta"] = json!({"progressToken": format!("p{id}")});
        }
        door.rpc(
            Some(KEY_A),
            Some(&session),
            &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}),
        )
    };
    let started = Instant::now();
    let held = ask(1, true);
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "held for the hold"
    );
    let progress: Vec<&Value> = held
        .messages
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .collect();
    assert!(!progress.is_empty(), "{held:?}");
    assert_eq!(progress[0]["params"]["progressToken"], "p1");
    let pending = &held.last()["result"];
    assert_eq!(
        (
            pending["isError"].as_bool(),
            pending["structuredContent"]["status"].as_str()
        ),
        (Some(true), Some("pending")),
        "{pending}"
    );
    let approval = pending["structuredContent"]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(door.served.external_writes(), 0);

    // Asked again by a client that cannot name its calls: the same call,
    // the same approval.
    let again = ask(2, false);
    assert_eq!(
        again.last()["result"]["structuredContent"]["approval_id"],
        approval,
        "{again:?}"
    );
    let (_, body) = door
        .served
        .get(&format!("/v1/approvals?status=pending&tenant_id={TENANT}"));
    let listed = json_of(&body);
    assert_eq!(
        listed["approvals"].as_array().map(Vec::len),
        Some(1),
        "never a second approval"
    );
    // The front door recorded when the MCP request holding the call stops
    // waiting; no bridge turn holds it.
    let held = &listed["approvals"][0];
    let at = |field: &str| {
        chrono::DateTime::parse_from_rfc3339(held[field].as_str().unwrap_or_default())
            .unwrap_or_else(|_| panic!("{field} in {listed}"))
    };
    assert!(at("hold_ends_at") >= at("requested_at"), "{listed}");
    assert_eq!(held["turn_id"], Value::Null);

    let (status, _) = door.served.post(
        &format!("/v1/approvals/{approval}?tenant_id={TENANT}"),
        &json!({"decision": "approve", "approver": "ops"}),
    );
    assert_eq!(status, 200);
    let resumed = ask(3, false);
    assert_eq!(resumed.last()["result"]["isError"], false, "{resumed:?}");
    assert_eq!(
        resumed.last()["result"]["_meta"]["toolgate/invocation_id"],
        pending["structuredContent"]["invocation_id"]
    );
    assert_eq!(door.served.external_writes(), 1);

    // A decision made while the call is held answers that very request.
    let asker = {
        let (port, session) = (door.port, session.clone());
        std::thread::spawn(move || {
            Client { port }.rpc(
                Some(KEY_A),
                Some(&session),
                &json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                "params": {"name": "demo-external_write", "arguments": {"line": "second"}}}),
            )
        })
    };
    let approval = door.served.pending_approvals(TENANT, 1)[0]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Only the session's own caller withdraws its call: another tenant's
    // key and another principal of the same tenant are not it.
    for stranger in [KEY_B, KEY_A2] {
        let cancelled = door.rpc(
            Some(stranger),
            Some(&session),
            &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 4, "reason": "not yours"}}),
        );
        assert_eq!(cancelled.status, 202, "{cancelled:?}");
    }
    door.served.post(
        &format!("/v1/approvals/{approval}?tenant_id={TENANT}"),
        &json!({"decision": "approve", "approver": "ops"}),
    );
    let answer = asker.join().unwrap();
    assert_eq!(answer.last()["result"]["isError"], false, "{answer:?}");
    assert_eq!(door.served.external_writes(), 2);
}

#[test]
fn denials_and_uncertain_outcomes_are_errors_with_the_six_field_outcome() {
    let door = Door::start("", "");
    let session = door.open(KEY_A);
    let denied = door.call(
        KEY_A,
        &session,
        json!(1),
        "demo-keyed_write",
        json!({"line": "k"}),
        None,
    );
    assert_eq!(denied["isError"], true, "{denied}");
    let outcome = &denied["structuredContent"];
    assert_eq!(
        (outcome["status"].as_str(), outcome["reason_code"].as_str()),
        (Some("denied"), Some("policy.rule.denied")),
        "{denied}"
    );
    for field in ["action", "message", "retryable", "remediation"] {
        assert!(outcome.get(field).is_some(), "{field}: {outcome}");
    }
    assert!(
        denied["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains(outcome["message"].as_str().unwrap())
    );

    let uncertain = door.call(
        KEY_A,
        &session,
        json!(2),
        "mcp-writes-write_then_die",
        json!({"line": "x"}),
        None,
    );
    assert_eq!(uncertain["isError"], true, "{uncertain}");
    assert_eq!(uncertain["structuredContent"]["status"], "uncertain");
    for said in [
        &uncertain["content"][0]["text"],
        &uncertain["structuredContent"]["message"],
    ] {
        assert!(
            said.as_str().unwrap().contains("Do not repeat"),
            "{uncertain}"
        );
    }
    let unknown = door.call(KEY_A, &session, json!(3), "no-such-tool", json!({}), None);
    assert_eq!(unknown["isError"], true, "{unknown}");
}

#[test]
fn a_cancelled_held_call_ends_and_its_approval_waits_for_the_call_asked_again() {
    let door = Door::start("approval_hold_seconds = 60", "");
    let session = door.open(KEY_A);
    let asker = {
        let (port, session) = (door.port, session.clone());
        std::thread::spawn(move || {
            let started = Instant::now();
            let answer = Client { port }.rpc(
                Some(KEY_A),
                Some(&session),
                &json!({"jsonrpc": "2.0", "id": "held", "method": "tools/call",
                "params": {"name": "demo-external_write", "arguments": {"line": "cancelled"}}}),
            );
            (answer, started.elapsed())
        })
    };
    let approval = door.served.pending_approvals(TENANT, 1)[0]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let cancelled = door.rpc(
        Some(KEY_A),
        Some(&session),
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": "held", "reason": "the user moved on"}}),
    );
    assert_eq!(cancelled.status, 202);
    let (answer, took) = asker.join().unwrap();
    assert!(
        took < Duration::from_secs(30),
        "the hold ended at the cancellation: {took:?}"
    );
    assert!(answer.last().get("error").is_some(), "{answer:?}");
    // Nothing ran; the one row and its approval wait for the call asked
    // again, which resumes them once decided.
    assert_eq!(door.served.external_writes(), 0);
    let (_, runs) = door.served.get(&format!(
        "/v1/invocations?session_id={session}&tenant_id={TENANT}"
    ));
    let rows = json_of(&runs)["invocations"].clone();
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows}");
    assert_eq!(rows[0]["status"], "waiting_for_approval");
    door.served.post(
        &format!("/v1/approvals/{approval}?tenant_id={TENANT}"),
        &json!({"decision": "deny", "approver": "ops"}),
    );
    let denied = door.call(
        KEY_A,
        &session,
        json!("again"),
        "demo-external_write",
        json!({"line": "cancelled"}),
        None,
    );
    assert_eq!(
        denied["structuredContent"]["reason_code"], "policy.approval.denied",
        "{denied}"
    );
    assert_eq!(door.served.external_writes(), 0);
}

#[test]
fn hostile_requests_at_the_door_get_clear_errors_record_nothing_and_leave_it_up() {
    let door = Door::start(
        "sessions_per_credential = 3\nsession_in_flight = 1",
        "[limits]\nrequest_body_timeout_seconds = 1\nrequest_body_bytes = 65536\n",
    );
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});

    // No credential, or a wrong one: 401 and where to log in.
    let missing = door.rpc(None, None, &initialize);
    assert_eq!(missing.status, 401);
    let challenge = header(&missing.head, "www-authenticate").unwrap();
    assert!(
        challenge.starts_with("Bearer resource_metadata=\"http://127.0.0.1:"),
        "{challenge}"
    );
    assert!(
        challenge.ends_with("/.well-known/oauth-protected-resource/mcp\""),
        "{challenge}"
    );
    let wrong = door.rpc(Some("tgk_not_a_key"), None, &initialize);
    assert_eq!(wrong.status, 401);
    assert!(
        header(&wrong.head, "www-authenticate")
            .unwrap()
            .contains("error=\"invalid_token\"")
    );
    let (status, _, metadata) =
        door.raw("GET", "/.well-known/oauth-protected-resource/mcp", &[], b"");
    assert_eq!(status, 200);
    let metadata = json_of(&metadata);
    assert_eq!(
        metadata["resource"],
        format!("http://127.0.0.1:{}/mcp", door.port)
    );
    assert_eq!(metadata["bearer_methods_supported"], json!(["header"]));

    // DNS rebinding: a Host or an Origin toolgate does not answer to.
    let (status, _, _) = door.raw(
        "POST",
        "/mcp",
        &[
            ("Host", "evil.example.com".into()),
            ("Authorization", format!("Bearer {KEY_A}")),
        ],
        initialize.to_string().as_bytes(),
    );
    assert_eq!(status, 403);
    // A Host with user information, and an allowed name on another port,
    // are not the endpoint.
    for host in [
        format!("evil.example.com@127.0.0.1:{}", door.port),
        format!("127.0.0.1:{}@evil.example.com", door.port),
        "localhost:1".to_owned(),
        "127.0.0.1:8080".to_owned(),
    ] {
        let (status, _, _) = door.raw(
            "POST",
            "/mcp",
            &[
                ("Host", host.clone()),
                ("Authorization", format!("Bearer {KEY_A}")),
            ],
            initialize.to_string().as_bytes(),
        );
        assert_eq!(status, 403, "{host}");
    }
    let (status, _, _) = door.raw(
        "POST",
        "/mcp",
        &[
            ("Origin", "http://evil.example.com".into()),
            ("Authorization", format!("Bearer {KEY_A}")),
        ],
        initialize.to_string().as_bytes(),
    );
    assert_eq!(status, 403);
    // A page of the endpoint's own host may; it opens the session used
    // below.
    let own = [
        ("Origin", format!("http://localhost:{}", door.port)),
        ("Authorization", format!("Bearer {KEY_A}")),
        ("Content-Type", "application/json".into()),
        ("Accept", "application/json, text/event-stream".into()),
    ];
    let (status, head, _) = door.raw("POST", "/mcp", &own, initialize.to_string().as_bytes());
    assert_eq!(status, 200);
    let session = header(&head, "mcp-session-id").unwrap();

    // Another tenant's session, and another principal's, do not exist for
    // them; nor can they end it.
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    for key in [KEY_B, KEY_A2] {
        let answer = door.rpc(Some(key), Some(&session), &list);
        assert_eq!(answer.status, 404, "{answer:?}");
        let (status, _, _) = door.raw(
            "DELETE",
            "/mcp",
            &Client::headers(Some(key), Some(&session)),
            b"",
        );
        assert_eq!(status, 404);
    }
    assert_eq!(
        door.rpc(Some(KEY_A), Some(&session), &list).status,
        200,
        "the session is still its owner's"
    );
    assert_eq!(
        door.rpc(Some(KEY_A), None, &list).status,
        400,
        "a session is required after initialize"
    );
    assert_eq!(
        door.rpc(Some(KEY_A), Some("not-a-session"), &list).status,
        404
    );
    assert_eq!(
        door.rpc(Some(KEY_A), Some(&Uuid::new_v4().to_string()), &list)
            .status,
        404
    );

    // Malformed, batched, oversized, slow, wrong method.
    let (status, _, body) = door.raw(
        "POST",
        "/mcp",
        &Client::headers(Some(KEY_A), Some(&session)),
        b"{not json",
    );
    assert_eq!(
        (status, json_of(&body)["error"]["code"].as_i64()),
        (400, Some(-32700))
    );
    let batch = json!([list, list]);
    let (status, _, body) = door.raw(
        "POST",
        "/mcp",
        &Client::headers(Some(KEY_A), Some(&session)),
        batch.to_string().as_bytes(),
    );
    assert_eq!(
        (status, json_of(&body)["error"]["code"].as_i64()),
        (400, Some(-32600))
    );
    let huge = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                      "params": {"name": "demo-echo", "arguments": {"text": "x".repeat(100_000)}}});
    let (status, _, _) = door.raw(
        "POST",
        "/mcp",
        &Client::headers(Some(KEY_A), Some(&session)),
        huge.to_string().as_bytes(),
    );
    assert_eq!(status, 413);
    {
        let mut stream = TcpStream::connect(("127.0.0.1", door.port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let request = format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {KEY_A}\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{{\"jsonrpc\"",
            door.port
        );
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    }
    let (status, head, _) = door.raw(
        "GET",
        "/mcp",
        &Client::headers(Some(KEY_A), Some(&session)),
        b"",
    );
    assert_eq!(status, 405);
    assert!(header(&head, "allow").is_some());
    let unknown = door.rpc(
        Some(KEY_A),
        Some(&session),
        &json!({"jsonrpc": "2.0", "id": 3, "method": "sampling/createMessage", "params": {}}),
    );
    assert!(unknown.last().get("error").is_some(), "{unknown:?}");
    let (status, _, _) = door.raw("GET", "/elsewhere", &[], b"");
    assert_eq!(status, 404);

    // A flood of sessions stops at the credential's bound.
    let _second = door.open(KEY_A);
    let _third = door.open(KEY_A);
    let started = Instant::now();
    for _ in 0..2000 {
        let refused = door.rpc(Some(KEY_A), None, &initialize);
        assert_eq!(refused.last()["error"]["code"], -32003, "{refused:?}");
    }
    assert!(started.elapsed() < Duration::from_secs(60));
    let (status, _, _) = door.raw(
        "DELETE",
        "/mcp",
        &Client::headers(Some(KEY_A), Some(&session)),
        b"",
    );
    assert_eq!(status, 204);
    let _fourth = door.open(KEY_A);
    // Another credential is not held back by this one.
    let other = door.open(KEY_B);

    // One call in flight per session here: a second is refused, not queued.
    let holder = {
        let (port, other) = (door.port, other.clone());
        std::thread::spawn(move || {
            Client { port }.rpc(
                Some(KEY_B),
                Some(&other),
                &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "demo-external_write", "arguments": {"line": "hold"}}}),
            )
        })
    };
    // The first call is held for its approval (in flight) before the
    // second is asked.
    door.served.pending_approvals("tenant-other", 1);
    let busy = door.call(
        KEY_B,
        &other,
        json!(2),
        "demo-echo",
        json!({"text": "x"}),
        None,
    );
    assert_eq!(busy["code"], -32004, "{busy}");
    let held = holder.join().unwrap();
    assert_eq!(
        held.last()["result"]["structuredContent"]["status"],
        "pending",
        "{held:?}"
    );

    // Up, and nothing recorded but what the calls above were.
    assert_eq!(door.served.get("/healthz").0, 200);
    let (_, runs) = door.served.get(&format!(
        "/v1/invocations?session_id={session}&tenant_id={TENANT}"
    ));
    assert_eq!(json_of(&runs)["invocations"], json!([]));
}

#[test]
fn api_keys_from_their_file_rotate_on_sighup() {
    let port = free_port();
    let first = "tgk_rotation_first_000000000000000000000000000000000000000000000001";
    let second = "tgk_rotation_second_00000000000000000000000000000000000000000000002";
    let entry = |key: &str| {
        format!(
            "[[api_keys]]\nid = \"rotating\"\nsha256 = \"{}\"\ntenant_id = \"{TENANT}\"\nprincipal = {{ id = \"user-1\", scopes = [\"demo.use\"] }}\ntools = [\"demo.*\"]\n",
            toolgate::domain::sha256_hex(key.as_bytes())
        )
    };
    let served = Served::start_edited(
        |root, config| {
            std::fs::write(root.join("keys.toml"), entry(first)).unwrap();
            format!(
                "{config}\n[front]\nlisten = \"127.0.0.1:{port}\"\napi_keys_file = \"keys.toml\"\n"
            )
        },
        &[],
    );
    let door = Door::wait(served, port);
    let session = door.open(first);
    let hangup = || reload_keys(&door);
    std::fs::write(door.served.folder.path().join("keys.toml"), entry(second)).unwrap();
    hangup();
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    assert_eq!(
        door.rpc(Some(first), None, &initialize).status,
        401,
        "the old key is dead"
    );
    assert_eq!(
        door.rpc(
            Some(first),
            Some(&session),
            &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        )
        .status,
        401
    );
    let renewed = door.open(second);
    // A file that does not validate leaves the keys in force.
    std::fs::write(
        door.served.folder.path().join("keys.toml"),
        "[[api_keys]]\nid = \"broken\"\n",
    )
    .unwrap();
    hangup();
    assert_eq!(
        door.rpc(
            Some(second),
            Some(&renewed),
            &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        )
        .status,
        200
    );
    let logs = door.served.logs.lock().unwrap().clone();
    assert!(
        logs.contains("\"problem\":\"front API keys (those in force stay)"),
        "{logs}"
    );
    assert!(
        !logs.contains(first) && !logs.contains(second),
        "no key in a log line"
    );
}

/// SIGHUP, and back once the node has read its key file again. Each
/// reload changes the keys or refuses them, and logs it: this waits for
/// that line, not for a time.
fn reload_keys(door: &Door) {
    let said = || {
        door.served
            .logs
            .lock()
            .unwrap()
            .matches("front API keys")
            .count()
    };
    let before = said();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(door.served.pid().unwrap() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let started = std::time::Instant::now();
    while said() == before {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no reload logged"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// ES256 tokens signed here, verified by toolgate.
pub mod jwt {
    use ring::rand::SystemRandom;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
    use serde_json::{Value, json};

    pub fn base64url(bytes: &[u8]) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let n = chunk.iter().fold(0u32, |acc, b| (acc << 8) | u32::from(*b))
                << (8 * (3 - chunk.len()));
            for i in 0..=chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            }
        }
        out
    }

    pub struct Signer {
        pub kid: String,
        pair: EcdsaKeyPair,
    }

    impl Signer {
        pub fn new(kid: &str) -> Signer {
            let rng = SystemRandom::new();
            let pkcs8 =
                EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
            let pair =
                EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
                    .unwrap();
            Signer {
                kid: kid.to_owned(),
                pair,
            }
        }

        /// The public key as a JWK.
        pub fn jwk(&self) -> Value {
            let point = self.pair.public_key().as_ref();
            json!({"kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": self.kid,
                   "x": base64url(&point[1..33]), "y": base64url(&point[33..65])})
        }

        pub fn token(&self, claims: &Value) -> String {
            self.token_with_header(
                &json!({"alg": "ES256", "typ": "JWT", "kid": self.kid}),
                claims,
            )
        }

        /// A token with this protected header.
        pub fn token_with_header(&self, header: &Value, claims: &Value) -> String {
            let signing_input = format!(
                "{}.{}",
                base64url(header.to_string().as_bytes()),
                base64url(claims.to_string().as_bytes())
            );
            let signature = self
                .pair
                .sign(&SystemRandom::new(), signing_input.as_bytes())
                .unwrap();
            format!("{signing_input}.{}", base64url(signature.as_ref()))
        }
    }

    pub fn now() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }
}

#[test]
fn jwt_bearer_tokens_are_verified_against_the_key_set_and_map_to_their_tenant() {
    let signer = jwt::Signer::new("k1");
    let stranger = jwt::Signer::new("k1");
    let port = free_port();
    let jwks = json!({"keys": [signer.jwk()]});
    let served = Served::start_edited(
        |root, config| {
            std::fs::write(root.join("jwks.json"), jwks.to_string()).unwrap();
            format!(
                r#"{config}
[front]
listen = "127.0.0.1:{port}"
authorization_servers = ["https://login.example.com"]

[front.jwt]
issuer = "https://login.example.com"
audiences = ["toolgate"]
jwks_file = "jwks.json"
algorithms = ["ES256"]
leeway_seconds = 5
tools = ["demo.*"]
origin_trust_claim = "trust"
"#
            )
        },
        &[],
    );
    let door = Door::wait(served, port);
    let claims = |changes: Value| {
        let mut claims = json!({"iss": "https://login.example.com", "aud": "toolgate", "sub": "user-7",
                                "tenant_id": TENANT, "scope": "demo.use other.scope",
                                "exp": jwt::now() + 300, "iat": jwt::now()});
        for (key, value) in changes.as_object().unwrap() {
            if value.is_null() {
                claims.as_object_mut().unwrap().remove(key);
            } else {
                claims[key] = value.clone();
            }
        }
        claims
    };
    let good = signer.token(&claims(json!({})));
    let session = door.open(&good);
    let result = door.call(
        &good,
        &session,
        json!(1),
        "demo-echo",
        json!({"text": "jwt"}),
        None,
    );
    assert_eq!(result["isError"], false, "{result}");
    let row = invocation(
        &door.served,
        result["_meta"]["toolgate/invocation_id"].as_str().unwrap(),
    );
    assert_eq!(row["tenant_id"], TENANT);
    // A token that states no trust gets the most restrictive reading; one
    // that states a trust gets it, never above the operator's maximum.
    assert_eq!(row["origin_trust"], "external_untrusted", "{row}");
    for (stated, given) in [("user", "user"), ("platform", "user")] {
        let token = signer.token(&claims(json!({"trust": stated})));
        let session = door.open(&token);
        let result = door.call(
            &token,
            &session,
            json!(1),
            "demo-echo",
            json!({"text": stated}),
            None,
        );
        let row = invocation(
            &door.served,
            result["_meta"]["toolgate/invocation_id"].as_str().unwrap(),
        );
        assert_eq!(row["origin_trust"], given, "{stated}: {row}");
    }

    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let forged_none = format!(
        "{}.{}.",
        jwt::base64url(br#"{"alg":"none","typ":"JWT"}"#),
        jwt::base64url(claims(json!({})).to_string().as_bytes())
    );
    for (what, token) in [
        (
            "expired",
            signer.token(&claims(json!({"exp": jwt::now() - 60}))),
        ),
        (
            "not yet valid",
            signer.token(&claims(json!({"nbf": jwt::now() + 600}))),
        ),
        (
            "another audience",
            signer.token(&claims(json!({"aud": "someone-else"}))),
        ),
        (
            "another issuer",
            signer.token(&claims(json!({"iss": "https://evil.example.com"}))),
        ),
        ("no expiry", signer.token(&claims(json!({"exp": null})))),
        (
            "no tenant",
            signer.token(&claims(json!({"tenant_id": null}))),
        ),
        (
            "a bad tenant",
            signer.token(&claims(json!({"tenant_id": "a/b"}))),
        ),
        ("signed by another key", stranger.token(&claims(json!({})))),
        ("alg none", forged_none),
        ("tampered", format!("{}x", &good[..good.len() - 1])),
        (
            "a trust claim that is no trust label",
            signer.token(&claims(json!({"trust": "root"}))),
        ),
        (
            "a critical extension toolgate does not understand",
            signer.token_with_header(
                &json!({"alg": "ES256", "typ": "JWT", "kid": "k1",
                        "crit": ["exp-ext"], "exp-ext": true}),
                &claims(json!({})),
            ),
        ),
    ] {
        let answer = door.rpc(Some(&token), None, &initialize);
        assert_eq!(answer.status, 401, "{what}: {answer:?}");
    }
    // The tenant comes from the token, never the request: another tenant's
    // token cannot reach this session.
    let other = signer.token(&claims(json!({"tenant_id": "tenant-other"})));
    let answer = door.rpc(
        Some(&other),
        Some(&session),
        &json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}),
    );
    assert_eq!(answer.status, 404);
    let (_, _, metadata) = door.raw("GET", "/.well-known/oauth-protected-resource", &[], b"");
    assert_eq!(
        json_of(&metadata)["authorization_servers"],
        json!(["https://login.example.com"])
    );

    // The provider rotates its key: SIGHUP reads the key set file again,
    // after which the new key's tokens are taken and the old key's are not.
    let rotated = jwt::Signer::new("k2");
    std::fs::write(
        door.served.folder.path().join("jwks.json"),
        json!({"keys": [rotated.jwk()]}).to_string(),
    )
    .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(door.served.pid().unwrap() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let renewed = rotated.token(&claims(json!({})));
    let started = Instant::now();
    while door.rpc(Some(&renewed), None, &initialize).status != 200 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the rotated key set was not read on SIGHUP"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        door.rpc(Some(&good), None, &initialize).status,
        401,
        "the old key is gone with its set"
    );
}

/// A JWK set served over HTTP on loopback, which egress is told to allow.
fn serve_jwks(body: std::sync::Arc<std::sync::Mutex<String>>) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            let mut buffer = [0u8; 4096];
            let _ = stream.read(&mut buffer);
            let text = body.lock().unwrap().clone();
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                text.len()
            );
        }
    });
    port
}

#[test]
fn a_key_set_fetched_through_egress_is_refreshed_for_rotated_keys() {
    let old = jwt::Signer::new("old");
    let new = jwt::Signer::new("new");
    let body = std::sync::Arc::new(std::sync::Mutex::new(
        json!({"keys": [old.jwk()]}).to_string(),
    ));
    let jwks_port = serve_jwks(body.clone());
    let port = free_port();
    let served = Served::here().start_edited(
        |_, config| {
            let config = config.replace(
                "allow = [\"mcp.example.com\", \"*.auth.example.com\"]",
                &format!("allow = [\"mcp.example.com\", \"http://127.0.0.1:{jwks_port}\"]\nallow_cidrs = [\"127.0.0.1/32\"]"),
            );
            format!(
                "{config}\n[front]\nlisten = \"127.0.0.1:{port}\"\n\n[front.jwt]\nissuer = \"https://login.example.com\"\naudiences = [\"toolgate\"]\njwks_url = \"http://127.0.0.1:{jwks_port}/jwks.json\"\njwks_refresh_seconds = 10\ntenant_id = \"{TENANT}\"\ntools = [\"demo.*\"]\nalgorithms = [\"ES256\"]\n"
            )
        },
        &[],
    );
    let door = Door::wait(served, port);
    let claims = json!({"iss": "https://login.example.com", "aud": ["toolgate"], "sub": "user-9",
                        "scope": ["demo.use"], "exp": jwt::now() + 600});
    let started = Instant::now();
    loop {
        let answer = door.rpc(Some(&old.token(&claims)), None, &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}));
        if answer.status == 200 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the key set was not fetched: {answer:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The provider rotates: the new key is used once the set is fetched
    // again, the old one stops working.
    *body.lock().unwrap() = json!({"keys": [new.jwk()]}).to_string();
    let started = Instant::now();
    loop {
        let answer = door.rpc(Some(&new.token(&claims)), None, &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}));
        if answer.status == 200 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "the rotated key was not fetched: {answer:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let answer = door.rpc(Some(&old.token(&claims)), None, &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}));
    assert_eq!(answer.status, 401);
}

#[test]
fn a_session_opened_on_one_node_continues_on_another_and_ends_on_both() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let Some(schema) = runtime.block_on(crate::store::PgSchema::create()) else {
        eprintln!("DATABASE_URL unset: the two-node front door test runs on PostgreSQL only");
        return;
    };
    let (first_port, second_port) = (free_port(), free_port());
    let node = |port: u16| {
        let url = schema.url.clone();
        Door::wait(
            Served::here().start_edited(
                move |_, config| {
                    config.replace(
                        "url = \"sqlite://toolgate.db\"",
                        &format!("url = \"{url}\""),
                    ) + &front_table(port, "")
                },
                &[],
            ),
            port,
        )
    };
    let first = node(first_port);
    let second = node(second_port);
    let session = first.open(KEY_A);
    let on_first = first.call(
        KEY_A,
        &session,
        json!(1),
        "demo-echo",
        json!({"text": "one"}),
        None,
    );
    let on_second = second.call(
        KEY_A,
        &session,
        json!(1),
        "demo-echo",
        json!({"text": "one"}),
        None,
    );
    assert_eq!(on_second["isError"], false, "{on_second}");
    assert_eq!(
        on_second["_meta"]["toolgate/invocation_id"], on_first["_meta"]["toolgate/invocation_id"],
        "one call, whichever node"
    );
    assert_eq!(second.list(KEY_A, &session), first.list(KEY_A, &session));
    assert_eq!(
        second
            .rpc(
                Some(KEY_B),
                Some(&session),
                &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
            )
            .status,
        404
    );
    let (status, _, _) = second.raw(
        "DELETE",
        "/mcp",
        &Client::headers(Some(KEY_A), Some(&session)),
        b"",
    );
    assert_eq!(status, 204);
    // The node that held it in memory sees the end within its recheck.
    let ended = Instant::now();
    loop {
        let answer = first.rpc(
            Some(KEY_A),
            Some(&session),
            &json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}),
        );
        if answer.status == 404 {
            break;
        }
        assert!(
            ended.elapsed() < Duration::from_secs(10),
            "ended on every node: {answer:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn skills_are_prompts_loaded_through_skill_load_and_recorded() {
    let door = Door::start("", "");
    let session = door.open(KEY_A);
    let listed = door.rpc(
        Some(KEY_A),
        Some(&session),
        &json!({"jsonrpc": "2.0", "id": 1, "method": "prompts/list"}),
    );
    let names: Vec<&str> = listed.last()["result"]["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|prompt| prompt["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "mcp.reads.summarize",
            "mcp.reads.investigate",
            "mcp.writes.summarize",
            "mcp.writes.investigate"
        ],
        "{listed:?}"
    );
    let got = door.rpc(
        Some(KEY_A),
        Some(&session),
        &json!({"jsonrpc": "2.0", "id": 2, "method": "prompts/get",
                "params": {"name": "mcp.reads.investigate", "arguments": {"topic": "tides"}}}),
    );
    let message = &got.last()["result"]["messages"][0];
    assert_eq!(message["role"], "user", "{got:?}");
    let text = message["content"]["text"].as_str().unwrap();
    assert!(text.contains("Investigate with echo."), "{text}");
    // The load is a recorded call of the session's run, like any other.
    let (_, runs) = door.served.get(&format!(
        "/v1/invocations?session_id={session}&tenant_id={TENANT}"
    ));
    let rows = json_of(&runs)["invocations"].clone();
    assert_eq!(rows[0]["tool_name"], "skill.load", "{rows}");
    assert_eq!(rows[0]["outcome_status"], "succeeded", "{rows}");
    // A prompt the session was not shown is an error, and loads nothing.
    let unknown = door.rpc(
        Some(KEY_A),
        Some(&session),
        &json!({"jsonrpc": "2.0", "id": 3, "method": "prompts/get",
                "params": {"name": "mcp.reads.nothing_like_it"}}),
    );
    assert!(unknown.last().get("error").is_some(), "{unknown:?}");
    let (_, runs) = door.served.get(&format!(
        "/v1/invocations?session_id={session}&tenant_id={TENANT}"
    ));
    assert_eq!(
        json_of(&runs)["invocations"].as_array().map(Vec::len),
        Some(1)
    );
}

#[test]
fn connections_past_the_cap_are_closed_and_streams_keep_alive() {
    let door = Door::start(
        "connections = 4\nkeep_alive_seconds = 1\napproval_hold_seconds = 6\n\
         tenant_in_flight = 2\ncredential_in_flight = 2",
        "",
    );
    let closed = |stream: &mut TcpStream| {
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut buffer = [0u8; 256];
        let read = stream.read(&mut buffer);
        matches!(read, Ok(0))
            || read
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset)
    };
    // Four connections that never send a whole head hold every place: a
    // fifth takes the place of one of them, which is closed, and is served.
    let mut idle: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut stream = TcpStream::connect(("127.0.0.1", door.port)).unwrap();
            stream.write_all(b"POST /mcp HTTP/1.1\r\n").unwrap();
            stream
        })
        .collect();
    let (status, _, _) = door.raw("GET", "/.well-known/oauth-protected-resource", &[], b"");
    assert_eq!(
        status, 200,
        "a newcomer is served in a door full of idle connections"
    );
    assert!(
        closed(&mut idle[0]),
        "the oldest idle connection gave up its place"
    );
    drop(idle);
    // Four connections each serving a request (calls held for approval,
    // two tenants' two each) hold every place: none gives it up, and a
    // fifth is closed at once.
    let held: Vec<_> = [
        (KEY_A, TENANT),
        (KEY_A, TENANT),
        (KEY_B, "tenant-other"),
        (KEY_B, "tenant-other"),
    ]
    .into_iter()
    .enumerate()
    .map(|(id, (key, _))| {
        let session = door.open(key);
        let port = door.port;
        std::thread::spawn(move || {
            Client { port }.rpc(
                Some(key),
                Some(&session),
                &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                            "params": {"name": "demo-external_write",
                                       "arguments": {"line": format!("busy {id}")}}}),
            )
        })
    })
    .collect();
    for tenant in [TENANT, "tenant-other"] {
        door.served.pending_approvals(tenant, 2);
    }
    let mut extra = TcpStream::connect(("127.0.0.1", door.port)).unwrap();
    let _ = extra.write_all(
        b"GET /.well-known/oauth-protected-resource HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    );
    assert!(
        closed(&mut extra),
        "a connection past a door of busy ones is closed"
    );
    for call in held {
        call.join().unwrap();
    }
    let session = door.open(KEY_A);
    // A held call that reports progress keeps its stream alive in between.
    let (_, head, body) = door.raw(
        "POST",
        "/mcp",
        &Client::headers(Some(KEY_A), Some(&session)),
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
               "params": {"name": "demo-external_write", "arguments": {"line": "kept"},
                          "_meta": {"progressToken": 1}}})
        .to_string()
        .as_bytes(),
    );
    assert!(
        header(&head, "content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.lines().any(|line| line.starts_with(':')),
        "keep-alive comments: {text}"
    );
}

/// The front door on a unix socket, reached as a desktop client reaches it:
/// through `toolgate stdio`, its key in a file, one JSON-RPC line at a time.
#[test]
fn the_stdio_relay_reaches_the_front_door_on_its_unix_socket() {
    use std::io::BufRead as _;
    let served = Served::start_edited(
        |root, config| {
            std::fs::write(root.join("relay.key"), format!("{KEY_A}\n")).unwrap();
            let table = front_table(free_port(), "");
            let socket = root.join("front.sock");
            // The socket alone: no TCP listener.
            let table = table.replacen(
                "listen = ",
                &format!("socket = \"{}\"\n# listen = ", socket.display()),
                1,
            );
            format!("{config}\n{table}")
        },
        &[],
    );
    let socket = served.folder.path().join("front.sock");
    let started = Instant::now();
    while !socket.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the front socket never appeared"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the socket's default mode");
    }
    let mut relay = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["stdio", "--url", &format!("unix:{}", socket.display())])
        .arg("--token-file")
        .arg(served.folder.path().join("relay.key"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = relay.stdin.take().unwrap();
    let (lines, received) = std::sync::mpsc::channel::<Value>();
    let output = relay.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(output)
            .lines()
            .map_while(Result::ok)
        {
            if let Ok(message) = serde_json::from_str(&line) {
                let _ = lines.send(message);
            }
        }
    });
    let mut ask = |message: Value| -> Value {
        writeln!(input, "{message}").unwrap();
        input.flush().unwrap();
        if message.get("id").is_none() {
            return Value::Null;
        }
        loop {
            let answer = received
                .recv_timeout(Duration::from_secs(60))
                .expect("the relay answers");
            if answer.get("id") == message.get("id") {
                return answer;
            }
        }
    };
    let initialized = ask(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "desktop", "version": "1"}}}));
    assert_eq!(
        initialized["result"]["serverInfo"]["name"], "toolgate",
        "{initialized}"
    );
    ask(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let listed = ask(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}));
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|tool| tool["name"].as_str())
        .collect();
    assert!(names.contains(&"demo-echo"), "{names:?}");
    let called = ask(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "demo-echo", "arguments": {"text": "over the socket"}}}));
    assert_eq!(called["result"]["isError"], false, "{called}");
    // Recorded before it ran, like any call: in the session's run.
    let recorded = invocation(
        &served,
        called["result"]["_meta"]["toolgate/invocation_id"]
            .as_str()
            .unwrap(),
    );
    assert_eq!(recorded["status"], "succeeded");
    drop(input);
    let status = relay.wait().unwrap();
    assert!(
        status.success(),
        "the relay ends with its input: {status:?}"
    );
}

/// Protocol revision 2026-07-28: no sessions, every request on its own.
pub mod stateless {
    use super::*;

    pub const REVISION: &str = "2026-07-28";

    /// The `_meta` every 2026-07-28 request carries.
    pub fn request_meta(extra: Value) -> Value {
        let mut meta = json!({
            "io.modelcontextprotocol/protocolVersion": REVISION,
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "front-test", "version": "1"},
        });
        if let (Some(meta), Value::Object(extra)) = (meta.as_object_mut(), extra) {
            meta.extend(extra);
        }
        meta
    }

    /// One request as a 2026-07-28 client sends it: its headers from its
    /// body unless `headers` overrides them.
    pub fn send(
        client: &Client,
        key: &str,
        method: &str,
        params: Value,
        headers: &[(&'static str, &str)],
    ) -> Answer {
        let mut params = params;
        if params.get("_meta").is_none() {
            params["_meta"] = request_meta(json!({}));
        }
        let name = params
            .get("name")
            .or_else(|| params.get("taskId"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let message = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let mut sent = vec![
            ("Content-Type", "application/json".to_owned()),
            ("Accept", "application/json, text/event-stream".to_owned()),
            ("Authorization", format!("Bearer {key}")),
            ("MCP-Protocol-Version", REVISION.to_owned()),
            ("Mcp-Method", method.to_owned()),
        ];
        if let Some(name) = name {
            sent.push(("Mcp-Name", name));
        }
        for (header, value) in headers {
            sent.retain(|(name, _)| !name.eq_ignore_ascii_case(header));
            if !value.is_empty() {
                sent.push((header, (*value).to_owned()));
            }
        }
        let (status, head, body) =
            client.raw("POST", "/mcp", &sent, message.to_string().as_bytes());
        Answer {
            status,
            messages: messages_of(&head, &body),
            head,
        }
    }

    fn call(client: &Client, key: &str, line: &str) -> Value {
        let answer = send(
            client,
            key,
            "tools/call",
            json!({"name": "mcp-writes-write", "arguments": {"line": line}}),
            &[],
        );
        assert_eq!(answer.status, 200, "{answer:?}");
        answer.last()["result"].clone()
    }

    /// A credential's stateless session is derived once on a node and
    /// kept; a key reconfigured under the same id (its tools narrowed)
    /// derives its own on its next request, never served the set it was
    /// given before.
    #[test]
    fn a_reconfigured_keys_stateless_requests_see_what_it_now_gives() {
        let port = free_port();
        let key = "tgk_narrowing_0000000000000000000000000000000000000000000000000001";
        let entry = |tools: &str| {
            format!(
                "[[api_keys]]\nid = \"narrowing\"\nsha256 = \"{}\"\ntenant_id = \"{TENANT}\"\nprincipal = {{ id = \"user-1\", scopes = [\"demo.use\"] }}\ntools = {tools}\n",
                toolgate::domain::sha256_hex(key.as_bytes())
            )
        };
        let served = Served::start_edited(
            |root, config| {
                std::fs::write(root.join("keys.toml"), entry("[\"demo.*\"]")).unwrap();
                format!(
                    "{config}\n[front]\nlisten = \"127.0.0.1:{port}\"\napi_keys_file = \"keys.toml\"\n"
                )
            },
            &[],
        );
        let door = Door::wait(served, port);
        let listed = |door: &Door| -> Vec<String> {
            let answer = send(door, key, "tools/list", json!({}), &[]);
            assert_eq!(answer.status, 200, "{answer:?}");
            answer.last()["result"]["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|tool| tool["name"].as_str().unwrap().to_owned())
                .collect()
        };
        let before = listed(&door);
        assert!(
            before.len() > 1 && before.contains(&"demo-echo".to_owned()),
            "{before:?}"
        );
        // Asked again, the same session: derived once, kept.
        assert_eq!(listed(&door), before);
        std::fs::write(
            door.served.folder.path().join("keys.toml"),
            entry("[\"demo.echo\"]"),
        )
        .unwrap();
        reload_keys(&door);
        assert_eq!(listed(&door), ["demo-echo"]);
        let gone = before.iter().find(|name| *name != "demo-echo").unwrap();
        let refused = send(
            &door,
            key,
            "tools/call",
            json!({"name": gone, "arguments": {}}),
            &[],
        );
        let answer = refused.last();
        assert!(
            answer.get("error").is_some() || answer["result"]["isError"] == true,
            "a tool the key no longer gives is not called: {answer}"
        );
    }

    /// The revision's MUSTs at the door, each asked on its own: discovery,
    /// the headers checked against the body, the versions, unknown methods,
    /// `resultType`, a list's cache hints and the server in `_meta`; the
    /// pinned set shared by a credential's requests, no session minted.
    #[test]
    fn a_2026_client_discovers_lists_and_calls_without_a_session() {
        let door = Door::start("", "");
        let discovered = send(&door, KEY_A, "server/discover", json!({}), &[]);
        assert_eq!(discovered.status, 200, "{discovered:?}");
        let result = &discovered.last()["result"];
        assert!(
            result["supportedVersions"]
                .as_array()
                .unwrap()
                .contains(&json!(REVISION)),
            "{result}"
        );
        assert_eq!(result["resultType"], "complete", "{result}");
        assert_eq!(
            result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
            "toolgate"
        );
        let listed = send(&door, KEY_A, "tools/list", json!({}), &[]);
        assert_eq!(listed.status, 200, "{listed:?}");
        assert!(
            listed.session().is_none(),
            "no session is minted: {listed:?}"
        );
        let result = &listed.last()["result"];
        assert_eq!(result["resultType"], "complete", "{result}");
        assert_eq!(result["cacheScope"], "private", "{result}");
        assert!(result["ttlMs"].as_u64().is_some(), "{result}");
        assert_eq!(
            result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
            "toolgate"
        );
        let names: Vec<&str> = result["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|tool| tool["name"].as_str().unwrap())
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted, "a deterministic order");
        assert!(names.contains(&"mcp-writes-write"), "{names:?}");
        let hash = result["_meta"]["toolgate/tool_schema_sha256"]
            .as_str()
            .unwrap()
            .to_owned();
        let again = send(&door, KEY_A, "tools/list", json!({}), &[]);
        assert_eq!(
            again.last()["result"]["_meta"]["toolgate/tool_schema_sha256"],
            hash,
            "one pinned set per credential"
        );

        // Calls: each its own, answered whole, with resultType; the same
        // request id from two clients of a credential is two calls.
        let first = call(&door, KEY_A, "one");
        assert_eq!(first["isError"], false, "{first}");
        assert_eq!(first["resultType"], "complete", "{first}");
        let second = call(&door, KEY_A, "one");
        assert_ne!(
            first["_meta"]["toolgate/invocation_id"],
            second["_meta"]["toolgate/invocation_id"]
        );
        assert_eq!(
            door.writes(),
            2,
            "delivered answers: two calls, two effects"
        );
        // Identical calls in quick succession are a loop: the fifth is
        // refused (spread over the breaker's periods they would not be).
        let echoes: Vec<Value> = (0..5)
            .map(|_| {
                send(
                    &door,
                    KEY_A,
                    "tools/call",
                    json!({"name": "demo-echo", "arguments": {"text": "again"}}),
                    &[],
                )
                .last()["result"]
                    .clone()
            })
            .collect();
        assert_eq!(echoes[3]["isError"], false, "{echoes:?}");
        assert_eq!(
            echoes[4]["structuredContent"]["reason_code"], "tool.loop_detected",
            "{echoes:?}"
        );
        assert_eq!(
            echoes[0]["_meta"]["toolgate/run_id"], echoes[4]["_meta"]["toolgate/run_id"],
            "one period, one run"
        );
        // A list's hash named by a call that no longer matches is refused.
        let stale = send(
            &door,
            KEY_A,
            "tools/call",
            json!({"name": "mcp-writes-write", "arguments": {"line": "x"},
                   "_meta": request_meta(json!({"toolgate/tool_schema_sha256": "0".repeat(64)}))}),
            &[],
        );
        assert_eq!(stale.last()["error"]["code"], -32602, "{stale:?}");
        assert_eq!(door.writes(), 2);

        // The headers against the body.
        let mismatch = send(
            &door,
            KEY_A,
            "tools/list",
            json!({}),
            &[("Mcp-Method", "tools/call")],
        );
        assert_eq!(mismatch.status, 400, "{mismatch:?}");
        assert_eq!(mismatch.last()["error"]["code"], -32020, "{mismatch:?}");
        let wrong_name = send(
            &door,
            KEY_A,
            "tools/call",
            json!({"name": "mcp-writes-write", "arguments": {"line": "y"}}),
            &[("Mcp-Name", "demo-echo")],
        );
        assert_eq!(wrong_name.status, 400, "{wrong_name:?}");
        assert_eq!(wrong_name.last()["error"]["code"], -32020);
        let missing_name = send(
            &door,
            KEY_A,
            "tools/call",
            json!({"name": "mcp-writes-write", "arguments": {"line": "y"}}),
            &[("Mcp-Name", "")],
        );
        assert_eq!(missing_name.status, 400, "{missing_name:?}");
        assert_eq!(door.writes(), 2, "refused requests run nothing");
        // The base64 sentinel form of the same name is that name.
        let encoded = send(
            &door,
            KEY_A,
            "tools/call",
            json!({"name": "demo-echo", "arguments": {"text": "sentinel"}}),
            &[("Mcp-Name", "=?base64?ZGVtby1lY2hv?=")],
        );
        assert_eq!(encoded.status, 200, "{encoded:?}");
        assert_eq!(encoded.last()["result"]["isError"], false, "{encoded:?}");
        let version = send(
            &door,
            KEY_A,
            "tools/list",
            json!({"_meta": request_meta(json!({"io.modelcontextprotocol/protocolVersion": "2025-11-25"}))}),
            &[],
        );
        assert_eq!(version.status, 400, "{version:?}");
        assert_eq!(version.last()["error"]["code"], -32020, "{version:?}");
        let unsupported = send(
            &door,
            KEY_A,
            "tools/list",
            json!({"_meta": request_meta(json!({"io.modelcontextprotocol/protocolVersion": "2099-01-01"}))}),
            &[("MCP-Protocol-Version", "2099-01-01")],
        );
        assert_eq!(unsupported.status, 400, "{unsupported:?}");
        let error = &unsupported.last()["error"];
        assert_eq!(error["code"], -32022, "{unsupported:?}");
        assert!(
            error["data"]["supported"]
                .as_array()
                .unwrap()
                .contains(&json!(REVISION)),
            "{error}"
        );
        let unknown = send(&door, KEY_A, "tools/frobnicate", json!({}), &[]);
        assert_eq!(unknown.status, 404, "{unknown:?}");
        assert_eq!(unknown.last()["error"]["code"], -32601);
        // Without the revision's `_meta`, a request is refused.
        let bare = send(&door, KEY_A, "tools/list", json!({"_meta": {}}), &[]);
        assert_eq!(bare.status, 400, "{bare:?}");
        // No stream to open and no session to end.
        for method in ["GET", "DELETE"] {
            let (status, _, _) = door.raw(
                method,
                "/mcp",
                &[
                    ("Authorization", format!("Bearer {KEY_A}")),
                    ("MCP-Protocol-Version", REVISION.to_owned()),
                ],
                b"",
            );
            assert_eq!(status, 405, "{method}");
        }
        // Authenticated on its own every time.
        let anonymous = send(&door, "tgk_not_a_key", "tools/list", json!({}), &[]);
        assert_eq!(anonymous.status, 401);
        // A session of the 2025 era still opens and works beside it.
        let session = door.open(KEY_A);
        assert!(!door.list(KEY_A, &session).is_empty());
    }

    /// The re-issue rule without sessions: a call's stream breaks after
    /// its effect, and the same call asked with a new request id is that
    /// call; another principal's identical call is its own.
    #[test]
    fn a_2026_call_whose_stream_broke_is_the_same_call_asked_again() {
        let door = Door::slow_answers("");
        send_then_break(&door, None, KEY_A, &write_call(41, "modern"), 1);
        let again = call(&door, KEY_A, "modern");
        assert_eq!(door.writes(), 1, "the re-issue ran it again: {again}");
        assert_eq!(again["_meta"]["toolgate/reissue"], "same_call", "{again}");
        let theirs = call(&door, KEY_B, "modern");
        assert_eq!(theirs["isError"], false, "{theirs}");
        assert_eq!(door.writes(), 2);
        let new = call(&door, KEY_A, "modern");
        assert_eq!(new["isError"], false, "{new}");
        assert_eq!(door.writes(), 3, "delivered: a new call");
    }

    /// A 2026-07-28 request's `traceparent` and `tracestate` in `_meta`
    /// continue the caller's trace: the call's span is the caller's span's
    /// child, and `tool.execute` hangs under it.
    #[test]
    fn a_2026_calls_trace_continues_from_its_meta() {
        let (address, bodies) = crate::operations::collector();
        let port = free_port();
        let served = Served::start_edited(
            |_, config| {
                format!(
                    "{config}\n{}\n[telemetry]\notlp_endpoint = \"http://{address}/v1/traces\"\nservice_name = \"toolgate-test\"\n",
                    front_table(port, "")
                )
            },
            &[],
        );
        let mut door = Door::wait(served, port);
        let (trace_id, parent_id) = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331");
        let marker = "ARGUMENT-MARKER-2026";
        let answer = send(
            &door,
            KEY_A,
            "tools/call",
            json!({"name": "demo-echo", "arguments": {"text": marker},
                   "_meta": request_meta(json!({
                       "traceparent": format!("00-{trace_id}-{parent_id}-01"),
                       "tracestate": "vendor=opaque"}))}),
            &[],
        );
        assert_eq!(answer.last()["result"]["isError"], false, "{answer:?}");
        assert!(door.served.stop(), "the drain exports what is buffered");
        let spans = crate::operations::exported_spans(&bodies, marker);
        let call = spans
            .iter()
            .find(|span| span["name"] == "front.call")
            .unwrap_or_else(|| panic!("no front.call span: {spans:?}"));
        assert_eq!(
            call["traceId"].as_str().unwrap().to_lowercase(),
            trace_id,
            "{call}"
        );
        assert_eq!(
            call["parentSpanId"].as_str().unwrap().to_lowercase(),
            parent_id
        );
        assert_eq!(call["traceState"], "vendor=opaque", "{call}");
        let execute = spans
            .iter()
            .find(|span| span["name"] == "tool.execute")
            .unwrap_or_else(|| panic!("no tool.execute span: {spans:?}"));
        assert_eq!(execute["traceId"], call["traceId"]);
    }

    /// A client that declares the tasks extension is given a held call as a
    /// task: the row is the task, `tasks/get` polls it (any node, its own
    /// principal only) and, once approved, it completes with the call's
    /// outcome, run once.
    #[test]
    fn a_held_call_is_a_task_to_a_client_of_the_tasks_extension() {
        let door = Door::start("", "");
        let tasks_meta = request_meta(json!({
            "io.modelcontextprotocol/clientCapabilities":
                {"extensions": {"io.modelcontextprotocol/tasks": {}}}}));
        let discovered = send(&door, KEY_A, "server/discover", json!({}), &[]);
        assert!(
            discovered.last()["result"]["capabilities"]["extensions"]
                .get("io.modelcontextprotocol/tasks")
                .is_some(),
            "{discovered:?}"
        );
        let created = send(
            &door,
            KEY_A,
            "tools/call",
            json!({"name": "demo-external_write", "arguments": {"line": "task"},
                   "_meta": tasks_meta.clone()}),
            &[],
        );
        let task = &created.last()["result"];
        assert_eq!(task["resultType"], "task", "{created:?}");
        assert_eq!(task["status"], "working", "{task}");
        let task_id = task["taskId"].as_str().unwrap().to_owned();
        // The task is the recorded row, waiting.
        assert_eq!(
            invocation(&door.served, &task_id)["status"],
            "waiting_for_approval"
        );
        let get = |key: &str| {
            send(
                &door,
                key,
                "tasks/get",
                json!({"taskId": task_id, "_meta": tasks_meta.clone()}),
                &[],
            )
        };
        let polled = get(KEY_A);
        assert_eq!(polled.last()["result"]["status"], "working", "{polled:?}");
        // Another principal, another tenant: no such task.
        for other in [KEY_A2, KEY_B] {
            let refused = get(other);
            assert!(
                refused.last().get("error").is_some(),
                "{other}: {refused:?}"
            );
        }
        let (_, approvals) = door
            .served
            .get(&format!("/v1/approvals?status=pending&tenant_id={TENANT}"));
        let approval = json_of(&approvals)["approvals"][0]["approval_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let (status, _) = door.served.post(
            &format!("/v1/approvals/{approval}?tenant_id={TENANT}"),
            &json!({"decision": "approve", "approver": "ops"}),
        );
        assert_eq!(status, 200);
        let done = get(KEY_A);
        let result = &done.last()["result"];
        assert_eq!(result["status"], "completed", "{done:?}");
        assert_eq!(result["result"]["isError"], false, "{result}");
        assert_eq!(
            result["result"]["_meta"]["toolgate/invocation_id"], task_id,
            "{result}"
        );
        let again = get(KEY_A);
        assert_eq!(again.last()["result"]["status"], "completed");
        assert_eq!(door.served.external_writes(), 1, "run once");
        // Without the extension, the same kind of call is held, then pending.
        let held = send(
            &door,
            KEY_A,
            "tools/call",
            json!({"name": "demo-external_write", "arguments": {"line": "held"}}),
            &[],
        );
        assert_eq!(
            held.last()["result"]["structuredContent"]["status"],
            "pending",
            "{held:?}"
        );
    }

    /// A credential's pinned set holds across its stateless requests; when
    /// its tools are no longer offered as pinned (a server's catalog changed
    /// and a node pins again, here after a restart), the credential moves
    /// to a new set with a new hash, and a call naming the hash it listed
    /// before is refused rather than run against the changed set.
    #[test]
    fn a_credentials_pinned_set_changes_only_with_a_new_hash_its_clients_are_told() {
        let mut door = Door::start("", "");
        let listed = |door: &Door| {
            let answer = send(door, KEY_A, "tools/list", json!({}), &[]);
            let result = answer.last()["result"].clone();
            let names: Vec<String> = result["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|tool| tool["name"].as_str().unwrap().to_owned())
                .collect();
            let hash = result["_meta"]["toolgate/tool_schema_sha256"]
                .as_str()
                .unwrap()
                .to_owned();
            (names, hash)
        };
        let (before, old_hash) = listed(&door);
        assert!(before.contains(&"mcp-reads-echo".to_owned()), "{before:?}");
        let changed = send(
            &door,
            KEY_A,
            "tools/call",
            json!({"name": "mcp-reads-change", "arguments": {}}),
            &[],
        );
        assert_eq!(changed.last()["result"]["isError"], false, "{changed:?}");
        assert_eq!(listed(&door).1, old_hash, "not applied under the client");
        door.served.restart();
        let (after, new_hash) = listed(&door);
        assert_ne!(new_hash, old_hash, "{after:?}");
        assert!(!after.contains(&"mcp-reads-echo".to_owned()), "{after:?}");
        let named = |hash: &str| {
            send(
                &door,
                KEY_A,
                "tools/call",
                json!({"name": "demo-echo", "arguments": {"text": "hash"},
                       "_meta": request_meta(json!({"toolgate/tool_schema_sha256": hash}))}),
                &[],
            )
        };
        let stale = named(&old_hash);
        assert_eq!(stale.last()["error"]["code"], -32602, "{stale:?}");
        let current = named(&new_hash);
        assert_eq!(current.last()["result"]["isError"], false, "{current:?}");
    }
}

/// A run named in `_meta` is its opener's: another key of the same tenant
/// (another principal) naming it is refused `policy.run.not_owned` and
/// records nothing in it; its own runs are its own.
#[test]
fn a_run_named_by_another_principal_is_refused_and_untouched() {
    let door = Door::start("", "");
    let (mine, theirs) = (door.open(KEY_A), door.open(KEY_A2));
    let run = Uuid::new_v4();
    let meta = |call: &str| {
        Some(json!({"toolgate/run_id": run, "toolgate/step": 1, "toolgate/call_id": call}))
    };
    let first = door.call(
        KEY_A,
        &mine,
        json!(1),
        "demo.echo",
        json!({"text": "a"}),
        meta("c1"),
    );
    assert_eq!(first["isError"], false, "{first}");
    let refused = door.call(
        KEY_A2,
        &theirs,
        json!(1),
        "demo.echo",
        json!({"text": "a"}),
        meta("c2"),
    );
    assert_eq!(refused["isError"], true, "{refused}");
    assert_eq!(
        refused["structuredContent"]["reason_code"], "policy.run.not_owned",
        "{refused}"
    );
    assert!(
        refused["_meta"].get("toolgate/invocation_id").is_none(),
        "nothing recorded: {refused}"
    );
    // Even the owner's own call id, named by another, reads nothing.
    let replayed = door.call(
        KEY_A2,
        &theirs,
        json!(2),
        "demo.echo",
        json!({"text": "a"}),
        meta("c1"),
    );
    assert_eq!(
        replayed["structuredContent"]["reason_code"], "policy.run.not_owned",
        "{replayed}"
    );
    let rows = door.served.run_invocations(run);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["principal"]["id"], "user-1");
    // A key that declares no trust gives its calls the most restrictive
    // reading: an MCP client's context is not known to be its user's.
    assert_eq!(rows[0]["origin_trust"], "external_untrusted");
}

/// A rate limit per principal holds on the front door: past the burst a
/// call is a JSON-RPC error `-32029` whose data says when to retry and
/// carries the six-field outcome, with nothing recorded; another principal
/// of the same tenant is not held back by it. (A bucket's refill is the
/// domain's unit test; one token per ten seconds keeps this one from racing
/// a loaded machine.)
#[test]
fn a_rate_limited_call_on_the_front_door_says_when_to_retry() {
    let door = Door::start(
        "",
        "[limits.rate]\nprincipal = { per_second = 0.1, burst = 2 }\n",
    );
    let (mine, theirs) = (door.open(KEY_A), door.open(KEY_A2));
    let run = Uuid::new_v4();
    let call = |key: &str, session: &str, id: i64| {
        door.call(
            key,
            session,
            json!(id),
            "demo.echo",
            json!({"text": format!("t{id}")}),
            Some(
                json!({"toolgate/run_id": if key == KEY_A { run } else { Uuid::new_v4() },
                        "toolgate/step": id, "toolgate/call_id": format!("c{id}")}),
            ),
        )
    };
    for id in 1..=2 {
        let served = call(KEY_A, &mine, id);
        assert_eq!(served["isError"], false, "{served}");
    }
    let limited = call(KEY_A, &mine, 3);
    assert_eq!(limited["code"], -32029, "{limited}");
    let retry = limited["data"]["retryAfterSeconds"].as_u64().unwrap_or(0);
    assert!((1..=10).contains(&retry), "{limited}");
    assert_eq!(
        limited["data"]["outcome"]["reason_code"],
        "tool.rate_limited"
    );
    assert_eq!(
        limited["data"]["outcome"]["action"], "demo.echo",
        "the registry name"
    );
    assert_eq!(limited["data"]["outcome"]["retryable"], true);
    // Another principal's bucket is its own.
    let other = call(KEY_A2, &theirs, 4);
    assert_eq!(other["isError"], false, "{other}");
    assert_eq!(
        door.served.run_invocations(run).len(),
        2,
        "nothing recorded"
    );
}

/// No caller takes the door: one key holding calls in flight (held for
/// approval, which costs it nothing) is stopped at its credential's share,
/// and the door's connections held idle or half-sent by anyone are given up
/// to newcomers, so another tenant's client is served throughout.
#[test]
fn one_key_and_idle_connections_cannot_take_the_door_from_another_tenant() {
    let door = Door::start(
        "approval_hold_seconds = 60\nsession_in_flight = 2\ncredential_in_flight = 2\n\
         tenant_in_flight = 4\nconnections = 8",
        "",
    );
    let hostile = door.open(KEY_A);
    // Two held calls fill the key's share; they stay held while the test
    // runs (their answers are never read).
    let held: Vec<_> = (0..2)
        .map(|id| {
            let (port, session) = (door.port, hostile.clone());
            std::thread::spawn(move || {
                Client { port }.rpc(
                    Some(KEY_A),
                    Some(&session),
                    &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                            "params": {"name": "demo-external_write",
                                       "arguments": {"line": format!("held {id}")}}}),
                )
            })
        })
        .collect();
    let approvals = door.served.pending_approvals(TENANT, 2);
    // A third call of the key, in another session too, is refused at once.
    let another = door.open(KEY_A);
    for session in [&hostile, &another] {
        let refused = door.call(
            KEY_A,
            session,
            json!(9),
            "demo-echo",
            json!({"text": "x"}),
            None,
        );
        assert_eq!(refused["code"], -32004, "{refused}");
        assert!(
            refused["message"]
                .as_str()
                .unwrap_or_default()
                .contains("credential"),
            "{refused}"
        );
    }
    // The door's eight places, taken by connections that send half a head
    // and stop: each newcomer makes one of them give its place up.
    let idle: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut stream = TcpStream::connect(("127.0.0.1", door.port)).unwrap();
            stream
                .write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                .unwrap();
            stream
        })
        .collect();
    let other = door.open(KEY_B);
    for id in 0..3 {
        let served = door.call(
            KEY_B,
            &other,
            json!(id),
            "demo-echo",
            json!({"text": "mine"}),
            None,
        );
        assert_eq!(served["isError"], false, "{served}");
    }
    drop(idle);
    // Denied, the held calls end and the door drains at once.
    for approval in &approvals {
        let id = approval["approval_id"].as_str().unwrap();
        let (status, body) = door.served.post(
            &format!("/v1/approvals/{id}?tenant_id={TENANT}"),
            &json!({"decision": "deny", "approver": "test"}),
        );
        assert_eq!(status, 200, "{body}");
    }
    for call in held {
        call.join().unwrap();
    }
}

/// A flood of refused requests and of clients hanging up mid-call costs a
/// few log lines, not one per request: each line of the code writes at most
/// ten a minute, and the door goes on serving.
#[test]
fn a_flood_of_refusals_and_hang_ups_is_logged_at_a_bounded_rate() {
    let door = Door::start_in_a_process("", "");
    let session = door.open(KEY_A);
    let lines = |message: &str| {
        door.served
            .logs
            .lock()
            .unwrap()
            .lines()
            .filter(|line| line.contains(message))
            .count()
    };
    for id in 0..30 {
        let unknown = door.rpc(
            Some(KEY_A),
            Some(&session),
            &json!({"jsonrpc": "2.0", "id": id, "method": "nope/nope"}),
        );
        assert_eq!(unknown.status, 200, "{unknown:?}");
        // An answer's length is told (the body a connection counts as its
        // request in progress keeps the size it wraps).
        assert!(
            header(&unknown.head, "content-length").is_some(),
            "{unknown:?}"
        );
        // A client that sends a call and hangs up.
        let mut stream = TcpStream::connect(("127.0.0.1", door.port)).unwrap();
        let body = json!({"jsonrpc": "2.0", "id": 100 + id, "method": "tools/call",
                          "params": {"name": "demo-echo", "arguments": {"text": "x"}}})
        .to_string();
        let _ = stream.write_all(
            format!(
                "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {KEY_A}\r\n\
                 Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-06-18\r\n\
                 Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                door.port,
                body.len()
            )
            .as_bytes(),
        );
        drop(stream);
    }
    // The first ten of each kind reach the log (they are written as they
    // come); the door still serves.
    let started = Instant::now();
    while lines("response error") < 10 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the refusals were not logged at all"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let served = door.call(
        KEY_A,
        &session,
        json!("after"),
        "demo-echo",
        json!({"text": "up"}),
        None,
    );
    assert_eq!(served["isError"], false, "{served}");
    for message in ["response error", "failed to send pending response"] {
        assert!(lines(message) <= 10, "{message}: {}", lines(message));
    }
}

/// An unauthenticated peer holds a place a short time only: a connection
/// with no whole request head within `front.first_request_seconds` is
/// closed (long before the header deadline), while a connection that has
/// been served stays kept alive past it.
#[test]
fn a_connection_without_a_first_request_is_closed_soon() {
    let door = Door::start("first_request_seconds = 1", "");
    let started = Instant::now();
    let mut silent = TcpStream::connect(("127.0.0.1", door.port)).unwrap();
    silent.write_all(b"POST /mcp HTTP/1.1\r\n").unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(8)))
        .unwrap();
    let mut buffer = [0u8; 64];
    let read = silent.read(&mut buffer);
    assert!(
        matches!(read, Ok(0))
            || read
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "{read:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "closed before the header deadline (10 s)"
    );
    // A served connection is kept alive past the first-request deadline.
    let mut kept = TcpStream::connect(("127.0.0.1", door.port)).unwrap();
    kept.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let probe = format!(
        "GET /.well-known/oauth-protected-resource HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n",
        door.port
    );
    for _ in 0..2 {
        kept.write_all(probe.as_bytes()).unwrap();
        let read = kept.read(&mut buffer).unwrap();
        assert!(
            buffer[..read].starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&buffer[..read])
        );
        // Past the first-request deadline, and within the idle one.
        std::thread::sleep(Duration::from_millis(1500));
        let mut rest = vec![0u8; 4096];
        kept.set_nonblocking(true).unwrap();
        let _ = kept.read(&mut rest);
        kept.set_nonblocking(false).unwrap();
    }
}

/// `resources/read` at its edges: the link a result carried reads the
/// whole artifact, its length stated; another tenant's key, a link
/// toolgate did not write, or no link at all read nothing; a file cut
/// short on disk is an answer cut short, never one that parses; the door
/// stays up.
#[test]
fn resources_read_gives_only_the_callers_artifact_and_never_a_cut_one_whole() {
    let door = Door::start("", &media_server());
    let session = door.open(KEY_A);
    let result = door.call(
        KEY_A,
        &session,
        json!(1),
        "mcp-media-huge",
        json!({"bytes": 100_000}),
        None,
    );
    let link = result["content"]
        .as_array()
        .and_then(|blocks| blocks.iter().find(|block| block["type"] == "resource_link"))
        .and_then(|block| block["uri"].as_str())
        .unwrap_or_else(|| panic!("no link: {result}"))
        .to_owned();
    let read = |key: &str, session: Option<&str>, params: Value| {
        door.rpc(
            Some(key),
            session,
            &json!({"jsonrpc": "2.0", "id": 7, "method": "resources/read", "params": params}),
        )
    };
    let code = |answer: &Answer| answer.last()["error"]["code"].clone();

    // The whole: two chunks of 64 KiB, base64 in one blob.
    let whole = read(KEY_A, Some(&session), json!({"uri": link}));
    assert_eq!(whole.status, 200, "{whole:?}");
    let contents = &whole.last()["result"]["contents"][0];
    assert_eq!(contents["uri"], link.as_str());
    assert_eq!(contents["mimeType"], "text/plain; charset=utf-8");
    let blob = contents["blob"].as_str().unwrap();
    assert_eq!(blob.len(), 131_072_usize.div_ceil(3) * 4);
    assert!(blob.starts_with("eHh4"), "base64 of the server's x's");
    assert!(
        header(&whole.head, "content-length").is_some(),
        "{}",
        whole.head
    );

    // Not the caller's, not a link, no link: nothing read.
    let other = door.open(KEY_B);
    assert_eq!(
        code(&read(KEY_B, Some(&other), json!({"uri": link}))),
        -32002
    );
    let (run, artifact) = link
        .strip_prefix("toolgate://runs/")
        .and_then(|rest| rest.split_once("/artifacts/"))
        .unwrap();
    for forged in [
        format!("toolgate://runs/{}/artifacts/{artifact}", Uuid::new_v4()),
        format!("toolgate://runs/{run}/artifacts/{}", Uuid::new_v4()),
        format!("toolgate://runs/{run}/../artifacts/{artifact}"),
        format!(
            "toolgate://runs/{run}/artifacts/{}",
            artifact.to_uppercase()
        ),
        format!("file:///{artifact}"),
        "x".repeat(10_000),
    ] {
        assert_eq!(
            code(&read(KEY_A, Some(&session), json!({"uri": forged}))),
            -32002,
            "{forged}"
        );
    }
    for params in [json!({}), json!({"uri": 7}), json!(null)] {
        assert_eq!(
            code(&read(KEY_A, Some(&session), params.clone())),
            -32602,
            "{params}"
        );
    }
    // After initialize, a request needs its session.
    assert_eq!(read(KEY_A, None, json!({"uri": link})).status, 400);

    // The file cut short under the door: the answer is cut short too
    // (its head and part of its body, or, when the connection is closed
    // before the head is flushed, nothing at all); never whole.
    let file = door
        .served
        .folder
        .path()
        .join("state/artifacts")
        .join(TENANT)
        .join(run)
        .join(format!("{artifact}.bin"));
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..1000]).unwrap();
    let body =
        json!({"jsonrpc": "2.0", "id": 8, "method": "resources/read", "params": {"uri": link}})
            .to_string();
    let mut stream = TcpStream::connect(("127.0.0.1", door.port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut request = format!(
        "POST /mcp HTTP/1.1\r\nConnection: close\r\nHost: 127.0.0.1:{}\r\n",
        door.port
    );
    for (name, value) in Client::headers(Some(KEY_A), Some(&session)) {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    if let Some(split) = response.windows(4).position(|window| window == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&response[..split]).into_owned();
        let answer = &response[split + 4..];
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let stated: usize = header(&head, "content-length").unwrap().parse().unwrap();
        assert!(answer.len() < stated, "{} of {stated}", answer.len());
        assert!(serde_json::from_slice::<Value>(answer).is_err());
    }
    assert_eq!(door.served.get("/healthz").0, 200);
}
