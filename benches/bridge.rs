//! Load driver for the orchestration bridge: a real `toolgate serve` on
//! PostgreSQL, and N concurrent scripts (1, 8, 32), each calling `demo.echo`
//! one call at a time over its turn's socket, as the Python client does (a
//! connection per call). A script opens a new turn every 64 calls, the
//! per-turn cap. Prints calls per second, p50 and p99 latency and the serve
//! process's CPU time per call.
//!
//! `DATABASE_URL=postgres://… cargo bench --bench bridge`
//! (`TOOLGATE_BENCH_SECONDS` sets each run's length, default 10.)

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

fn http(
    socket: &Path,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, Vec<u8>) {
    let mut stream = UnixStream::connect(socket).expect("socket connects");
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: toolgate\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(token) = token {
        request.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).expect("writes");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).expect("reads");
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response");
    let status = String::from_utf8_lossy(&response[..split])
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, response[split + 4..].to_vec())
}

/// CPU seconds (user + system) of process `pid`.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// One script: turns of 64 sequential calls until `stop`.
fn script(control: PathBuf, session: Uuid, stop: Arc<AtomicBool>) -> Vec<Duration> {
    let mut latencies = Vec::new();
    let step = 1;
    while !stop.load(Ordering::Relaxed) {
        // A run per turn, so the loop breaker never sees a repeated call.
        let run = Uuid::new_v4();
        let open = json!({"session_id": session, "run_id": run, "step_number": step,
                          "origin_trust": "user",
                          "script_sha256": toolgate::domain::sha256_hex(format!("{run}{step}").as_bytes())});
        let (status, body) = http(&control, "POST", "/v1/turns", None, &open.to_string());
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let turn: Value = serde_json::from_slice(&body).expect("turn");
        let socket = PathBuf::from(turn["socket_path"].as_str().expect("socket"));
        let token = turn["token"].as_str().expect("token").to_owned();
        for i in 0..64 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let call = json!({"call": "demo.echo", "arguments": {"text": format!("hello {i}")}})
                .to_string();
            let started = Instant::now();
            let (status, body) = http(&socket, "POST", "/v1/call", Some(&token), &call);
            assert!(
                status == 200 && body.starts_with(br#"{"status":"succeeded""#),
                "{status} {}",
                String::from_utf8_lossy(&body)
            );
            latencies.push(started.elapsed());
        }
        let id = turn["turn_id"].as_str().expect("id");
        http(&control, "DELETE", &format!("/v1/turns/{id}"), None, "");
    }
    latencies
}

fn main() {
    let Ok(admin_url) = std::env::var("DATABASE_URL") else {
        println!("bridge bench: DATABASE_URL is unset; nothing to measure");
        return;
    };
    let seconds: u64 = std::env::var("TOOLGATE_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let schema = format!("bench_bridge_{}", Uuid::new_v4().simple());
    let psql = |sql: &str| {
        let status = Command::new("psql")
            .args([admin_url.as_str(), "-q", "-c", sql])
            .status()
            .expect("psql runs");
        assert!(status.success(), "{sql}");
    };
    psql(&format!("CREATE SCHEMA {schema}"));
    let folder = tempfile::tempdir().expect("folder");
    let root = folder.path();
    let separator = if admin_url.contains('?') { '&' } else { '?' };
    let store_url = format!("{admin_url}{separator}options=-c%20search_path%3D{schema}");
    std::fs::write(
        root.join("policy.toml"),
        "[[rules]]\ntools = [\"demo.echo\"]\ndecision = \"allow\"\n",
    )
    .expect("policy");
    std::fs::write(
        root.join("toolgate.toml"),
        format!(
            "[control]\nsocket = \"run/control.sock\"\n[bridge]\ndirectory = \"run/turns\"\n\
             [store]\nurl = \"{store_url}\"\n[artifacts]\ndirectory = \"state/artifacts\"\n\
             [policy]\nfile = \"policy.toml\"\n"
        ),
    )
    .expect("config");
    let toolgate = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/toolgate");
    let toolgate = std::env::var("CARGO_TARGET_DIR")
        .map(|dir| PathBuf::from(dir).join("release/toolgate"))
        .unwrap_or(toolgate);
    let status = Command::new("cargo")
        .args(["build", "--release", "--bin", "toolgate"])
        .status()
        .expect("cargo builds");
    assert!(status.success());
    let child = Command::new(&toolgate)
        .args(["serve", "--migrate", "--config"])
        .arg(root.join("toolgate.toml"))
        .env_remove("TOOLGATE_STORE_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("toolgate serve starts");
    // Stopped, and its schema dropped, however the run ends.
    let served = Served {
        child,
        admin_url: admin_url.clone(),
        schema: schema.clone(),
    };
    let child = &served.child;
    let control = root.join("run/control.sock");
    let started = Instant::now();
    while UnixStream::connect(&control).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "serve did not listen"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let session = Uuid::new_v4();
    let open = json!({"session_id": session, "tenant_id": "bench",
                      "principal": {"id": "bench", "scopes": ["demo.use"]},
                      "agent": {"tools": ["demo.echo"]}});
    let (status, body) = http(&control, "POST", "/v1/sessions", None, &open.to_string());
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));

    println!(
        "{:>7} | {:>9} | {:>9} | {:>9} | {:>13}",
        "scripts", "calls/s", "p50", "p99", "toolgate cpu"
    );
    for scripts in [1usize, 8, 32] {
        let stop = Arc::new(AtomicBool::new(false));
        let cpu_before = cpu_seconds(child.id());
        let begun = Instant::now();
        let handles: Vec<_> = (0..scripts)
            .map(|_| {
                let (control, stop) = (control.clone(), stop.clone());
                std::thread::spawn(move || script(control, session, stop))
            })
            .collect();
        std::thread::sleep(Duration::from_secs(seconds));
        stop.store(true, Ordering::Relaxed);
        let mut latencies: Vec<Duration> = handles
            .into_iter()
            .flat_map(|handle| handle.join().expect("script"))
            .collect();
        let elapsed = begun.elapsed().as_secs_f64();
        let cpu = cpu_seconds(child.id()) - cpu_before;
        latencies.sort();
        let calls = latencies.len().max(1);
        println!(
            "{:>7} | {:>9.0} | {:>9.2?} | {:>9.2?} | {:>13.2?}",
            scripts,
            calls as f64 / elapsed,
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99),
            Duration::from_secs_f64(cpu / calls as f64),
        );
    }
    drop(served);
}

struct Served {
    child: std::process::Child,
    admin_url: String,
    schema: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
        let _ = Command::new("psql")
            .args([
                self.admin_url.as_str(),
                "-q",
                "-c",
                &format!("DROP SCHEMA {} CASCADE", self.schema),
            ])
            .stderr(Stdio::null())
            .status();
    }
}
