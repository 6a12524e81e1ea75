//! Random and mutated input at every place hostile bytes arrive: the
//! bridge's and the control API's request parsers (over their real sockets,
//! against a real `toolgate serve`), the canonical form, and the
//! configuration loader. Each must end in a structured answer (an HTTP
//! error in the one shape, a typed error) with the process alive.

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};
use serde_json::{Value, json};
use toolgate::config::Config;
use toolgate::domain::canonicalize;
use uuid::Uuid;

use crate::serve::{Served, sha256};

/// A deterministic runner: CI sees the same cases every run.
fn runner(cases: u32) -> TestRunner {
    TestRunner::new_with_rng(
        RunnerConfig {
            cases,
            failure_persistence: None,
            ..RunnerConfig::default()
        },
        proptest::test_runner::TestRng::deterministic_rng(
            proptest::test_runner::RngAlgorithm::ChaCha,
        ),
    )
}

/// A request as bytes: a well-formed one, then mutated.
#[derive(Debug, Clone)]
enum Mutation {
    /// Flip the byte at (a fraction of) the length.
    Flip(f64, u8),
    /// Insert bytes at a point.
    Insert(f64, Vec<u8>),
    /// Cut the request at a point.
    Truncate(f64),
    /// Replace everything with random bytes.
    Replace(Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (0.0..1.0f64, any::<u8>()).prop_map(|(at, byte)| Mutation::Flip(at, byte)),
        (0.0..1.0f64, prop::collection::vec(any::<u8>(), 1..64))
            .prop_map(|(at, bytes)| Mutation::Insert(at, bytes)),
        (0.0..1.0f64).prop_map(Mutation::Truncate),
        prop::collection::vec(any::<u8>(), 0..2048).prop_map(Mutation::Replace),
    ]
}

fn apply(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for mutation in mutations {
        let at = |fraction: f64, len: usize| ((len as f64) * fraction) as usize;
        match mutation {
            Mutation::Flip(fraction, byte) => {
                let index = at(*fraction, bytes.len());
                if let Some(slot) = bytes.get_mut(index) {
                    *slot ^= byte | 1;
                }
            }
            Mutation::Insert(fraction, inserted) => {
                let index = at(*fraction, bytes.len()).min(bytes.len());
                bytes.splice(index..index, inserted.iter().copied());
            }
            Mutation::Truncate(fraction) => bytes.truncate(at(*fraction, bytes.len())),
            Mutation::Replace(random) => bytes = random.clone(),
        }
    }
    bytes
}

fn request(path: &str, headers: &[(&str, &str)], body: &str) -> Vec<u8> {
    let mut text = format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\n"
    );
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    text.into_bytes()
}

/// Sends `bytes` and reads whatever comes back; checks it is either no
/// answer at all (the connection closed on unparseable HTTP) or an HTTP
/// answer whose JSON error, if any, has the one shape.
fn exchange(socket: &Path, bytes: &[u8]) -> Result<(), TestCaseError> {
    let mut stream = UnixStream::connect(socket)
        .map_err(|error| TestCaseError::fail(format!("connect: {error}")))?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let _ = stream.write_all(bytes);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    if answer.is_empty() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&answer);
    prop_assert!(text.starts_with("HTTP/1.1 "), "not HTTP: {text:.200}");
    let status: u16 = text[9..12].parse().unwrap_or(0);
    prop_assert!((200..600).contains(&status), "{text:.200}");
    let Some(split) = text.find("\r\n\r\n") else {
        return Ok(());
    };
    // The first answer only: leftover bytes may have been a second request.
    let length = text[..split]
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())
                .flatten()
        })
        .unwrap_or(text.len() - split - 4);
    let body = &text[split + 4..(split + 4 + length).min(text.len())];
    if status >= 400 && !body.is_empty() {
        let parsed: Value = serde_json::from_str(body)
            .map_err(|_| TestCaseError::fail(format!("an error that is not JSON: {body:.200}")))?;
        prop_assert!(
            parsed["error"]["code"].is_string() && parsed["error"]["message"].is_string(),
            "not the error shape: {body:.200}"
        );
    }
    Ok(())
}

fn alive(served: &Served) -> Result<(), TestCaseError> {
    let (status, _) = served.get("/healthz");
    prop_assert_eq!(status, 200, "toolgate stopped answering");
    Ok(())
}

/// Mutated and random requests on the bridge socket and the control socket
/// of one real `serve`: every one gets a structured answer (or a closed
/// connection), and `/healthz` answers after each.
#[test]
fn hostile_bytes_at_both_edges_get_structured_answers_and_serve_stays_up() {
    let served = Served::here().start_configured(
        "[limits]\nrequest_header_timeout_seconds = 2\nrequest_body_timeout_seconds = 2\n",
    );
    let session = served.session();
    let run = Uuid::new_v4();
    let (_, socket, token) = served.turn(session, run, "fuzz", None);
    let authorization = format!("Bearer {token}");
    let bridge_call = request(
        "/v1/call",
        &[("Authorization", &authorization)],
        &json!({"call": "demo.echo", "arguments": {"text": "fuzz"}}).to_string(),
    );
    let bodies = [
        (
            "/v1/sessions",
            json!({"session_id": Uuid::new_v4(), "tenant_id": "fuzz",
                   "principal": {"id": "u", "scopes": ["demo.use"]}, "agent": {"tools": ["demo.*"]}}),
        ),
        (
            "/v1/calls",
            json!({"session_id": session, "run_id": run, "step_number": 1, "origin_trust": "user",
                   "calls": [{"call_id": "f", "name": "demo.echo", "arguments": {"text": "x"}}]}),
        ),
        (
            "/v1/turns",
            json!({"session_id": session, "run_id": run, "step_number": 2,
                   "script_sha256": sha256("fuzz"), "origin_trust": "user"}),
        ),
        (
            "/v1/tenants/fuzz/mcp-servers/remote",
            json!({"endpoint": "https://mcp.example.com/mcp"}),
        ),
    ];
    let control: Vec<Vec<u8>> = bodies
        .iter()
        .map(|(path, body)| request(path, &[], &body.to_string()))
        .collect();
    let strategy = (
        any::<bool>(),
        0..control.len(),
        prop::collection::vec(mutation(), 1..4),
    );
    runner(400)
        .run(&strategy, |(on_bridge, which, mutations)| {
            if on_bridge {
                exchange(&socket, &apply(bridge_call.clone(), &mutations))?;
            } else {
                exchange(&served.socket, &apply(control[which].clone(), &mutations))?;
            }
            alive(&served)
        })
        .unwrap();
}

/// The canonical form of any document JSON can carry either exists or is a
/// typed refusal; random bytes that parse as JSON never panic it.
#[test]
fn the_canonical_form_never_panics_on_any_document() {
    let bytes = prop::collection::vec(any::<u8>(), 0..512);
    let text = "[ -~\u{300}-\u{36f}\u{958}]{0,256}";
    runner(2000)
        .run(&(bytes, text), |(bytes, text)| {
            for candidate in [bytes, text.into_bytes()] {
                if let Ok(value) = serde_json::from_slice::<Value>(&candidate) {
                    let _ = canonicalize(value);
                }
                let _ = canonicalize(Value::String(
                    String::from_utf8_lossy(&candidate).into_owned(),
                ));
            }
            Ok(())
        })
        .unwrap();
    // Deeper than the limit (which the JSON parser's own also bounds):
    // refused with its path, not recursed into.
    let mut deep = json!(0);
    for _ in 0..300 {
        deep = json!([deep]);
    }
    assert!(canonicalize(deep).is_err());
}

/// The configuration loader answers every file with a configuration or a
/// list of errors with field paths; mutated versions of the example and
/// random text never panic it.
#[test]
fn the_config_loader_never_panics_on_any_file() {
    let example =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("config/toolgate.toml")).unwrap();
    let strategy = prop::collection::vec(mutation(), 1..6);
    runner(1000)
        .run(&strategy, |mutations| {
            let bytes = apply(example.clone(), &mutations);
            let text = String::from_utf8_lossy(&bytes);
            match Config::parse(&text) {
                Ok(config) => {
                    if let Err(errors) = config.validate() {
                        prop_assert!(!errors.0.is_empty());
                        for error in &errors.0 {
                            prop_assert!(!error.path.is_empty());
                        }
                    }
                }
                Err(errors) => prop_assert!(!errors.0.is_empty()),
            }
            Ok(())
        })
        .unwrap();
}
