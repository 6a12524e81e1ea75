//! What an operator configures and sees: the control socket's mode and
//! group, per-tenant approval holds, a stdio server's PATH, the policy
//! reloaded on SIGHUP, PostgreSQL over TLS, the log filter.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::time::{Duration, Instant};

use serde_json::json;
use uuid::Uuid;

use crate::serve::{Served, TENANT, http, json_of};

#[test]
fn the_control_socket_takes_the_configured_mode_and_group() {
    let gid = nix::unistd::getgid().as_raw();
    let served = Served::start_edited(
        |_, config| {
            config.replace(
                "socket = \"run/control.sock\"\n",
                &format!(
                    "socket = \"run/control.sock\"\nsocket_mode = \"0660\"\nsocket_group = \"{gid}\"\n"
                ),
            )
        },
        &[],
    );
    let metadata = std::fs::metadata(&served.socket).unwrap();
    assert_eq!(metadata.permissions().mode() & 0o777, 0o660);
    assert_eq!(metadata.gid(), gid);
}

/// Bad operator settings are refused with their field paths.
#[test]
fn operator_settings_are_checked() {
    let folder = tempfile::tempdir().unwrap();
    let file = folder.path().join("toolgate.toml");
    std::fs::write(
        &file,
        r#"
[control]
socket = "run/control.sock"
socket_mode = "0666"
socket_group = "no-such-group-here"

[store]
url = "sqlite://toolgate.db"

[artifacts]
directory = "state/artifacts"

[runtime]
worker_threads = 0
drain_timeout_seconds = 0

[log]
level = "loud"

[bridge.tenant_approval_hold_seconds]
"not a tenant" = 5

[[mcp.servers]]
server_id = "relative"
command = "server"
path = "bin:/usr/bin"
"#,
    )
    .unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .arg("check-config")
        .arg(&file)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    for field in [
        "control.socket_mode",
        "control.socket_group",
        "runtime.worker_threads",
        "runtime.drain_timeout_seconds",
        "log.level",
        "bridge.tenant_approval_hold_seconds",
        "mcp.servers[0].path",
    ] {
        assert!(stderr.contains(field), "{field} missing:\n{stderr}");
    }
}

/// A tenant's own approval hold applies to its turns; others keep the
/// default.
#[test]
fn a_tenant_approval_hold_overrides_the_default() {
    let served = Served::here().start_edited(
        |_, config| {
            config.replace(
                "turn_call_cap = 64\n",
                &format!(
                    "turn_call_cap = 64\n\n[bridge.tenant_approval_hold_seconds]\n{TENANT} = 1\n"
                ),
            )
        },
        &[],
    );
    let session = served.session();
    let script = "hold";
    let (_, socket, token) = served.turn(session, Uuid::new_v4(), script, None);
    let authorization = format!("Bearer {token}");
    let started = Instant::now();
    let (status, _, body) = http(
        &socket,
        "POST",
        "/v1/call",
        &[("Authorization", &authorization)],
        Some(br#"{"call": "demo.external_write", "arguments": {"line": "held"}}"#),
    );
    assert_eq!(status, 409, "{}", String::from_utf8_lossy(&body));
    assert_eq!(json_of(&body)["error"]["code"], "turn_suspended");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

/// SIGHUP reads the policy file again: a valid one takes effect, a broken
/// one is refused and the rules in force stay.
#[test]
fn the_policy_is_reloaded_on_sighup_and_a_bad_file_keeps_the_old() {
    const REFUSED: &str = "\"problem\":\"policy rules";
    let served = Served::start();
    let session = served.session();
    let policy = served.folder.path().join("policy.toml");
    let echo = |step: u32| {
        let (status, body) = served.echo(session, Uuid::new_v4(), step, "c1", "demo.echo");
        assert_eq!(status, 200, "{body}");
        body["results"][0]["outcome"]["status"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(echo(1), "succeeded");
    let hangup = || {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(served.pid().unwrap() as i32),
            nix::sys::signal::Signal::SIGHUP,
        )
        .unwrap();
    };
    let logged = |text: &str| {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if served.logs.lock().unwrap().contains(text) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    };
    std::fs::write(
        &policy,
        "[[rules]]\ntools = [\"demo.echo\"]\ndecision = \"deny\"\n",
    )
    .unwrap();
    hangup();
    assert!(
        logged("\"what\":\"policy rules"),
        "{}",
        served.logs.lock().unwrap()
    );
    assert_eq!(echo(2), "denied");
    std::fs::write(&policy, "[[rules]]\ntools = 42\n").unwrap();
    hangup();
    assert!(logged(REFUSED));
    assert_eq!(echo(3), "denied", "the rules in force stayed");
    // An emptied file (comments only) never fails open: refused like a
    // broken one, unless it says it has no rules.
    let before = served.logs.lock().unwrap().matches(REFUSED).count();
    std::fs::write(&policy, "# every rule removed\n").unwrap();
    hangup();
    let started = Instant::now();
    while served.logs.lock().unwrap().matches(REFUSED).count() == before {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the empty file is refused"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(echo(4), "denied", "the rules in force stayed");
    std::fs::write(&policy, "no_rules = true\n").unwrap();
    hangup();
    let started = Instant::now();
    while echo(5) != "succeeded" {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no rules, as it says"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, _) = served.post("/v1/sessions", &json!({}));
    assert_eq!(status, 400, "still serving");
}

/// `toolgate reload` reaches the one node its configuration names, puts in
/// force what may change while it runs (the rules, the front door's keys)
/// and says so line by line; a section that waits for a restart is named,
/// and a file that does not validate changes nothing.
#[test]
fn toolgate_reload_reloads_its_node_and_says_what_changed() {
    let door = crate::front::Door::start("", "");
    let other = Served::start();
    let folder = door.served.folder.path();
    let config = folder.join("toolgate.toml");
    let reload = || {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(["reload", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    };
    let (succeeded, said) = reload();
    assert!(succeeded, "{said}");
    assert!(said.contains("unchanged: policy rules ("), "{said}");
    assert!(said.contains("unchanged: front API keys (3)"), "{said}");
    assert!(!said.contains("restart required"), "{said}");

    // A new key, new rules, and a bridge setting that needs a restart.
    let new_key = "tgk_front_alpha_0000000000000000000000000000000000000000000000000009";
    let text = std::fs::read_to_string(&config).unwrap();
    let text = text.replace("turn_call_cap = 64", "turn_call_cap = 65")
        + &format!(
            "\n[[front.api_keys]]\nid = \"late\"\nsha256 = \"{}\"\ntenant_id = \"{TENANT}\"\n\
             principal = {{ id = \"user-9\", scopes = [\"demo.use\"] }}\ntools = [\"demo.*\"]\n",
            toolgate::domain::sha256_hex(new_key.as_bytes())
        );
    std::fs::write(&config, text).unwrap();
    std::fs::write(
        folder.join("policy.toml"),
        "[[rules]]\ntools = [\"demo.echo\"]\ndecision = \"deny\"\n",
    )
    .unwrap();
    assert_eq!(
        door.rpc(
            Some(new_key),
            None,
            &json!({"jsonrpc": "2.0", "id": 1, "method": "ping"})
        )
        .status,
        401,
        "not in force before the reload"
    );
    let (succeeded, said) = reload();
    assert!(succeeded, "{said}");
    assert!(said.contains("reloaded: policy rules ("), "{said}");
    assert!(
        said.contains("reloaded: front API keys (4 in force; added late)"),
        "{said}"
    );
    assert!(
        said.contains("restart required: bridge (changed in the file"),
        "{said}"
    );
    door.open(new_key);
    let session = door.open(crate::front::KEY_A);
    let denied = door.call(
        crate::front::KEY_A,
        &session,
        json!(1),
        "demo-echo",
        json!({"text": "x"}),
        None,
    );
    assert_eq!(
        denied["structuredContent"]["reason_code"], "policy.rule.denied",
        "{denied}"
    );
    // Only the named node: the other one read nothing again.
    assert!(
        !other.logs.lock().unwrap().contains("reloaded"),
        "{}",
        other.logs.lock().unwrap()
    );

    // Asked again, what is in force is unchanged; the restart still waits.
    let (_, said) = reload();
    assert!(said.contains("unchanged: front API keys (4)"), "{said}");
    assert!(said.contains("restart required: bridge"), "{said}");

    // A file that does not validate: refused, named by field, and the keys
    // and rules in force stay.
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("turn_call_cap = 65", "turn_call_cap = \"many\""),
    )
    .unwrap();
    let (succeeded, said) = reload();
    assert!(!succeeded, "{said}");
    assert!(said.contains("refused: "), "{said}");
    assert!(said.contains("bridge.turn_call_cap"), "{said}");
    door.open(new_key);

    // No node on the socket: said, and a failure.
    drop(door);
    let (succeeded, _) = reload();
    assert!(!succeeded);
}

/// The store reaches PostgreSQL over TLS when the URL asks for it.
#[tokio::test]
async fn postgres_is_reached_over_tls_when_the_url_asks() {
    use sqlx::Connection as _;
    let Some(schema) = crate::store::PgSchema::create().await else {
        return;
    };
    let separator = if schema.url.contains('?') { '&' } else { '?' };
    let url = format!("{}{separator}sslmode=require", schema.url);
    let store = toolgate::adapters::store::connect(&url)
        .await
        .expect("the store connects over TLS");
    assert!(store.pending_migrations().await.unwrap().is_empty());
    let mut connection = sqlx::PgConnection::connect(&url).await.unwrap();
    let tls: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(&mut connection)
        .await
        .unwrap();
    assert!(tls);
    // A root certificate that does not sign the server's is refused.
    let folder = tempfile::tempdir().unwrap();
    let root = folder.path().join("root.pem");
    std::fs::write(&root, include_str!("../testdata/unrelated-ca.pem")).unwrap();
    let strict = format!(
        "{}{separator}sslmode=verify-full&sslrootcert={}",
        schema.url,
        root.display()
    );
    assert!(toolgate::adapters::store::connect(&strict).await.is_err());
}

/// One INFO line per finished call (identity, status, time: nothing of the
/// arguments); `log.level` filters, `RUST_LOG` wins over it.
#[test]
fn finished_calls_are_logged_once_and_the_level_is_configurable() {
    let mut served = Served::start();
    let session = served.session();
    let (status, _) = served.echo(session, Uuid::new_v4(), 1, "c1", "demo.echo");
    assert_eq!(status, 200);
    assert!(served.stop());
    let logs = served.logs.lock().unwrap().clone();
    let finished: Vec<&str> = logs
        .lines()
        .filter(|line| line.contains("tool call finished"))
        .collect();
    assert_eq!(finished.len(), 1, "{logs}");
    let line: serde_json::Value = serde_json::from_str(finished[0]).unwrap();
    assert_eq!(line["level"], "INFO");
    assert_eq!(line["fields"]["tool"], "demo.echo");
    assert_eq!(line["fields"]["status"], "succeeded");
    assert!(line["fields"]["duration_ms"].is_u64(), "{line}");
    assert!(!finished[0].contains("\"hi\""), "no arguments: {line}");

    let quiet = Served::start_edited(
        |_, config| format!("{config}\n[log]\nlevel = \"warn\"\n"),
        &[],
    );
    let loud = Served::start_edited(
        |_, config| format!("{config}\n[log]\nlevel = \"warn\"\n"),
        &[("RUST_LOG", "info".to_owned())],
    );
    // Both serve: the loud one says so, the quiet one (which started first
    // and is past the same point) does not.
    let started = Instant::now();
    while !loud.logs.lock().unwrap().contains("toolgate serving") {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the loud node says it serves"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    quiet.wait_ready();
    assert!(!quiet.logs.lock().unwrap().contains("toolgate serving"));
}

/// A GET over TCP: (status, body).
fn get_tcp(address: &str, path: &str, method: &str) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: ops\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The operations listener serves metrics and probes, and nothing of the
/// control API or of any tenant.
#[test]
fn the_operations_listener_serves_metrics_and_probes_only() {
    let port = crate::support::free_port();
    let address = format!("127.0.0.1:{port}");
    let served = Served::here().start_edited(
        |_, config| format!("{config}\n[ops]\nlisten = \"{address}\"\n"),
        &[],
    );
    let session = served.session();
    let (status, _) = served.echo(session, Uuid::new_v4(), 1, "c1", "mcp.reads.echo");
    assert_eq!(status, 200);
    assert_eq!(get_tcp(&address, "/healthz", "GET").0, 200);
    served.wait_ready();
    assert_eq!(get_tcp(&address, "/readyz", "GET").0, 200);
    let (status, metrics) = get_tcp(&address, "/metrics", "GET");
    assert_eq!(status, 200);
    for expected in [
        "toolgate_build_info{version=\"",
        "toolgate_tool_calls_total{name=\"mcp.reads.echo\",source=\"mcp\",outcome_status=\"succeeded\"} 1",
        "toolgate_mcp_requests_total{server=\"reads\",method=\"tools/call\",outcome=\"ok\"} 1",
        "toolgate_mcp_connections{server=\"reads\"} 1",
        "toolgate_store_commit_seconds_count{operation=\"complete\"} 1",
        "toolgate_turns_open 0\n",
        "toolgate_requests_in_flight ",
        "toolgate_review_queue_depth 0",
        "toolgate_approvals_pending 0",
        "toolgate_process_resident_memory_bytes ",
        "toolgate_process_open_fds ",
        "# EOF",
    ] {
        assert!(metrics.contains(expected), "{expected} missing:\n{metrics}");
    }
    assert!(!metrics.contains(TENANT), "no tenant in a metric");
    for path in ["/v1/sessions", "/v1/events?after=0", "/v1/approvals"] {
        assert_eq!(get_tcp(&address, path, "GET").0, 404, "{path}");
    }
    assert_eq!(get_tcp(&address, "/metrics", "POST").0, 405);
}

/// A collector stand-in: accepts OTLP/HTTP posts and keeps their bodies.
pub fn collector() -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead as _, Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = bodies.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = std::io::BufReader::new(stream);
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0u8; length];
            if reader.read_exact(&mut body).is_ok() {
                kept.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&body).into_owned());
            }
            let _ = reader.get_mut().write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
            );
        }
    });
    (address, bodies)
}

/// The spans the collector was sent, once the first export arrived; no
/// body holds `marker` (an argument's value).
pub fn exported_spans(
    bodies: &std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    marker: &str,
) -> Vec<serde_json::Value> {
    let started = Instant::now();
    while bodies.lock().unwrap().is_empty() && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let bodies = bodies.lock().unwrap().clone();
    let mut spans = Vec::new();
    for body in &bodies {
        assert!(!body.contains(marker), "an argument left in a span: {body}");
        let export: serde_json::Value = serde_json::from_str(body).unwrap();
        for resource in export["resourceSpans"].as_array().unwrap() {
            assert!(resource.to_string().contains("toolgate-test"), "{resource}");
            for scope in resource["scopeSpans"].as_array().unwrap() {
                spans.extend(scope["spans"].as_array().unwrap().iter().cloned());
            }
        }
    }
    spans
}

/// Spans reach the collector over OTLP: a control request continues the
/// caller's trace, `tool.execute` and its children hang under it with the
/// document's attributes, and no argument value is in any attribute.
#[test]
fn spans_are_exported_over_otlp_and_continue_the_callers_trace() {
    let (address, bodies) = collector();
    let mut served = Served::start_edited(
        |_, config| {
            format!(
                "{config}\n[telemetry]\notlp_endpoint = \"http://{address}/v1/traces\"\nservice_name = \"toolgate-test\"\n"
            )
        },
        &[],
    );
    let session = served.session();
    let (trace_id, parent_id) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let marker = "ARGUMENT-MARKER-7f3a";
    let body = json!({"session_id": session, "run_id": Uuid::new_v4(), "step_number": 1,
        "origin_trust": "user",
        "calls": [{"call_id": "c1", "name": "demo.echo", "arguments": {"text": marker}}]})
    .to_string();
    let traceparent = format!("00-{trace_id}-{parent_id}-01");
    let (status, _, answer) = http(
        &served.socket,
        "POST",
        "/v1/calls",
        &[("traceparent", &traceparent)],
        Some(body.as_bytes()),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
    assert!(served.stop(), "the drain exports what is buffered");
    let spans = exported_spans(&bodies, marker);
    let named = |name: &str| {
        spans
            .iter()
            .find(|span| span["name"] == name)
            .unwrap_or_else(|| panic!("no {name} span in {spans:?}"))
            .clone()
    };
    // The session's own request is a trace of its own; the call's request
    // continues the caller's.
    let request = spans
        .iter()
        .find(|span| {
            span["name"] == "control.request"
                && span["traceId"].as_str().unwrap_or_default().to_lowercase() == trace_id
        })
        .unwrap_or_else(|| panic!("no control.request continues the caller's trace: {spans:?}"))
        .clone();
    let execute = named("tool.execute");
    assert_eq!(
        request["parentSpanId"].as_str().unwrap().to_lowercase(),
        parent_id
    );
    assert_eq!(execute["traceId"], request["traceId"]);
    // tool.execute is under the request (through the routing span chain).
    let by_id: std::collections::HashMap<String, &serde_json::Value> = spans
        .iter()
        .map(|span| (span["spanId"].as_str().unwrap().to_owned(), span))
        .collect();
    let mut ancestor = execute["parentSpanId"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let mut under_request = false;
    while let Some(span) = by_id.get(&ancestor) {
        if span["name"] == "control.request" {
            under_request = true;
            break;
        }
        ancestor = span["parentSpanId"].as_str().unwrap_or_default().to_owned();
    }
    assert!(under_request, "{spans:?}");
    let attribute = |span: &serde_json::Value, key: &str| {
        span["attributes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|attribute| attribute["key"] == key)
            .map(|attribute| attribute["value"].clone())
    };
    assert_eq!(
        attribute(&execute, "tool.name").unwrap()["stringValue"],
        "demo.echo"
    );
    assert_eq!(
        attribute(&execute, "tool.outcome_status").unwrap()["stringValue"],
        "succeeded"
    );
    for child in ["tool.validate", "policy.evaluate"] {
        assert_eq!(named(child)["parentSpanId"], execute["spanId"], "{child}");
    }
}

/// `--version` names the build's revision; completions and the manual page
/// come from the command line's own definition.
/// A PostgreSQL that does not listen is said at once, with the address
/// dialled and what to check, not after a pool's thirty-second wait.
#[test]
fn an_unreachable_database_is_named_at_once() {
    let folder = tempfile::tempdir().unwrap();
    let port = crate::support::free_port();
    let config = folder.path().join("toolgate.toml");
    std::fs::write(
        &config,
        format!(
            "[control]\nsocket = \"s\"\n[store]\nurl = \"postgres://toolgate@127.0.0.1:{port}/toolgate\"\n\
             [artifacts]\ndirectory = \"a\"\n"
        ),
    )
    .unwrap();
    let started = Instant::now();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["migrate", "--config"])
        .arg(&config)
        .env_remove("TOOLGATE_STORE_URL")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{said}");
    assert!(
        said.contains(&format!("cannot reach PostgreSQL at 127.0.0.1:{port}"))
            && said.contains("check that the server runs"),
        "{said}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

/// A command whose reader has gone (`| head` that read enough) ends
/// quietly: no panic, no error, success.
#[test]
fn no_command_panics_on_a_closed_pipe() {
    for args in [
        &["key"][..],
        &["completions", "bash"],
        &["man"],
        &["--help"],
    ] {
        // The reader is gone before the command starts.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(
            output.status.success(),
            "{args:?}: {:?} {stderr}",
            output.status
        );
    }
}

#[test]
fn version_completions_and_manual_page() {
    let run = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(args)
            .output()
            .unwrap();
        assert!(output.status.success(), "{args:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    let version = run(&["--version"]);
    let revision = version
        .trim()
        .strip_prefix(concat!("toolgate ", env!("CARGO_PKG_VERSION"), " ("))
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{version}"));
    assert!(
        revision == "unknown" || revision.chars().all(|c| c.is_ascii_hexdigit()),
        "{version}"
    );
    assert!(run(&["completions", "bash"]).contains("_toolgate()"));
    assert!(run(&["completions", "zsh"]).contains("#compdef toolgate"));
    let manual = run(&["man"]);
    assert!(
        manual.contains(".TH toolgate 1") && manual.contains("serve"),
        "{manual}"
    );
}

/// Connections that are opened and never send a request (half-open, or
/// slow on purpose) never keep a probe out: a hundred of them held, the
/// probes are still answered, at once.
#[test]
fn probes_are_answered_while_others_hold_connections() {
    let port = crate::support::free_port();
    let address = format!("127.0.0.1:{port}");
    let listen = address.clone();
    let served = Served::here().start_edited(
        move |_, config| format!("{config}\n[ops]\nlisten = \"{listen}\"\n"),
        &[],
    );
    served.wait_ready();
    let held: Vec<std::net::TcpStream> = (0..100)
        .map(|_| std::net::TcpStream::connect(&address).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    for path in ["/healthz", "/readyz", "/metrics"] {
        let started = Instant::now();
        assert_eq!(get_tcp(&address, path, "GET").0, 200, "{path}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{path} took {:?}",
            started.elapsed()
        );
    }
    drop(held);
}

/// Names no tool has (a script's, a caller's) never become series: a
/// thousand of them are counted under one `name="unknown"`.
#[test]
fn unknown_tool_names_never_become_series() {
    let port = crate::support::free_port();
    let address = format!("127.0.0.1:{port}");
    let listen = address.clone();
    let served = Served::here().start_edited(
        move |_, config| format!("{config}\n[ops]\nlisten = \"{listen}\"\n"),
        &[],
    );
    let session = served.session();
    let series = |text: &str| text.lines().filter(|line| !line.starts_with('#')).count();
    let mut after_first = 0;
    for batch in 0..10 {
        let calls: Vec<serde_json::Value> = (0..100)
            .map(|index| {
                json!({"call_id": format!("c{batch}-{index}"),
                       "name": format!("made.up{batch}x{index}"), "arguments": {}})
            })
            .collect();
        let (status, body) = served.post(
            "/v1/calls",
            &json!({"session_id": session, "run_id": Uuid::new_v4(), "step_number": 1,
                    "origin_trust": "user", "calls": calls}),
        );
        assert_eq!(status, 200, "{body}");
        if batch == 0 {
            after_first = series(&get_tcp(&address, "/metrics", "GET").1);
        }
    }
    let (_, after) = get_tcp(&address, "/metrics", "GET");
    assert!(!after.contains("made.up"), "a caller's name became a label");
    assert!(
        after.contains("toolgate_tool_calls_total{name=\"unknown\",source=\"builtin\",outcome_status=\"denied\"} 1000"),
        "{after}"
    );
    assert_eq!(
        series(&after),
        after_first,
        "the series after 1,000 names are those after 100"
    );
}

/// The design's eight metrics and their labels: `(name, labels)` in the
/// order the design lists them.
const DESIGN_METRICS: [(&str, &[&str]); 8] = [
    ("tool_calls_total", &["name", "source", "outcome_status"]),
    ("tool_failures_total", &["name", "source", "reason_code"]),
    ("tool_duration_seconds", &["name", "source"]),
    ("tool_output_bytes", &["name", "source"]),
    ("tool_truncations_total", &["name", "source"]),
    ("tool_uncertain_total", &["name", "source"]),
    ("mcp_requests_total", &["server", "method", "outcome"]),
    ("mcp_connect_failures_total", &["server", "reason_code"]),
];

/// The samples of one metric in an exposition: each sample's labels (a
/// histogram's `le` left out, its `_bucket`, `_count` and `_sum` samples
/// all counted) and its value.
fn samples(exposition: &str, metric: &str) -> Vec<(Vec<(String, String)>, f64)> {
    let name = format!("toolgate_{metric}");
    exposition
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (family, labels) = series.split_once('{')?;
            let family = family
                .strip_suffix("_bucket")
                .or_else(|| family.strip_suffix("_count"))
                .or_else(|| family.strip_suffix("_sum"))
                .filter(|_| !metric.ends_with("_total"))
                .unwrap_or(family);
            if family != name {
                return None;
            }
            let labels = labels
                .strip_suffix('}')?
                .split(',')
                .filter_map(|pair| {
                    let (key, value) = pair.split_once('=')?;
                    Some((key.to_owned(), value.trim_matches('"').to_owned()))
                })
                .filter(|(key, _)| key != "le")
                .collect();
            Some((labels, value.parse().ok()?))
        })
        .collect()
}

/// Every one of the design's eight metrics is served on GET /metrics with
/// exactly the design's labels (never a tenant), counted from real calls:
/// a success over MCP, a denial, an uncertain MCP write, an excerpted
/// result, and a server that cannot be started.
#[test]
fn the_eight_design_metrics_are_served_with_their_labels() {
    let port = crate::support::free_port();
    let address = format!("127.0.0.1:{port}");
    let listen = address.clone();
    let served = Served::here().start_edited(
        move |_, config| {
            format!(
                "{config}\n[[mcp.servers]]\nserver_id = \"broken\"\ncommand = \"/bin/false\"\n\
                 \n[ops]\nlisten = \"{listen}\"\n"
            )
        },
        &[],
    );
    let session = served.session();
    let (status, body) = served.post(
        "/v1/calls",
        &json!({"session_id": session, "run_id": Uuid::new_v4(), "step_number": 1,
                "origin_trust": "user", "calls": [
            {"call_id": "read", "name": "mcp.reads.echo", "arguments": {"text": "hi"}},
            {"call_id": "denied", "name": "demo.keyed_write", "arguments": {"line": "no"}},
            {"call_id": "unknown", "name": "mcp.writes.fail", "arguments": {}},
            {"call_id": "large", "name": "demo.echo", "arguments": {"text": "x".repeat(20_000)}},
        ]}),
    );
    assert_eq!(status, 200, "{body}");
    let outcome = |index: usize, field: &str| {
        body["results"][index]["outcome"][field]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(outcome(0, "status"), "succeeded", "{body}");
    assert_eq!(outcome(1, "reason_code"), "policy.rule.denied", "{body}");
    assert_eq!(outcome(2, "status"), "uncertain", "{body}");
    assert_eq!(outcome(3, "status"), "succeeded", "{body}");

    let (status, exposition) = get_tcp(&address, "/metrics", "GET");
    assert_eq!(status, 200);
    assert!(!exposition.contains(TENANT), "no tenant in a metric");
    for (metric, labels) in DESIGN_METRICS {
        let found = samples(&exposition, metric);
        assert!(!found.is_empty(), "no {metric}:\n{exposition}");
        for (sample, _) in &found {
            let keys: Vec<&str> = sample.iter().map(|(key, _)| key.as_str()).collect();
            assert_eq!(keys, labels, "{metric}'s labels");
        }
    }
    let value = |metric: &str, labels: &[(&str, &str)]| -> f64 {
        samples(&exposition, metric)
            .into_iter()
            .filter(|(sample, _)| {
                labels
                    .iter()
                    .all(|(key, value)| sample.iter().any(|(k, v)| k == key && v == value))
            })
            .map(|(_, value)| value)
            .fold(0.0, f64::max)
    };
    let reads = [("name", "mcp.reads.echo"), ("source", "mcp")];
    let echo = [("name", "demo.echo"), ("source", "builtin")];
    let fail = [("name", "mcp.writes.fail"), ("source", "mcp")];
    let mut succeeded = reads.to_vec();
    succeeded.push(("outcome_status", "succeeded"));
    assert_eq!(value("tool_calls_total", &succeeded), 1.0, "{exposition}");
    assert_eq!(
        value(
            "tool_failures_total",
            &[
                ("name", "demo.keyed_write"),
                ("source", "builtin"),
                ("reason_code", "policy.rule.denied")
            ]
        ),
        1.0,
        "{exposition}"
    );
    for count in [
        "toolgate_tool_duration_seconds_count{name=\"mcp.reads.echo\",source=\"mcp\"} 1\n",
        "toolgate_tool_output_bytes_count{name=\"demo.echo\",source=\"builtin\"} 1\n",
    ] {
        assert!(exposition.contains(count), "{count} missing:\n{exposition}");
    }
    assert_eq!(value("tool_truncations_total", &echo), 1.0, "{exposition}");
    assert_eq!(value("tool_uncertain_total", &fail), 1.0, "{exposition}");
    assert_eq!(
        value(
            "mcp_requests_total",
            &[
                ("server", "reads"),
                ("method", "tools/call"),
                ("outcome", "ok")
            ]
        ),
        1.0,
        "{exposition}"
    );
    assert!(
        value(
            "mcp_connect_failures_total",
            &[
                ("server", "broken"),
                ("reason_code", "tool.server_unreachable")
            ]
        ) >= 1.0,
        "{exposition}"
    );
}

/// One call's `tool.execute` span, with its attributes by key.
fn attributes(span: &serde_json::Value) -> std::collections::HashMap<String, serde_json::Value> {
    span["attributes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|attribute| {
            (
                attribute["key"].as_str().unwrap().to_owned(),
                attribute["value"].clone(),
            )
        })
        .collect()
}

/// Every `tool.execute` carries the design's eight attributes, each as a
/// plain value (the batch's group its id, not a debug rendering of an
/// option), and has its three children: `tool.validate` and
/// `policy.evaluate` under every call, `mcp.request` under an MCP call's.
#[test]
fn tool_execute_spans_carry_every_attribute_and_their_children() {
    let (address, bodies) = collector();
    let mut served = Served::start_edited(
        |_, config| {
            format!(
                "{config}\n[telemetry]\notlp_endpoint = \"http://{address}/v1/traces\"\nservice_name = \"toolgate-test\"\n"
            )
        },
        &[],
    );
    let session = served.session();
    let (status, body) = served.post(
        "/v1/calls",
        &json!({"session_id": session, "run_id": Uuid::new_v4(), "step_number": 1,
                "origin_trust": "user", "calls": [
            {"call_id": "short", "name": "demo.echo", "arguments": {"text": "hi"}},
            {"call_id": "remote", "name": "mcp.reads.echo", "arguments": {"text": "hi"}},
            {"call_id": "denied", "name": "demo.keyed_write", "arguments": {"line": "no"}},
            {"call_id": "large", "name": "demo.echo", "arguments": {"text": "x".repeat(20_000)}},
        ]}),
    );
    assert_eq!(status, 200, "{body}");
    let group = body["parallel_group"].as_str().unwrap().to_owned();
    assert!(served.stop(), "the drain exports what is buffered");
    let started = Instant::now();
    while bodies.lock().unwrap().is_empty() && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut spans = Vec::new();
    for body in bodies.lock().unwrap().iter() {
        let export: serde_json::Value = serde_json::from_str(body).unwrap();
        for resource in export["resourceSpans"].as_array().unwrap() {
            for scope in resource["scopeSpans"].as_array().unwrap() {
                spans.extend(scope["spans"].as_array().unwrap().iter().cloned());
            }
        }
    }
    let executes: Vec<&serde_json::Value> = spans
        .iter()
        .filter(|span| span["name"] == "tool.execute")
        .collect();
    assert_eq!(executes.len(), 4, "{spans:?}");
    let text = |value: &serde_json::Value| value["stringValue"].as_str().map(str::to_owned);
    // (name, source, idempotency class, status, reason code, truncated)
    let mut seen: Vec<(String, String, String, String, Option<String>, bool)> = Vec::new();
    for execute in &executes {
        let attributes = attributes(execute);
        let get = |key: &str| {
            attributes
                .get(key)
                .unwrap_or_else(|| panic!("no {key} on {execute}"))
        };
        // A builtin's version is the build's; an MCP tool's, its catalog's hash.
        let version = text(get("tool.version")).unwrap_or_default();
        match text(get("tool.source")).as_deref() {
            Some("builtin") => assert_eq!(version, "1", "{execute}"),
            _ => assert!(
                version.len() == 64 && version.chars().all(|c| c.is_ascii_hexdigit()),
                "{execute}"
            ),
        }
        assert_eq!(
            text(get("tool.parallel_group")),
            Some(group.clone()),
            "the batch's id as a plain value: {execute}"
        );
        let truncated = get("tool.truncated")["boolValue"]
            .as_bool()
            .unwrap_or_else(|| panic!("tool.truncated is a boolean: {execute}"));
        seen.push((
            text(get("tool.name")).unwrap(),
            text(get("tool.source")).unwrap(),
            text(get("tool.idempotency_class")).unwrap(),
            text(get("tool.outcome_status")).unwrap(),
            attributes.get("tool.reason_code").and_then(text),
            truncated,
        ));
        // Its children, directly under it.
        let children: Vec<&str> = spans
            .iter()
            .filter(|span| span["parentSpanId"] == execute["spanId"])
            .filter_map(|span| span["name"].as_str())
            .collect();
        for child in ["tool.validate", "policy.evaluate"] {
            assert!(
                children.contains(&child),
                "{child} under {execute}: {children:?}"
            );
        }
        let remote = text(get("tool.source")).as_deref() == Some("mcp");
        assert_eq!(
            children.contains(&"mcp.request"),
            remote,
            "mcp.request under an MCP call's tool.execute alone: {children:?}"
        );
    }
    seen.sort();
    let owned = |name: &str, source: &str, class: &str, status: &str, code: Option<&str>, cut| {
        (
            name.to_owned(),
            source.to_owned(),
            class.to_owned(),
            status.to_owned(),
            code.map(str::to_owned),
            cut,
        )
    };
    assert_eq!(
        seen,
        [
            owned(
                "demo.echo",
                "builtin",
                "read_only",
                "succeeded",
                None,
                false
            ),
            owned("demo.echo", "builtin", "read_only", "succeeded", None, true),
            owned(
                "demo.keyed_write",
                "builtin",
                "conditionally_idempotent",
                "denied",
                Some("policy.rule.denied"),
                false
            ),
            owned(
                "mcp.reads.echo",
                "mcp",
                "read_only",
                "succeeded",
                None,
                false
            ),
        ]
    );
}
