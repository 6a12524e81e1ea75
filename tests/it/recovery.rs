//! Recovery a user can feel, against a real `toolgate serve` killed with
//! SIGKILL mid-call and started again on the same node; and output bounded
//! before it is read.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

use crate::security::probe_server;
use crate::serve::{Served, TENANT, json_of};

/// The rows of a run, by call id.
fn rows(served: &Served, run: Uuid) -> Vec<Value> {
    let (status, body) = served.get(&format!("/v1/runs/{run}/invocations?tenant_id={TENANT}"));
    assert_eq!(status, 200);
    json_of(&body)["invocations"].as_array().unwrap().clone()
}

fn row(served: &Served, run: Uuid, call_id: &str) -> Option<Value> {
    rows(served, run)
        .into_iter()
        .find(|row| row["call_id"] == call_id)
}

/// One call in a batch of its own.
fn call(
    served: &Served,
    session: Uuid,
    run: Uuid,
    step: u32,
    call_id: &str,
    name: &str,
    arguments: Value,
) -> Value {
    let (status, body) = served.post(
        "/v1/calls",
        &json!({"session_id": session, "run_id": run, "step_number": step, "origin_trust": "user",
                "calls": [{"call_id": call_id, "name": name, "arguments": arguments}]}),
    );
    assert_eq!(status, 200, "{body}");
    body["results"][0].clone()
}

/// SIGKILL while an MCP read and an MCP write are in flight, then a start on
/// the same node. The node's earlier workers are declared dead at once, so
/// nothing waits out a lease; the read is re-executed through its server
/// (prepared for recovery, no session needed) and the write, its watermark
/// set, becomes UNCERTAIN. A resubmission of the write settles in under two
/// seconds of the restart.
#[test]
fn a_restarted_node_recovers_its_own_calls_at_once_mcp_included() {
    let mut served = Served::start();
    let session = served.session();
    let run = Uuid::new_v4();
    let in_flight: Vec<_> = [
        (1, "read", "mcp.reads.sleep", 2.0),
        (2, "write", "mcp.writes.sleep", 30.0),
    ]
    .into_iter()
    .map(|(step, call_id, name, seconds)| {
        let socket = served.socket.clone();
        let body = json!({"session_id": session, "run_id": run, "step_number": step,
                          "origin_trust": "user",
                          "calls": [{"call_id": call_id, "name": name, "arguments": {"seconds": seconds}}]});
        std::thread::spawn(move || {
            // The answer never comes: the process is killed under it.
            use std::io::{Read as _, Write as _};
            let body = body.to_string();
            let mut stream = std::os::unix::net::UnixStream::connect(&socket).unwrap();
            let _ = write!(
                stream,
                "POST /v1/calls HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.read_to_end(&mut Vec::new());
        })
    })
    .collect();
    let started = Instant::now();
    loop {
        let running = rows(&served, run)
            .iter()
            .filter(|row| row["status"] == "running")
            .count();
        if running == 2 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{:?}",
            rows(&served, run)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    served.kill();
    for thread in in_flight {
        let _ = thread.join();
    }
    served.start_again();
    let restarted = Instant::now();
    // Resubmitted as a runtime would: a call still in flight answers
    // `tool.concurrency_conflict` (retryable), and is asked again.
    let settled = |step: u32, call_id: &str, name: &str, arguments: Value| loop {
        let answer = call(
            &served,
            session,
            run,
            step,
            call_id,
            name,
            arguments.clone(),
        );
        if answer["outcome"]["reason_code"] != "tool.concurrency_conflict" {
            return answer;
        }
        assert!(restarted.elapsed() < Duration::from_secs(30), "{answer}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let write = settled(2, "write", "mcp.writes.sleep", json!({"seconds": 30.0}));
    assert!(
        restarted.elapsed() < Duration::from_secs(2),
        "the write's resubmission took {:?} to settle",
        restarted.elapsed()
    );
    assert_eq!(write["outcome"]["status"], "uncertain", "{write}");
    let read = settled(1, "read", "mcp.reads.sleep", json!({"seconds": 2.0}));
    assert_eq!(read["outcome"]["status"], "succeeded", "{read}");
    let read_row = row(&served, run, "read").unwrap();
    assert_eq!(read_row["status"], "succeeded", "{read_row}");
    // It ran again: a second claim of the row.
    assert!(
        read_row["attempt_number"].as_i64().unwrap() >= 2,
        "{read_row}"
    );
    assert_eq!(row(&served, run, "write").unwrap()["status"], "uncertain");
}

/// Two processes never hold one node: a second `serve` on the same state
/// folder refuses to start.
#[test]
fn one_process_at_a_time_is_a_node() {
    let served = Served::start();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["serve", "--config"])
        .arg(served.folder.path().join("toolgate.toml"))
        .env(
            "TOOLGATE_CONTROL_SOCKET",
            served.folder.path().join("other.sock"),
        )
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("another toolgate runs as this node"),
        "{stderr}"
    );
}

/// serve's peak resident memory, from its `/proc` status.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|line| line.starts_with("VmHWM:"))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|kib| kib.parse().ok())
        .unwrap()
}

/// A server that writes a 50 MiB result line (its tools may write 64 KiB):
/// the call ends `output_too_large` well within two seconds instead of
/// waiting out its timeout, toolgate's memory grows by far less than the
/// line, and the next call redials. Images count toward the limit too.
#[test]
fn output_is_bounded_before_it_is_read() {
    let served = Served::start_configured(&probe_server(None));
    let pid = served.pid().unwrap();
    let session = Uuid::new_v4();
    let (status, body) = served.post(
        "/v1/sessions",
        &json!({"session_id": session, "tenant_id": TENANT,
                "principal": {"id": "u", "scopes": ["mcp.probe.use"]},
                "agent": {"tools": ["mcp.probe.*"]}}),
    );
    assert_eq!(status, 200, "{body}");
    let run = Uuid::new_v4();
    let warm = call(
        &served,
        session,
        run,
        1,
        "warm",
        "mcp.probe.meta",
        json!({}),
    );
    assert_eq!(warm["outcome"]["status"], "succeeded", "{warm}");
    let before = peak_rss_kib(pid);
    let started = Instant::now();
    let huge = call(
        &served,
        session,
        run,
        2,
        "huge",
        "mcp.probe.huge",
        json!({"bytes": 50 << 20}),
    );
    let took = started.elapsed();
    assert_eq!(
        huge["outcome"]["reason_code"], "tool.output_too_large",
        "{huge}"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    // The runaway's head, up to the ceiling, is kept as an artifact the
    // operator reads, and referenced from what the model was told.
    let artifact = huge["content"]
        .as_array()
        .and_then(|parts| parts.iter().find(|part| part["type"] == "artifact"))
        .and_then(|part| part["artifact_id"].as_str())
        .unwrap_or_else(|| panic!("the runaway's head is kept: {huge}"))
        .to_owned();
    let (status, head) = served.get(&format!("/v1/artifacts/{artifact}?tenant_id={TENANT}"));
    assert_eq!(status, 200);
    assert!(
        head.len() > 64 << 10,
        "the head, up to the ceiling: {}",
        head.len()
    );
    assert!(
        head.len() < 1 << 20,
        "never the whole runaway: {}",
        head.len()
    );
    assert!(
        String::from_utf8_lossy(&head[..200]).contains("jsonrpc"),
        "the answer as the server sent it"
    );
    let grown = peak_rss_kib(pid).saturating_sub(before);
    assert!(grown < 64 * 1024, "serve's peak memory grew by {grown} KiB");
    let after = call(
        &served,
        session,
        run,
        3,
        "after",
        "mcp.probe.meta",
        json!({}),
    );
    assert_eq!(after["outcome"]["status"], "succeeded", "{after}");

    for (step, bytes, expected) in [
        (4, 15 << 20, "failed"),
        (5, 250_000, "failed"),
        (6, 30_000, "succeeded"),
    ] {
        let image = call(
            &served,
            session,
            run,
            step,
            &format!("image-{step}"),
            "mcp.probe.image",
            json!({"bytes": bytes}),
        );
        assert_eq!(image["outcome"]["status"], expected, "{bytes}: {image}");
        if expected == "failed" {
            assert_eq!(image["outcome"]["reason_code"], "tool.output_too_large");
        } else {
            // The image the tool stored is recorded with the row, and its
            // owner (only) reads it back in full.
            let part = image["content"]
                .as_array()
                .and_then(|parts| parts.iter().find(|part| part["type"] == "artifact"))
                .unwrap_or_else(|| panic!("{image}"));
            let id = part["artifact_id"].as_str().unwrap();
            let (status, head, body) = crate::serve::http(
                &served.socket,
                "GET",
                &format!("/v1/artifacts/{id}?tenant_id={TENANT}"),
                &[],
                None,
            );
            assert_eq!(status, 200);
            assert_eq!(body.len() as u64, part["bytes"].as_u64().unwrap());
            // The image as its bytes (the scripted server's are zeros), with
            // its media type: not the JSON block it came in.
            assert_eq!(body.len(), 30_000, "{head}");
            assert!(body.iter().all(|byte| *byte == 0));
            assert!(
                head.to_ascii_lowercase()
                    .contains("content-type: image/png"),
                "{head}"
            );
            let (status, _) = served.get(&format!("/v1/artifacts/{id}?tenant_id=tenant-other"));
            assert_eq!(status, 404);
        }
    }
    let recorded = row(&served, run, "image-6").unwrap();
    assert!(
        recorded["output_bytes"].as_i64().unwrap() >= 30_000,
        "{recorded}"
    );
}
