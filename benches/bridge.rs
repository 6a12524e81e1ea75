//! Load driver for the orchestration bridge, against a real `toolgate
//! serve` (release build).
//!
//! 1. The floor and the overhead, side by side in one run: the MCP reference
//!    server's `echo` over stdio called directly by a raw JSON-RPC client,
//!    beside the same server's `echo` called through a script's turn socket
//!    (one kept-alive connection per turn, as the clients keep it), classified
//!    read-only and non-idempotent, on the embedded SQLite store and (with
//!    `DATABASE_URL`) on PostgreSQL; beside them the builtin `demo.echo`
//!    through the same socket, which separates the store's and the bridge's
//!    share from the MCP step's. Blocks of 50 calls interleave the paths,
//!    and ten disk flushes between them (a 16 KiB write over allocated
//!    blocks and an `fdatasync`, beside the store: a flushed commit's
//!    floor); printed: p50, p99, the added p50 over the floor (the MCP
//!    paths; the non-idempotent one also over its three flushed commits)
//!    and serve's CPU per call.
//! 2. With `DATABASE_URL`: N concurrent scripts (1, 8, 32) calling a read
//!    (`demo.echo`) and a non-idempotent write (`demo.external_write`, three
//!    flushed commits), a new turn every 64 calls, on SQLite and on
//!    PostgreSQL; calls per second, p50, p99 and serve's CPU per call.
//!    `TOOLGATE_BENCH_FSYNCS=1` counts serve's fsyncs per write under
//!    `strace -f -y` as well (slower runs, kept apart), the store's apart
//!    from the tool's own (`demo.external_write` syncs the line it adds).
//!
//! `scripts/test` installs the reference server (`TOOLGATE_MCP_SERVERS`).
//! `[DATABASE_URL=postgres://…] cargo bench --bench bridge`
//! (`TOOLGATE_BENCH_CALLS` sets part 1's calls per path, default 1000;
//! `TOOLGATE_BENCH_SECONDS` part 2's run length, default 10, 0 to skip it;
//! `TOOLGATE_BENCH_BINARY` measures another build of `toolgate` instead;
//! `TOOLGATE_BENCH_PATH` keeps one of part 1's paths, by its tool's name,
//! and `TOOLGATE_BENCH_STORE` (`sqlite` or `postgres`) one of its stores,
//! to profile it alone.)

// These time and pace real processes from outside them: the system's clock
// is the one they share (clippy.toml keeps it out of `src`).
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
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

/// A kept-alive connection to a turn's socket, as the clients keep one per
/// turn.
struct Kept {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Kept {
    fn connect(socket: &Path) -> Kept {
        let writer = UnixStream::connect(socket).expect("socket connects");
        let reader = BufReader::new(writer.try_clone().expect("a second handle"));
        Kept { reader, writer }
    }

    /// One request on the kept connection; the status and the body.
    fn request(&mut self, path: &str, token: &str, body: &str) -> (u16, Vec<u8>) {
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: toolgate\r\nContent-Type: application/json\r\n\
             Authorization: Bearer {token}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.writer.write_all(request.as_bytes()).expect("writes");
        let mut status = 0;
        let mut length = 0;
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                self.reader.read_line(&mut line).expect("reads") > 0,
                "closed"
            );
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some(code) = header.strip_prefix("HTTP/1.1 ") {
                status = code[..3].parse().unwrap_or(0);
            } else if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().expect("a length");
            }
        }
        let mut body = vec![0; length];
        self.reader.read_exact(&mut body).expect("a body");
        (status, body)
    }
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
/// One script calling `tool` until told to stop: a read (`demo.echo`) or a
/// non-idempotent write (`demo.external_write`, whose three commits are
/// flushed).
fn script(control: PathBuf, session: Uuid, tool: &str, stop: Arc<AtomicBool>) -> Vec<Duration> {
    let mut turn = Turn::new(control, session);
    let mut latencies = Vec::new();
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let arguments = if tool == "demo.echo" {
            json!({"text": format!("hello {i}")})
        } else {
            json!({"line": format!("write {i}")})
        };
        latencies.push(turn.call(tool, arguments));
    }
    turn.close();
    latencies
}

/// Part 2 on one store: reads and non-idempotent writes from 1, 8 and 32
/// scripts at once. With `TOOLGATE_BENCH_FSYNCS=1`, the writes are run once
/// more under `strace -f -y`, counting serve's fsyncs per call (strace slows
/// serve; those runs are not the throughput figures).
fn concurrency(toolgate: &Path, store: &str, url: &str, seconds: u64) {
    let folder = tempfile::tempdir().expect("folder");
    let root = folder.path();
    let served = Stopped(serve(
        toolgate,
        root,
        url,
        "",
        "[[rules]]\ntools = [\"demo.echo\", \"demo.external_write\"]\ndecision = \"allow\"\n",
    ));
    let child = &served.0;
    let control = root.join("run/control.sock");
    let session = open_session(
        &control,
        &["demo.use"],
        &["demo.echo", "demo.external_write"],
    );
    let run = |tool: &'static str, scripts: usize| {
        let stop = Arc::new(AtomicBool::new(false));
        let cpu_before = cpu_seconds(child.id());
        let begun = Instant::now();
        let handles: Vec<_> = (0..scripts)
            .map(|_| {
                let (control, stop) = (control.clone(), stop.clone());
                std::thread::spawn(move || script(control, session, tool, stop))
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
        (latencies, elapsed, cpu)
    };
    for tool in ["demo.echo", "demo.external_write"] {
        for scripts in [1usize, 8, 32] {
            let (latencies, elapsed, cpu) = run(tool, scripts);
            let calls = latencies.len().max(1);
            println!(
                "{:>8} | {:>19} | {:>7} | {:>9.0} | {:>9.2?} | {:>9.2?} | {:>13.2?}",
                store,
                tool,
                scripts,
                calls as f64 / elapsed,
                percentile(&latencies, 0.5),
                percentile(&latencies, 0.99),
                Duration::from_secs_f64(cpu / calls as f64),
            );
        }
    }
    if std::env::var("TOOLGATE_BENCH_FSYNCS").is_ok_and(|value| value == "1") {
        for scripts in [1usize, 8, 32] {
            let trace = tempfile::NamedTempFile::new().expect("strace output");
            // `-y` names each call's file: the store's fsyncs are told from
            // the tool's own (`demo.external_write` syncs its line).
            let mut strace = Command::new("strace")
                .args(["-f", "-y", "-e", "trace=fsync,fdatasync", "-o"])
                .arg(trace.path())
                .args(["-p", &child.id().to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("strace starts (TOOLGATE_BENCH_FSYNCS needs it)");
            std::thread::sleep(Duration::from_millis(500));
            let (latencies, _, _) = run("demo.external_write", scripts);
            let _ = Command::new("kill")
                .args(["-INT", &strace.id().to_string()])
                .status();
            let _ = strace.wait();
            let text = std::fs::read_to_string(trace.path()).unwrap_or_default();
            let (store_syncs, other_syncs) = count_syncs(&text);
            let calls = latencies.len().max(1) as f64;
            println!(
                "{:>8} | fsyncs per non-idempotent call at {:>2} scripts (under strace): \
                 the store's {:.2}, the tool's own {:.2} ({} and {} in {} calls)",
                store,
                scripts,
                store_syncs as f64 / calls,
                other_syncs as f64 / calls,
                store_syncs,
                other_syncs,
                latencies.len()
            );
        }
    }
    drop(served);
}

/// The fsyncs in `strace -f -y` output: (the store's, any other file's).
/// The store's are those of its database and its log (`toolgate.db`,
/// `toolgate.db-wal`). A call another thread's interrupted is printed
/// twice, begun (`<unfinished ...>`, with its file) and `resumed`: it is
/// counted by its beginning.
fn count_syncs(trace: &str) -> (u64, u64) {
    let mut counts = (0, 0);
    for line in trace.lines() {
        let Some(call) = line
            .split_once(' ')
            .map(|(_, call)| call.trim_start())
            .filter(|call| call.starts_with("fsync(") || call.starts_with("fdatasync("))
        else {
            continue;
        };
        if call.contains("toolgate.db") {
            counts.0 += 1;
        } else {
            counts.1 += 1;
        }
    }
    counts
}

/// One flushed commit's floor on the disk under `folder`: a 16 KiB write
/// over a file's allocated blocks (as the log is written after it starts
/// over) and an `fdatasync`, what a `synchronous = FULL` commit does at the
/// least.
struct DiskFlush {
    file: std::fs::File,
    offset: u64,
}

impl DiskFlush {
    const SPAN: u64 = 4 << 20;

    fn new(folder: &Path) -> DiskFlush {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(folder.join("flush-floor"))
            .expect("the floor's file");
        std::os::unix::fs::FileExt::write_all_at(&file, &vec![1u8; Self::SPAN as usize], 0)
            .expect("the floor's file is written");
        file.sync_all().expect("the floor's file is synced");
        DiskFlush { file, offset: 0 }
    }

    fn flush(&mut self) -> Duration {
        let page = [7u8; 16 << 10];
        let begun = Instant::now();
        std::os::unix::fs::FileExt::write_all_at(&self.file, &page, self.offset)
            .expect("the floor's write");
        self.file.sync_data().expect("the floor's fdatasync");
        self.offset = (self.offset + page.len() as u64) % Self::SPAN;
        begun.elapsed()
    }
}

/// A raw JSON-RPC client on the reference server's stdio: the floor.
struct Direct {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next: u64,
}

impl Direct {
    fn start(node: &Path, script: &Path) -> Direct {
        let mut child = Command::new(node)
            .arg(script)
            .arg("stdio")
            .env("NODE_ENV", "production")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the reference server starts");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut direct = Direct {
            child,
            stdin,
            stdout,
            next: 0,
        };
        direct.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "floor", "version": "1"}}),
        );
        direct.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        direct
    }

    fn send(&mut self, message: &Value) {
        let mut line = message.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).expect("writes");
        self.stdin.flush().expect("flushes");
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                self.stdout.read_line(&mut line).expect("reads") > 0,
                "server ended"
            );
            let message: Value = serde_json::from_str(&line).expect("JSON-RPC");
            if message["id"] == json!(id) {
                return message;
            }
        }
    }

    fn echo(&mut self, i: usize) -> Duration {
        let started = Instant::now();
        let answer = self.request(
            "tools/call",
            json!({"name": "echo", "arguments": {"message": format!("hello {i}")}}),
        );
        let elapsed = started.elapsed();
        assert!(answer["result"].is_object(), "{answer}");
        elapsed
    }
}

impl Drop for Direct {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A script's turn: calls over its socket, a new turn (and run, so the
/// loop breaker never sees a repeated call) every 64, the per-turn cap.
struct Turn {
    control: PathBuf,
    session: Uuid,
    open: Option<OpenTurn>,
}

struct OpenTurn {
    id: String,
    connection: Kept,
    token: String,
    used: usize,
}

impl Turn {
    fn new(control: PathBuf, session: Uuid) -> Turn {
        Turn {
            control,
            session,
            open: None,
        }
    }

    fn open(control: &Path, session: Uuid) -> OpenTurn {
        let run = Uuid::new_v4();
        let open = json!({"session_id": session, "run_id": run, "step_number": 1,
                          "origin_trust": "user",
                          "script_sha256": toolgate::domain::sha256_hex(run.as_bytes())});
        let (status, body) = http(control, "POST", "/v1/turns", None, &open.to_string());
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let turn: Value = serde_json::from_slice(&body).expect("turn");
        OpenTurn {
            id: turn["turn_id"].as_str().expect("id").to_owned(),
            connection: Kept::connect(Path::new(turn["socket_path"].as_str().expect("socket"))),
            token: turn["token"].as_str().expect("token").to_owned(),
            used: 0,
        }
    }

    /// One call of `tool` with `arguments`; its latency.
    fn call(&mut self, tool: &str, arguments: Value) -> Duration {
        if self.open.as_ref().is_some_and(|open| open.used == 64) {
            self.close();
        }
        let (control, session) = (&self.control, self.session);
        let open = self
            .open
            .get_or_insert_with(|| Turn::open(control, session));
        open.used += 1;
        let call = json!({"call": tool, "arguments": arguments}).to_string();
        let started = Instant::now();
        let (status, body) = open.connection.request("/v1/call", &open.token, &call);
        let elapsed = started.elapsed();
        assert!(
            status == 200 && body.starts_with(br#"{"status":"succeeded""#),
            "{status} {}",
            String::from_utf8_lossy(&body)
        );
        elapsed
    }

    fn close(&mut self) {
        if let Some(open) = self.open.take() {
            http(
                &self.control,
                "DELETE",
                &format!("/v1/turns/{}", open.id),
                None,
                "",
            );
        }
    }
}

/// The binary under test: `TOOLGATE_BENCH_BINARY` (another build, to
/// compare in one session), else the release build, built now.
fn toolgate() -> PathBuf {
    if let Some(binary) = std::env::var_os("TOOLGATE_BENCH_BINARY") {
        return PathBuf::from(binary);
    }
    let status = Command::new("cargo")
        .args(["build", "--release", "--bin", "toolgate"])
        .status()
        .expect("cargo builds");
    assert!(status.success());
    std::env::var("CARGO_TARGET_DIR")
        .map(|dir| PathBuf::from(dir).join("release/toolgate"))
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/toolgate"))
}

/// Starts `serve` on `store_url` in `root` with `extra` configuration and
/// `rules`; waits for its control socket.
fn serve(toolgate: &Path, root: &Path, store_url: &str, extra: &str, rules: &str) -> Child {
    std::fs::write(root.join("policy.toml"), rules).expect("policy");
    std::fs::write(
        root.join("toolgate.toml"),
        format!(
            "[control]\nsocket = \"run/control.sock\"\n[bridge]\ndirectory = \"run/turns\"\n\
             [store]\nurl = \"{store_url}\"\n[artifacts]\ndirectory = \"state/artifacts\"\n\
             [policy]\nfile = \"policy.toml\"\n{extra}"
        ),
    )
    .expect("config");
    let child = Command::new(toolgate)
        .args(["serve", "--migrate", "--config"])
        .arg(root.join("toolgate.toml"))
        .env_remove("TOOLGATE_STORE_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("toolgate serve starts");
    let control = root.join("run/control.sock");
    let started = Instant::now();
    while UnixStream::connect(&control).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "serve did not listen"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

fn open_session(control: &Path, scopes: &[&str], tools: &[&str]) -> Uuid {
    let session = Uuid::new_v4();
    let open = json!({"session_id": session, "tenant_id": "bench",
                      "principal": {"id": "bench", "scopes": scopes},
                      "agent": {"tools": tools}});
    let (status, body) = http(control, "POST", "/v1/sessions", None, &open.to_string());
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    session
}

/// A stdio server block of the configuration: the reference server under
/// `server_id`, classified as `class`.
fn reference_server(server_id: &str, node: &Path, script: &Path, class: &str) -> String {
    let (side_effect, idempotency) = match class {
        "read_only" => ("none", "read_only"),
        _ => ("external_write", "non_idempotent"),
    };
    format!(
        "[[mcp.servers]]\nserver_id = \"{server_id}\"\ncommand = \"{}\"\nargs = [\"{}\", \"stdio\"]\n\
         env = {{ NODE_ENV = \"production\" }}\nside_effect = \"{side_effect}\"\nrisk = \"low\"\n\
         idempotency = \"{idempotency}\"\nrequired_scopes = [\"mcp.{server_id}.use\"]\n\
         timeout_seconds = 30\nmaximum_output_bytes = 65536\n\n",
        node.display(),
        script.display()
    )
}

/// Part 1 on one store: the floor, and the two classifications through
/// serve, interleaved in blocks; prints one row per path.
fn floor_and_overhead(toolgate: &Path, label: &str, store_url: &str, root: &Path, calls: usize) {
    let servers = PathBuf::from(
        std::env::var("TOOLGATE_MCP_SERVERS")
            .unwrap_or_else(|_| "/var/tmp/toolgate-mcp-servers".into()),
    );
    let script =
        servers.join("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        script.exists(),
        "the reference server is not installed at {}: run scripts/test once",
        script.display()
    );
    let node = std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|folder| folder.join("node"))
                .find(|candidate| candidate.is_file())
        })
        .expect("node is on PATH");
    let extra = format!(
        "[mcp]\nstate_directory = \"state/mcp\"\n\n{}{}",
        reference_server("ro", &node, &script, "read_only"),
        reference_server("ni", &node, &script, "non_idempotent"),
    );
    let child = serve(
        toolgate,
        root,
        store_url,
        &extra,
        "[[rules]]\ntools = [\"mcp.ro.echo\", \"mcp.ni.echo\", \"demo.echo\"]\ndecision = \"allow\"\n",
    );
    let served = Stopped(child);
    let control = root.join("run/control.sock");
    let session = open_session(
        &control,
        &["mcp.ro.use", "mcp.ni.use", "demo.use"],
        &["mcp.ro.echo", "mcp.ni.echo", "demo.echo"],
    );
    let mut direct = Direct::start(&node, &script);
    let mut turn = Turn::new(control.clone(), session);
    // Warm both paths first: connections, caches, the servers' JIT.
    for i in 0..100 {
        direct.echo(i);
        turn.call("mcp.ro.echo", json!({"message": format!("warm {i}")}));
        turn.call("mcp.ni.echo", json!({"message": format!("warm {i}")}));
        turn.call("demo.echo", json!({"text": format!("warm {i}")}));
    }
    let pid = served.0.id();
    let mut floor = Vec::new();
    // (tool, its argument, latencies, CPU seconds)
    let paths: [(&str, &str, Vec<Duration>, f64); 3] = [
        ("mcp.ro.echo", "message", Vec::new(), 0.0),
        ("mcp.ni.echo", "message", Vec::new(), 0.0),
        ("demo.echo", "text", Vec::new(), 0.0),
    ];
    // One path alone, to profile it (`TOOLGATE_BENCH_PATH=mcp.ro.echo`).
    let mut paths: Vec<_> = paths.into_iter().collect();
    if let Ok(only) = std::env::var("TOOLGATE_BENCH_PATH") {
        paths.retain(|(tool, ..)| *tool == only);
        assert!(
            !paths.is_empty(),
            "TOOLGATE_BENCH_PATH names none of the paths"
        );
    }
    const BLOCK: usize = 50;
    let mut disk = DiskFlush::new(root);
    let mut flushes = Vec::new();
    let mut i = 1000;
    while floor.len() < calls {
        for _ in 0..BLOCK {
            i += 1;
            floor.push(direct.echo(i));
        }
        for _ in 0..BLOCK / 5 {
            flushes.push(disk.flush());
        }
        for (tool, argument, latencies, cpu) in paths.iter_mut() {
            let before = cpu_seconds(pid);
            for _ in 0..BLOCK {
                i += 1;
                latencies.push(turn.call(tool, json!({*argument: format!("hello {i}")})));
            }
            *cpu += cpu_seconds(pid) - before;
        }
    }
    turn.close();
    floor.sort();
    let floor_p50 = percentile(&floor, 0.5);
    println!(
        "{label:>8} | {:>16} | {:>9.2?} | {:>9.2?} | {:>10} | {:>14}",
        "direct (floor)",
        floor_p50,
        percentile(&floor, 0.99),
        "",
        ""
    );
    flushes.sort();
    let flush_p50 = percentile(&flushes, 0.5);
    println!(
        "{label:>8} | {:>16} | {:>9.2?} | {:>9.2?} | {:>10} | {:>14}",
        "a disk flush",
        flush_p50,
        percentile(&flushes, 0.99),
        "",
        ""
    );
    for (tool, _, latencies, cpu) in paths.iter_mut() {
        latencies.sort();
        let p50 = percentile(latencies, 0.5);
        let (class, added) = match *tool {
            "mcp.ro.echo" => (
                "read-only",
                format!("+{:.2?}", p50.saturating_sub(floor_p50)),
            ),
            "mcp.ni.echo" => {
                let added = p50.saturating_sub(floor_p50);
                // Three flushed commits are its floor on this disk.
                let commits = flush_p50 * 3;
                let over = if added >= commits {
                    format!("+{:.2?}", added - commits)
                } else {
                    format!("-{:.2?}", commits - added)
                };
                ("non-idempotent", format!("+{added:.2?} (3 flushes {over})"))
            }
            _ => ("demo.echo, no MCP", String::new()),
        };
        println!(
            "{label:>8} | {class:>16} | {p50:>9.2?} | {:>9.2?} | {:>10} | {:>14}",
            percentile(latencies, 0.99),
            added,
            format!("{:.0}µs", *cpu / latencies.len() as f64 * 1e6),
        );
    }
    drop(served);
}

/// SIGTERMs serve when dropped.
struct Stopped(Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.0.wait();
    }
}

fn main() {
    let calls: usize = std::env::var("TOOLGATE_BENCH_CALLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let toolgate = toolgate();
    let admin_url = std::env::var("DATABASE_URL").ok();

    println!(
        "{:>8} | {:>16} | {:>9} | {:>9} | {:>10} | {:>14}",
        "store", "path", "p50", "p99", "added p50", "serve cpu/call"
    );
    // One store alone, to profile it (`TOOLGATE_BENCH_STORE=postgres`).
    let only = std::env::var("TOOLGATE_BENCH_STORE").ok();
    if only.as_deref().is_none_or(|store| store == "sqlite") {
        let folder = tempfile::tempdir().expect("folder");
        let url = format!("sqlite://{}", folder.path().join("toolgate.db").display());
        floor_and_overhead(&toolgate, "sqlite", &url, folder.path(), calls);
    }
    let Some(admin_url) = admin_url else {
        println!("DATABASE_URL is unset: PostgreSQL and the concurrency runs are skipped");
        return;
    };
    if only.as_deref().is_none_or(|store| store == "postgres") {
        let schema = Schema::create(&admin_url, "bench_floor");
        let folder = tempfile::tempdir().expect("folder");
        floor_and_overhead(&toolgate, "postgres", &schema.url, folder.path(), calls);
    }

    let seconds: u64 = std::env::var("TOOLGATE_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    if seconds == 0 {
        return;
    }
    println!();
    println!(
        "{:>8} | {:>19} | {:>7} | {:>9} | {:>9} | {:>9} | {:>13}",
        "store", "tool", "scripts", "calls/s", "p50", "p99", "toolgate cpu"
    );
    {
        let folder = tempfile::tempdir().expect("folder");
        let url = format!("sqlite://{}", folder.path().join("toolgate.db").display());
        concurrency(&toolgate, "sqlite", &url, seconds);
    }
    let schema = Schema::create(&admin_url, "bench_bridge");
    concurrency(&toolgate, "postgres", &schema.url, seconds);
}

/// A PostgreSQL schema of its own, dropped when the bench ends.
struct Schema {
    admin_url: String,
    name: String,
    url: String,
}

impl Schema {
    fn create(admin_url: &str, prefix: &str) -> Schema {
        let name = format!("{prefix}_{}", Uuid::new_v4().simple());
        let status = Command::new("psql")
            .args([admin_url, "-q", "-c", &format!("CREATE SCHEMA {name}")])
            .status()
            .expect("psql runs");
        assert!(status.success());
        let separator = if admin_url.contains('?') { '&' } else { '?' };
        Schema {
            admin_url: admin_url.to_owned(),
            url: format!("{admin_url}{separator}options=-c%20search_path%3D{name}"),
            name,
        }
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args([
                self.admin_url.as_str(),
                "-q",
                "-c",
                &format!("DROP SCHEMA {} CASCADE", self.name),
            ])
            .stderr(Stdio::null())
            .status();
    }
}
