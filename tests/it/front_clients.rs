//! MCP clients people use, against the front door: the official Python SDK
//! (`mcp`, also through the `toolgate stdio` relay), the official
//! TypeScript SDK (`@modelcontextprotocol/sdk`), and two agent frameworks'
//! MCP adapters (the OpenAI Agents SDK's, LangChain's) loading the tools as
//! an application does. `scripts/test` installs them; a test whose client
//! is missing fails, it never passes by skipping.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::front::{Door, KEY_A};
use crate::serve::{TENANT, json_of};

fn installed() -> PathBuf {
    PathBuf::from(
        std::env::var("TOOLGATE_MCP_SERVERS")
            .unwrap_or_else(|_| "/var/tmp/toolgate-mcp-servers".into()),
    )
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(name)
}

/// Runs a client program and parses the JSON report it prints.
pub fn report(mut command: Command) -> Value {
    let output = command
        .output()
        .unwrap_or_else(|error| panic!("{command:?}: {error}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{command:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|_| panic!("no report: {stdout}"))
}

pub fn python(venv: &str) -> PathBuf {
    let python = installed().join(venv).join("bin/python");
    assert!(
        python.exists(),
        "{} is missing: run the tests with scripts/test",
        python.display()
    );
    python
}

fn url(door: &Door) -> String {
    format!("http://127.0.0.1:{}/mcp", door.port)
}

fn approve_pending(door: &Door) {
    let (_, body) = door
        .served
        .get(&format!("/v1/approvals?status=pending&tenant_id={TENANT}"));
    let pending = json_of(&body);
    let approvals = pending["approvals"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        approvals.len(),
        1,
        "one approval, however often the call was asked: {pending}"
    );
    let id = approvals[0]["approval_id"].as_str().unwrap();
    let (status, _) = door.served.post(
        &format!("/v1/approvals/{id}?tenant_id={TENANT}"),
        &json!({"decision": "approve", "approver": "ops"}),
    );
    assert_eq!(status, 200);
}

/// What every client must see on its first run: the tools, a success, a
/// denial, an uncertain outcome, a pending approval with progress, a write.
fn judge_first(door: &Door, first: &Value) {
    let tools = first["tools"].as_array().unwrap();
    for name in ["demo-echo", "mcp-reads-echo", "mcp-writes-write"] {
        assert!(tools.contains(&json!(name)), "{name}: {first}");
    }
    assert_eq!(
        first["annotations"]["demo-echo"]["readOnlyHint"], true,
        "{first}"
    );
    assert_eq!(first["echo"]["is_error"], false, "{first}");
    assert!(
        first["echo"]["text"]
            .as_str()
            .unwrap()
            .contains("EXTERNAL_UNTRUSTED"),
        "{first}"
    );
    assert_eq!(first["denied"]["is_error"], true);
    assert_eq!(
        first["denied"]["structured"]["reason_code"], "policy.rule.denied",
        "{first}"
    );
    assert_eq!(
        first["uncertain"]["structured"]["status"], "uncertain",
        "{first}"
    );
    assert!(
        first["uncertain"]["text"]
            .as_str()
            .unwrap()
            .contains("Do not repeat"),
        "{first}"
    );
    assert_eq!(
        first["pending"]["structured"]["status"], "pending",
        "{first}"
    );
    assert!(
        !first["progress"].as_array().unwrap().is_empty(),
        "progress while held: {first}"
    );
    assert_eq!(first["write"]["is_error"], false, "{first}");
    assert_eq!(door.writes(), 2, "the uncertain write and the write");
    assert_eq!(door.served.external_writes(), 0);
}

fn judge_second(door: &Door, first: &Value, second: &Value) {
    assert_eq!(
        second["write_again"]["invocation_id"], first["write"]["invocation_id"],
        "{second}"
    );
    assert_eq!(second["resumed"]["is_error"], false, "{second}");
    assert_eq!(
        second["resumed"]["invocation_id"], first["pending"]["structured"]["invocation_id"],
        "{second}"
    );
    assert_eq!(
        second["resumed_again"]["invocation_id"],
        second["resumed"]["invocation_id"]
    );
    assert_eq!(
        door.writes(),
        2,
        "a reconnected client's write is not repeated"
    );
    assert_eq!(
        door.served.external_writes(),
        1,
        "the approved call ran once"
    );
}

/// The Python SDK in `era` (its mode): the first and second runs judged
/// as every client's, and the relay.
fn python_sdk(era: &str) {
    let door = Door::start("", "");
    let python = python("clients");
    let run = Uuid::new_v4().to_string();
    let key_file = door.served.folder.path().join("front.key");
    std::fs::write(&key_file, KEY_A).unwrap();
    let phase = |phase: &str| {
        let mut command = Command::new(&python);
        command
            .arg(script("front_python.py"))
            .args([phase, &url(&door)])
            .env("TOOLGATE_FRONT_KEY", KEY_A)
            .env("TOOLGATE_RUN_ID", &run)
            .env("TOOLGATE_ERA", era)
            .env("TOOLGATE_BIN", env!("CARGO_BIN_EXE_toolgate"))
            .env("TOOLGATE_KEY_FILE", &key_file);
        report(command)
    };
    let first = phase("first");
    assert_eq!(
        first["protocol_version"],
        if era == "legacy" { "2025-11-25" } else { era },
        "{first}"
    );
    judge_first(&door, &first);
    approve_pending(&door);
    let second = phase("second");
    judge_second(&door, &first, &second);
    assert!(second["relay_tools"].as_u64().unwrap() >= 3, "{second}");
    assert_eq!(second["relay_echo"]["is_error"], false, "{second}");
    assert!(
        second["relay_echo"]["text"]
            .as_str()
            .unwrap()
            .contains("through the relay")
    );
}

/// The Python SDK reading what toolgate kept of its results: a text too
/// large to carry and an image too large to inline, through their links;
/// a small image inline. Another principal's client reads nothing.
fn python_sdk_reads_artifacts(era: &str) {
    let door = Door::start("", &crate::front::media_server());
    let mut command = Command::new(python("clients"));
    command
        .arg(script("front_python.py"))
        .args(["artifacts", &url(&door)])
        .env("TOOLGATE_FRONT_KEY", KEY_A)
        .env("TOOLGATE_OTHER_KEY", crate::front::KEY_A2)
        .env("TOOLGATE_RUN_ID", Uuid::new_v4().to_string())
        .env("TOOLGATE_ERA", era);
    let report = report(command);
    // The excerpt's head, its marker and its tail, and the link that reads
    // the whole (the server sends whole chunks: 4 × 64 KiB).
    assert_eq!(
        report["huge_types"],
        json!(["text", "text", "text", "resource_link"]),
        "{report}"
    );
    let whole = 262_144;
    assert_eq!(
        report["huge_link"]["mimeType"], "text/plain; charset=utf-8",
        "{report}"
    );
    assert_eq!(report["huge_link"]["size"], whole, "{report}");
    assert!(
        report["huge_link"]["uri"]
            .as_str()
            .unwrap()
            .starts_with("toolgate://runs/"),
        "{report}"
    );
    assert_eq!(report["huge_read"]["error"], Value::Null, "{report}");
    assert_eq!(report["huge_read"]["length"], whole, "{report}");
    assert_eq!(report["huge_read"]["distinct"], json!(["x"]), "{report}");
    assert_eq!(
        report["huge_read"]["mime_type"], "text/plain; charset=utf-8",
        "{report}"
    );
    assert_eq!(
        report["small_image"],
        json!([{"type": "image", "mimeType": "image/png", "length": 300}]),
        "{report}"
    );
    assert_eq!(
        report["large_image"][0]["type"], "resource_link",
        "{report}"
    );
    assert_eq!(
        report["large_image"][0]["mimeType"], "image/png",
        "{report}"
    );
    // base64 of 100,000 bytes, as the server rounds it: 100,002.
    assert_eq!(report["large_image"][0]["size"], 100_002, "{report}");
    assert_eq!(
        report["large_read"],
        json!({"length": 100_002, "mime_type": "image/png", "error": null}),
        "{report}"
    );
    assert_eq!(report["listed"], 0, "{report}");
    for refused in ["forged", "other"] {
        assert!(
            report[refused]
                .as_str()
                .is_some_and(|error| error.contains("Resource not found")),
            "{refused}: {report}"
        );
    }
}

#[test]
fn the_python_sdk_reads_a_large_result_and_images_through_the_front_door() {
    python_sdk_reads_artifacts("legacy");
}

#[test]
fn the_python_sdk_without_sessions_reads_a_large_result_and_images() {
    python_sdk_reads_artifacts("2026-07-28");
}

#[test]
fn the_python_sdk_lists_calls_waits_for_approval_and_reconnects() {
    python_sdk("legacy");
}

#[test]
fn the_python_sdk_without_sessions_lists_calls_waits_for_approval_and_asks_again() {
    python_sdk("2026-07-28");
}

#[test]
fn the_typescript_sdk_lists_calls_waits_for_approval_and_reconnects() {
    let door = Door::start("", "");
    let modules = installed().join("clients-node/node_modules");
    assert!(
        modules.join("@modelcontextprotocol/sdk").exists(),
        "{} is missing: run the tests with scripts/test",
        modules.display()
    );
    let run = Uuid::new_v4().to_string();
    let phase = |phase: &str| {
        let mut command = Command::new("node");
        command
            .arg(script("front_typescript.cjs"))
            .args([phase, &url(&door)])
            .env("NODE_PATH", &modules)
            .env("TOOLGATE_FRONT_KEY", KEY_A)
            .env("TOOLGATE_RUN_ID", &run);
        report(command)
    };
    let first = phase("first");
    judge_first(&door, &first);
    // The client ended its session as it closed.
    let session = first["session"].as_str().unwrap();
    let answer = door.rpc(
        Some(KEY_A),
        Some(session),
        &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    );
    assert_eq!(answer.status, 404, "{answer:?}");
    approve_pending(&door);
    let second = phase("second");
    judge_second(&door, &first, &second);
}

/// The Python SDK as an application uses it, in `era`, through a proxy
/// that breaks the stream of one write after its effect: the SDK raises,
/// the application reconnects (in the 2025 era a new session) and asks
/// for the same call with a new request id, naming nothing, and the tool
/// has acted once. Counted outside toolgate, in the server's effects file.
fn python_sdk_asks_again_after_a_broken_stream(era: &str) {
    let place = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let door = Door::slow_answers(&BreakingProxy::allowed_hosts(&place));
    let proxy = BreakingProxy::start(&door, place);
    let mut command = Command::new(python("clients"));
    command
        .arg(script("front_python.py"))
        .args(["reissue", &proxy.url()])
        .env("TOOLGATE_FRONT_KEY", KEY_A)
        .env("TOOLGATE_ERA", era)
        .env("TOOLGATE_RUN_ID", Uuid::new_v4().to_string());
    let report = report(command);
    assert!(
        proxy.broken.load(std::sync::atomic::Ordering::SeqCst),
        "the proxy broke the stream: {report}"
    );
    assert!(!report["broken"].is_null(), "the SDK saw it: {report}");
    assert_eq!(
        std::fs::read_to_string(door.served.folder.path().join("writes.effects")).unwrap(),
        "sdk\nsdk\n",
        "one effect for the broken call and its re-issue, one for the new call"
    );
    assert_eq!(report["again"]["is_error"], false, "{report}");
    assert_eq!(report["again"]["reissue"], "same_call", "{report}");
    assert_eq!(report["new"]["reissue"], Value::Null, "{report}");
    assert_ne!(
        report["new"]["invocation_id"],
        report["again"]["invocation_id"]
    );
}

/// The TypeScript SDK's `script` (1.x: the 2025 era; 2.x pinned to
/// 2026-07-28) through the same breaking proxy: one effect for the broken
/// call and its re-issue.
fn typescript_asks_again_after_a_broken_stream(script_name: &str) {
    let place = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let door = Door::slow_answers(&BreakingProxy::allowed_hosts(&place));
    let proxy = BreakingProxy::start(&door, place);
    let modules = installed().join("clients-node/node_modules");
    let mut command = Command::new("node");
    command
        .arg(script(script_name))
        .args(["reissue", &proxy.url()])
        .env("NODE_PATH", &modules)
        .env("TOOLGATE_FRONT_KEY", KEY_A)
        .env("TOOLGATE_RUN_ID", Uuid::new_v4().to_string());
    let report = report(command);
    assert!(
        proxy.broken.load(std::sync::atomic::Ordering::SeqCst),
        "the proxy broke the stream: {report}"
    );
    assert!(!report["broken"].is_null(), "the SDK saw it: {report}");
    assert_eq!(
        std::fs::read_to_string(door.served.folder.path().join("writes.effects")).unwrap(),
        "sdk\nsdk\n",
        "one effect for the broken call and its re-issue, one for the new call"
    );
    assert_eq!(report["again"]["is_error"], false, "{report}");
    assert_eq!(report["again"]["reissue"], "same_call", "{report}");
    assert_ne!(
        report["new"]["invocation_id"],
        report["again"]["invocation_id"]
    );
}

#[test]
fn the_typescript_sdk_asks_again_after_a_broken_stream_and_the_tool_acts_once() {
    typescript_asks_again_after_a_broken_stream("front_typescript.cjs");
}

#[test]
fn the_typescript_client_without_sessions_asks_again_after_a_broken_stream_and_the_tool_acts_once()
{
    typescript_asks_again_after_a_broken_stream("front_typescript_v2.cjs");
}

#[test]
fn the_python_sdk_asks_again_after_a_broken_stream_and_the_tool_acts_once() {
    python_sdk_asks_again_after_a_broken_stream("legacy");
}

#[test]
fn the_python_sdk_without_sessions_asks_again_after_a_broken_stream_and_the_tool_acts_once() {
    python_sdk_asks_again_after_a_broken_stream("2026-07-28");
}

/// The TypeScript SDK's 2.x client, pinned to 2026-07-28 (its 1.x speaks
/// the 2025 era only): the same runs, without a session.
#[test]
fn the_typescript_client_without_sessions_lists_calls_waits_for_approval_and_asks_again() {
    let door = Door::start("", "");
    let modules = installed().join("clients-node/node_modules");
    assert!(
        modules.join("@modelcontextprotocol/client").exists(),
        "{} is missing: run the tests with scripts/test",
        modules.display()
    );
    let run = Uuid::new_v4().to_string();
    let phase = |phase: &str| {
        let mut command = Command::new("node");
        command
            .arg(script("front_typescript_v2.cjs"))
            .args([phase, &url(&door)])
            .env("NODE_PATH", &modules)
            .env("TOOLGATE_FRONT_KEY", KEY_A)
            .env("TOOLGATE_RUN_ID", &run);
        report(command)
    };
    let first = phase("first");
    assert_eq!(first["protocol_version"], "2026-07-28", "{first}");
    assert_eq!(first["session"], Value::Null, "no session: {first}");
    judge_first(&door, &first);
    approve_pending(&door);
    let second = phase("second");
    judge_second(&door, &first, &second);
}

/// What an agent framework must show: the tools loaded under the names the
/// door gives, a call's model-ready result, and a denial said as such.
fn judge_framework(report: &Value) {
    let tools = report["tools"].as_array().unwrap();
    for name in ["demo-echo", "mcp-reads-echo", "mcp-writes-write"] {
        assert!(tools.contains(&json!(name)), "{name}: {report}");
    }
    let echo = report["echo"].as_str().unwrap();
    assert!(
        echo.contains("from ") && echo.contains("EXTERNAL_UNTRUSTED"),
        "{report}"
    );
    let denied = report["denied"].as_str().unwrap();
    assert!(
        denied.contains("policy.rule.denied") || denied.contains("The policy"),
        "{report}"
    );
}

#[test]
fn the_openai_agents_sdk_loads_the_tools_as_an_application_does() {
    let door = Door::start("", "");
    let mut command = Command::new(python("clients"));
    command
        .arg(script("front_agents.py"))
        .arg(url(&door))
        .env("TOOLGATE_FRONT_KEY", KEY_A)
        .env("OPENAI_AGENTS_DISABLE_TRACING", "1");
    judge_framework(&report(command));
}

#[test]
fn langchains_mcp_adapters_load_the_tools_as_an_application_does() {
    let door = Door::start("", "");
    let mut command = Command::new(python("langchain"));
    command
        .arg(script("front_langchain.py"))
        .arg(url(&door))
        .env("TOOLGATE_FRONT_KEY", KEY_A);
    judge_framework(&report(command));
}

/// A TCP proxy of the test's own in front of a door: it carries bytes both
/// ways and, once, cuts the connection that carries a `tools/call` of
/// `mcp-writes-write` as soon as that call's effect is counted outside, so
/// the call has acted and its answer cannot arrive.
pub struct BreakingProxy {
    pub port: u16,
    pub broken: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl BreakingProxy {
    /// The `[front]` entry a door behind the proxy listening at `place`
    /// needs: the proxy passes the client's `Host` (the proxy's own
    /// address) through, and ports are exact.
    pub fn allowed_hosts(place: &std::net::TcpListener) -> String {
        let port = place.local_addr().unwrap().port();
        format!(
            "allowed_hosts = [\"127.0.0.1\", \"localhost\", \"127.0.0.1:{port}\", \"localhost:{port}\"]"
        )
    }

    /// The proxy at `listener` (reserved before the door started), to `door`.
    pub fn start(door: &Door, listener: std::net::TcpListener) -> BreakingProxy {
        use std::net::{Shutdown, TcpStream};
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};

        let port = listener.local_addr().unwrap().port();
        let upstream = door.port;
        let effects = door.served.folder.path().join("writes.effects");
        let broken = Arc::new(AtomicBool::new(false));
        let armed = Arc::new(AtomicBool::new(true));
        let flag = broken.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().take(256) {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let pump = |mut from: TcpStream, mut to: TcpStream, watch: bool| {
                    let (armed, broken, effects) = (armed.clone(), flag.clone(), effects.clone());
                    let (cut_from, cut_to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
                    std::thread::spawn(move || {
                        use std::io::{Read, Write};
                        let mut buffer = [0u8; 65536];
                        let mut seen = Vec::new();
                        loop {
                            let read = match from.read(&mut buffer) {
                                Ok(0) | Err(_) => break,
                                Ok(read) => read,
                            };
                            if to.write_all(&buffer[..read]).is_err() {
                                break;
                            }
                            if !watch || !armed.load(Ordering::SeqCst) {
                                continue;
                            }
                            seen.extend_from_slice(&buffer[..read]);
                            let text = String::from_utf8_lossy(&seen);
                            if text.contains("tools/call")
                                && text.contains("mcp-writes-write")
                                && armed.swap(false, Ordering::SeqCst)
                            {
                                let before = count_lines(&effects);
                                let (cut_from, cut_to) =
                                    (cut_from.try_clone().unwrap(), cut_to.try_clone().unwrap());
                                let (broken, effects) = (broken.clone(), effects.clone());
                                std::thread::spawn(move || {
                                    let started = std::time::Instant::now();
                                    while count_lines(&effects) <= before
                                        && started.elapsed() < std::time::Duration::from_secs(30)
                                    {
                                        std::thread::sleep(std::time::Duration::from_millis(5));
                                    }
                                    let _ = cut_from.shutdown(Shutdown::Both);
                                    let _ = cut_to.shutdown(Shutdown::Both);
                                    broken.store(true, Ordering::SeqCst);
                                });
                            }
                        }
                        let _ = from.shutdown(Shutdown::Both);
                        let _ = to.shutdown(Shutdown::Both);
                    });
                };
                pump(
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    true,
                );
                pump(server, client, false);
            }
        });
        BreakingProxy { port, broken }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

fn count_lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .count()
}
