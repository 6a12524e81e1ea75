//! Load driver for the MCP front door, against a real `toolgate serve`
//! (release build): the same call, `demo.echo`, through `POST /v1/calls`
//! on the control socket, through the front door's `tools/call` in a 2025
//! session (an MCP client's request, authenticated with an API key, its
//! session reloaded from memory) and through a 2026-07-28 stateless
//! `tools/call` (authenticated on its own, its credential's session found
//! by derivation), each on one kept-alive connection, in interleaved
//! blocks of 50; on the embedded SQLite store and (with `DATABASE_URL`) on
//! PostgreSQL. Printed per path: p50, p99, the p50 added over `/v1/calls`
//! and serve's CPU per call. `TOOLGATE_BENCH_ROUNDS` repeats the whole and
//! prints the median of each figure over the rounds.
//!
//! `[DATABASE_URL=postgres://…] cargo bench --bench front`
//! (`TOOLGATE_BENCH_CALLS` calls per path per round, default 1000;
//! `TOOLGATE_BENCH_BINARY` measures another build of `toolgate`.)
//!
//! Then the peers, all in front of `@modelcontextprotocol/server-everything`'s
//! `echo` over stdio (from `scripts/test`'s install, or
//! `TOOLGATE_MCP_SERVERS`), alternated in blocks of 50 in one run: a direct
//! client on the server's own stdio, joshrotenberg's `mcp-proxy` when it is
//! installed (`cargo install mcp-proxy --no-default-features`, or
//! `TOOLGATE_BENCH_MCP_PROXY`), and toolgate's front door on SQLite and on
//! PostgreSQL (and `TOOLGATE_BENCH_BASELINE`'s build of toolgate on each,
//! when given: the build before a change, in the same blocks). Printed per
//! path: p50, p99, the p50 added over the direct client and its ratio to
//! `mcp-proxy`'s, the gateway's CPU per call and, on PostgreSQL, the CPU
//! its database's backends spent per call. Last, the
//! throughput of each gateway at 8 and 32 concurrent sessions, with p50 and
//! p99. `TOOLGATE_BENCH_PART` (`stores`, `peers` or `throughput`) runs one
//! part alone; `TOOLGATE_BENCH_PART=lists`, never run otherwise, writes a
//! million calls into each store (`TOOLGATE_BENCH_LIST_ROWS`) and times the
//! operators' lists, a run's calls, a call's story and tool health through
//! the control socket.
//!
//! `TOOLGATE_BENCH_FAIRNESS=1 cargo bench --bench front` drives fairness
//! instead, on SQLite: a well-behaved tenant's client making sequential
//! `tools/call`s at most a hundred a second, alone, then beside a hostile tenant's credential at full
//! tilt (`TOOLGATE_BENCH_HOSTILE` callers, default 48, each a kept-alive
//! connection calling in a loop, plus 64 connections that send half a head
//! and stop), then the same with a per-principal rate limit of 200 calls/s.
//! Printed per scene, alternated over the rounds: the well-behaved client's
//! p50 and p99, and what the hostile credential got done and was refused.

// These time and pace real processes from outside them: the system's clock
// is the one they share (clippy.toml keeps it out of `src`).
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::io::{BufRead as _, BufReader, Read as _};

use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

const KEY: &str = "tgk_bench_0000000000000000000000000000000000000000000000000000000001";

/// A kept-alive HTTP/1.1 connection.
struct Kept<S: std::io::Read + std::io::Write> {
    reader: BufReader<S>,
    writer: S,
    host: String,
}

impl<S: std::io::Read + std::io::Write> Kept<S> {
    fn request(&mut self, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, Vec<u8>) {
        let (status, _, body) = self.exchange(path, headers, body);
        (status, body)
    }

    /// One request: the status, the `Mcp-Session-Id` answered, the body.
    fn exchange(
        &mut self,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, Option<String>, Vec<u8>) {
        self.try_exchange(path, headers, body).expect("an answer")
    }

    /// As [`Kept::request`], or the connection's failure (closed by the
    /// server, say).
    fn try_request(
        &mut self,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> std::io::Result<(u16, Vec<u8>)> {
        let (status, _, body) = self.try_exchange(path, headers, body)?;
        Ok((status, body))
    }

    fn try_exchange(
        &mut self,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> std::io::Result<(u16, Option<String>, Vec<u8>)> {
        let mut request = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            self.host,
            body.len()
        );
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        request.push_str(body);
        self.writer.write_all(request.as_bytes())?;
        self.read_answer()
    }

    /// A `GET` of `path`: the status and the body.
    fn get(&mut self, path: &str) -> (u16, Vec<u8>) {
        let request = format!("GET {path} HTTP/1.1\r\nHost: {}\r\n\r\n", self.host);
        self.writer.write_all(request.as_bytes()).expect("writes");
        let (status, _, body) = self.read_answer().expect("an answer");
        (status, body)
    }

    /// The answer to the request just sent.
    fn read_answer(&mut self) -> std::io::Result<(u16, Option<String>, Vec<u8>)> {
        let mut status = 0;
        let mut length = 0;
        let mut chunked = false;
        let mut session = None;
        let mut line = String::new();
        loop {
            line.clear();
            if self.reader.read_line(&mut line)? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some(code) = header.strip_prefix("HTTP/1.1 ") {
                status = code[..3].parse().unwrap_or(0);
            } else if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                } else if name.eq_ignore_ascii_case("transfer-encoding") {
                    chunked = value.trim().eq_ignore_ascii_case("chunked");
                } else if name.eq_ignore_ascii_case("mcp-session-id") {
                    session = Some(value.trim().to_owned());
                }
            }
        }
        if !chunked {
            let mut body = vec![0; length];
            self.reader.read_exact(&mut body)?;
            return Ok((status, session, body));
        }
        // A peer that streams its answer (an SSE body) sends it in chunks.
        let mut body = Vec::new();
        loop {
            line.clear();
            self.reader.read_line(&mut line)?;
            let size = usize::from_str_radix(line.trim_end(), 16)
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidData))?;
            if size == 0 {
                line.clear();
                self.reader.read_line(&mut line)?;
                return Ok((status, session, body));
            }
            let start = body.len();
            body.resize(start + size + 2, 0);
            self.reader.read_exact(&mut body[start..])?;
            body.truncate(start + size);
        }
    }
}

fn try_tcp(port: u16) -> std::io::Result<Kept<TcpStream>> {
    let writer = TcpStream::connect(("127.0.0.1", port))?;
    writer.set_nodelay(true)?;
    Ok(Kept {
        reader: BufReader::new(writer.try_clone()?),
        writer,
        host: format!("127.0.0.1:{port}"),
    })
}

fn unix(socket: &Path) -> Kept<UnixStream> {
    let writer = UnixStream::connect(socket).expect("connects");
    Kept {
        reader: BufReader::new(writer.try_clone().expect("a second handle")),
        writer,
        host: "toolgate".into(),
    }
}

fn tcp(port: u16) -> Kept<TcpStream> {
    try_tcp(port).expect("connects")
}

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

fn serve(toolgate: &Path, root: &Path, store_url: &str, port: u16) -> Stopped {
    serve_with(toolgate, root, store_url, port, "demo.echo", "")
}

/// As [`serve`], the front door's key and the policy naming `tool`, with
/// `extra` appended to the configuration (whole tables, or entries of
/// `[front]`'s keys).
fn serve_with(
    toolgate: &Path,
    root: &Path,
    store_url: &str,
    port: u16,
    tool: &str,
    extra: &str,
) -> Stopped {
    std::fs::write(
        root.join("policy.toml"),
        format!("[[rules]]\ntools = [\"{tool}\"]\ndecision = \"allow\"\n"),
    )
    .expect("policy");
    std::fs::write(
        root.join("toolgate.toml"),
        format!(
            "[control]\nsocket = \"run/control.sock\"\n[bridge]\ndirectory = \"run/turns\"\n\
             [store]\nurl = \"{store_url}\"\n[artifacts]\ndirectory = \"state/artifacts\"\n\
             [policy]\nfile = \"policy.toml\"\n[front]\nlisten = \"127.0.0.1:{port}\"\n\
             [[front.api_keys]]\nid = \"bench\"\nsha256 = \"{}\"\ntenant_id = \"bench\"\n\
             principal = {{ id = \"bench\", scopes = [\"demo.use\", \"mcp.everything.use\"] }}\ntools = [\"{tool}\"]\n{extra}",
            toolgate::domain::sha256_hex(KEY.as_bytes())
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
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err()
        || UnixStream::connect(root.join("run/control.sock")).is_err()
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "serve did not listen"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Stopped(child)
}

/// The figures of one path in one round.
#[derive(Clone, Copy)]
struct Figures {
    p50: Duration,
    p99: Duration,
    cpu_per_call: Duration,
}

/// The paths measured, in the order of a round's figures.
const PATHS: [&str; 3] = ["/v1/calls", "session tools/call", "stateless call"];

/// One round on one store: every path, interleaved; the figures per path.
fn round(toolgate: &Path, store_url: &str, root: &Path, calls: usize) -> [Figures; 3] {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let served = serve(toolgate, root, store_url, port);
    let pid = served.0.id();
    let control_socket = root.join("run/control.sock");
    let mut control = unix(&control_socket);
    let session = Uuid::new_v4();
    let open = json!({"session_id": session, "tenant_id": "bench",
                      "principal": {"id": "bench", "scopes": ["demo.use"]}, "agent": {"tools": ["demo.echo"]}});
    let (status, body) = control.request("/v1/sessions", &[], &open.to_string());
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));

    let mut front = tcp(port);
    let authorization = format!("Bearer {KEY}");
    let (status, front_session, _) = front.exchange(
        "/mcp",
        &[("Authorization", &authorization), ("Accept", "application/json, text/event-stream")],
        &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}})
        .to_string(),
    );
    assert_eq!(status, 200);
    let front_session = front_session.expect("a session id");
    let front_headers = [
        ("Authorization", authorization.as_str()),
        ("Accept", "application/json, text/event-stream"),
        ("Mcp-Session-Id", front_session.as_str()),
        ("MCP-Protocol-Version", "2025-06-18"),
    ];
    let stateless_headers = [
        ("Authorization", authorization.as_str()),
        ("Accept", "application/json, text/event-stream"),
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "demo-echo"),
    ];
    let mut stateless = tcp(port);
    let run = Uuid::new_v4();
    let mut latencies = [Vec::new(), Vec::new(), Vec::new()];
    let mut cpu = [0.0f64; 3];
    let mut next = 0usize;
    let call = |path: usize,
                i: usize,
                control: &mut Kept<UnixStream>,
                front: &mut Kept<TcpStream>,
                stateless: &mut Kept<TcpStream>|
     -> Duration {
        let text = format!("hello {i}");
        let started = Instant::now();
        let (status, body) = match path {
            0 => control.request(
                "/v1/calls",
                &[],
                &json!({"session_id": session, "run_id": run, "step_number": i, "origin_trust": "user",
                        "calls": [{"call_id": "c", "name": "demo.echo", "arguments": {"text": text}}]})
                .to_string(),
            ),
            1 => front.request(
                "/mcp",
                &front_headers,
                &json!({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                        "params": {"name": "demo-echo", "arguments": {"text": text}}})
                .to_string(),
            ),
            _ => stateless.request(
                "/mcp",
                &stateless_headers,
                &json!({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                        "params": {"name": "demo-echo", "arguments": {"text": text},
                                   "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                             "io.modelcontextprotocol/clientCapabilities": {}}}})
                .to_string(),
            ),
        };
        let elapsed = started.elapsed();
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let answer: Value = serde_json::from_slice(&body).expect("JSON");
        let ok = if path == 0 {
            answer["results"][0]["outcome"]["status"] == "succeeded"
        } else {
            answer["result"]["isError"] == false
        };
        assert!(ok, "{answer}");
        elapsed
    };
    // Warm every path, then alternate blocks of 50.
    for _ in 0..50 {
        for path in 0..PATHS.len() {
            next += 1;
            call(path, next, &mut control, &mut front, &mut stateless);
        }
    }
    while latencies[0].len() < calls {
        for path in 0..PATHS.len() {
            let before = cpu_seconds(pid);
            for _ in 0..50 {
                next += 1;
                let took = call(path, next, &mut control, &mut front, &mut stateless);
                latencies[path].push(took);
            }
            cpu[path] += cpu_seconds(pid) - before;
        }
    }
    drop(served);
    [0, 1, 2].map(|path| {
        let mut sorted = latencies[path].clone();
        sorted.sort();
        Figures {
            p50: percentile(&sorted, 0.5),
            p99: percentile(&sorted, 0.99),
            cpu_per_call: Duration::from_secs_f64(cpu[path] / sorted.len() as f64),
        }
    })
}

const HOSTILE_KEY: &str = "tgk_bench_0000000000000000000000000000000000000000000000000000000002";

/// What the hostile credential did during a scene.
#[derive(Default, Clone, Copy)]
struct Hostile {
    served: u64,
    refused: u64,
}

/// One scene: the well-behaved client's latencies, with `hostile` callers
/// of another tenant at full tilt (none: alone).
fn scene(
    toolgate: &Path,
    calls: usize,
    hostile: usize,
    extra: &str,
) -> (Duration, Duration, Hostile) {
    let folder = tempfile::tempdir().expect("folder");
    let root = folder.path();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let second_key = format!(
        "[[front.api_keys]]\nid = \"hostile\"\nsha256 = \"{}\"\ntenant_id = \"hostile\"\n\
         principal = {{ id = \"hostile\", scopes = [\"demo.use\"] }}\ntools = [\"demo.echo\"]\n{extra}",
        toolgate::domain::sha256_hex(HOSTILE_KEY.as_bytes())
    );
    let store_url = format!("sqlite://{}", root.join("toolgate.db").display());
    let served = serve_with(toolgate, root, &store_url, port, "demo.echo", &second_key);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = std::sync::Arc::new(std::sync::Mutex::new(Hostile::default()));
    let stateless = |key: &str| {
        [
            ("Authorization", format!("Bearer {key}")),
            ("Accept", "application/json, text/event-stream".to_owned()),
            ("MCP-Protocol-Version", "2026-07-28".to_owned()),
            ("Mcp-Method", "tools/call".to_owned()),
            ("Mcp-Name", "demo-echo".to_owned()),
        ]
    };
    let body = |i: usize| {
        json!({"jsonrpc": "2.0", "id": i, "method": "tools/call",
               "params": {"name": "demo-echo", "arguments": {"text": format!("t{i}")},
                          "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                    "io.modelcontextprotocol/clientCapabilities": {}}}})
        .to_string()
    };
    let mut threads = Vec::new();
    for _ in 0..hostile {
        let (stop, done) = (stop.clone(), done.clone());
        let headers = stateless(HOSTILE_KEY);
        threads.push(std::thread::spawn(move || {
            let mut i = 0;
            let mut mine = Hostile::default();
            let mut connection: Option<Kept<TcpStream>> = None;
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                let answer = match connection.as_mut() {
                    Some(kept) => kept.try_request("/mcp", &headers, &body(i)),
                    None => try_tcp(port).and_then(|kept| {
                        connection
                            .insert(kept)
                            .try_request("/mcp", &headers, &body(i))
                    }),
                };
                match answer {
                    Ok((200, body)) if !String::from_utf8_lossy(&body).contains("\"error\"") => {
                        mine.served += 1
                    }
                    Ok(_) => mine.refused += 1,
                    // A refused or given-up connection is dialled again.
                    Err(_) => {
                        mine.refused += 1;
                        connection = None;
                    }
                }
            }
            let mut total = done.lock().unwrap();
            total.served += mine.served;
            total.refused += mine.refused;
        }));
    }
    // Connections that send half a head and stop, held by the hostile side.
    let idle: Vec<TcpStream> = (0..if hostile > 0 { 64 } else { 0 })
        .filter_map(|_| {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
            std::io::Write::write_all(&mut stream, b"POST /mcp HTTP/1.1\r\n").ok()?;
            Some(stream)
        })
        .collect();
    let mut good = tcp(port);
    let headers = stateless(KEY);
    let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let mut latencies = Vec::with_capacity(calls);
    for i in 0..calls + 50 {
        // Well-behaved: a hundred calls a second at most.
        let paced = Instant::now() + Duration::from_millis(10);
        let started = Instant::now();
        let (status, answer) = good
            .try_request("/mcp", &headers, &body(i))
            .unwrap_or_else(|_| {
                // Its idle connection was given up to a newcomer: dial again.
                good = tcp(port);
                good.request("/mcp", &headers, &body(i))
            });
        let took = started.elapsed();
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
        let answer: Value = serde_json::from_slice(&answer).expect("JSON");
        assert_eq!(answer["result"]["isError"], false, "{answer}");
        if i >= 50 {
            latencies.push(took);
        }
        std::thread::sleep(paced.saturating_duration_since(Instant::now()));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for thread in threads {
        let _ = thread.join();
    }
    drop(idle);
    drop(served);
    latencies.sort();
    let hostile = *done.lock().unwrap();
    (
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        hostile,
    )
}

/// The fairness driver: three scenes alternated over the rounds.
fn fairness(toolgate: &Path, calls: usize, rounds: usize) {
    let hostile: usize = std::env::var("TOOLGATE_BENCH_HOSTILE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(48);
    let scenes = [
        ("alone", 0, ""),
        ("beside hostile", hostile, ""),
        (
            "hostile, rate-limited",
            hostile,
            "[limits.rate]\nprincipal = { per_second = 200, burst = 50 }\n",
        ),
    ];
    let mut figures = vec![Vec::new(); scenes.len()];
    for _ in 0..rounds {
        for (index, (_, callers, extra)) in scenes.iter().enumerate() {
            figures[index].push(scene(toolgate, calls, *callers, extra));
        }
    }
    println!(
        "{:>22} | {:>9} | {:>9} | {:>14} | {:>14}",
        "scene", "p50", "p99", "hostile served", "hostile refused"
    );
    for (index, (name, _, _)) in scenes.iter().enumerate() {
        let rounds = &figures[index];
        let p50 = median(rounds.iter().map(|f| f.0).collect());
        let p99 = median(rounds.iter().map(|f| f.1).collect());
        let served: u64 = rounds.iter().map(|f| f.2.served).sum::<u64>() / rounds.len() as u64;
        let refused: u64 = rounds.iter().map(|f| f.2.refused).sum::<u64>() / rounds.len() as u64;
        println!("{name:>22} | {p50:>9.2?} | {p99:>9.2?} | {served:>14} | {refused:>14}");
    }
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn store(
    toolgate: &Path,
    label: &str,
    store_url: impl Fn(&Path) -> String,
    calls: usize,
    rounds: usize,
) {
    let mut all = Vec::new();
    for _ in 0..rounds {
        let folder = tempfile::tempdir().expect("folder");
        all.push(round(
            toolgate,
            &store_url(folder.path()),
            folder.path(),
            calls,
        ));
    }
    let of = |path: usize, figure: fn(&Figures) -> Duration| {
        median(all.iter().map(|round| figure(&round[path])).collect())
    };
    let base = of(0, |f| f.p50);
    for (path, name) in PATHS.iter().enumerate() {
        let p50 = of(path, |f| f.p50);
        println!(
            "{label:>8} | {name:>18} | {p50:>9.2?} | {:>9.2?} | {:>10} | {:>9.0?}",
            of(path, |f| f.p99),
            if path == 0 {
                "-".to_owned()
            } else {
                format!("{:.2?}", p50.saturating_sub(base))
            },
            of(path, |f| f.cpu_per_call),
        );
    }
}

/// `@modelcontextprotocol/server-everything`'s entry point, from
/// `scripts/test`'s install (or `TOOLGATE_MCP_SERVERS`): the upstream every
/// peer fronts.
fn everything() -> Option<PathBuf> {
    let servers = PathBuf::from(
        std::env::var("TOOLGATE_MCP_SERVERS")
            .unwrap_or_else(|_| "/var/tmp/toolgate-mcp-servers".into()),
    );
    let script =
        servers.join("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    script.exists().then_some(script)
}

fn initialize(id: usize) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "initialize",
           "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                      "clientInfo": {"name": "bench", "version": "1"}}})
}

fn call_echo(id: usize, tool: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": tool, "arguments": {"message": format!("hello {id}")}}})
}

/// The JSON-RPC answer in a body: the JSON itself, or the SSE event that
/// carries it.
fn answer(body: &[u8]) -> Value {
    let text = String::from_utf8_lossy(body);
    if text.trim_start().starts_with('{') {
        return serde_json::from_str(&text).expect("JSON");
    }
    text.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
        .find(|event| event.get("result").is_some() || event.get("error").is_some())
        .unwrap_or_else(|| panic!("no answer in {text}"))
}

/// The server's own stdio, as an MCP host runs it: the path every gateway
/// adds to.
struct Direct {
    child: Child,
    stdin: std::process::ChildStdin,
    stdout: BufReader<std::process::ChildStdout>,
}

impl Direct {
    fn start(script: &Path) -> Direct {
        let mut child = Command::new("node")
            .arg(script)
            .arg("stdio")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("node starts");
        let mut direct = Direct {
            stdin: child.stdin.take().expect("stdin"),
            stdout: BufReader::new(child.stdout.take().expect("stdout")),
            child,
        };
        direct.exchange(&initialize(0));
        direct.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        direct
    }

    fn send(&mut self, message: &Value) {
        use std::io::Write as _;
        writeln!(self.stdin, "{message}").expect("writes");
        self.stdin.flush().expect("flushes");
    }

    fn exchange(&mut self, request: &Value) -> Value {
        self.send(request);
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                self.stdout.read_line(&mut line).expect("reads") > 0,
                "the server ended"
            );
            if let Ok(message) = serde_json::from_str::<Value>(&line)
                && message.get("id") == request.get("id")
            {
                return message;
            }
        }
    }
}

impl Drop for Direct {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A 2025-06-18 session of streamable HTTP on one kept-alive connection.
struct Session {
    kept: Kept<TcpStream>,
    path: String,
    headers: Vec<(String, String)>,
}

impl Session {
    fn open(port: u16, path: &str, authorization: Option<&str>) -> Session {
        let mut session = Session {
            kept: tcp(port),
            path: path.to_owned(),
            headers: vec![(
                "Accept".into(),
                "application/json, text/event-stream".into(),
            )],
        };
        if let Some(authorization) = authorization {
            session
                .headers
                .push(("Authorization".into(), authorization.into()));
        }
        let (status, id, body) = session.post_for_session(&initialize(0));
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        if let Some(id) = id {
            session.headers.push(("Mcp-Session-Id".into(), id));
        }
        session
            .headers
            .push(("MCP-Protocol-Version".into(), "2025-06-18".into()));
        let (status, _, body) = session
            .post_for_session(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        assert!(
            (200..300).contains(&status),
            "{status}: {}",
            String::from_utf8_lossy(&body)
        );
        session
    }

    fn post_for_session(&mut self, message: &Value) -> (u16, Option<String>, Vec<u8>) {
        let headers: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect();
        self.kept
            .exchange(&self.path, &headers, &message.to_string())
    }

    fn exchange(&mut self, request: &Value) -> Value {
        let (status, _, body) = self.post_for_session(request);
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        answer(&body)
    }

    /// The listed tool whose name ends in `echo`, once the gateway lists it.
    fn echo_tool(&mut self) -> String {
        let started = Instant::now();
        loop {
            let tools = self.exchange(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}));
            let found = tools["result"]["tools"].as_array().and_then(|tools| {
                tools
                    .iter()
                    .filter_map(|tool| tool["name"].as_str())
                    .find(|name| name.contains("everything") && name.ends_with("echo"))
                    .map(str::to_owned)
            });
            if let Some(name) = found {
                return name;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "no echo listed: {tools}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// One gateway in front of server-everything, as a process.
struct Gateway {
    name: String,
    port: u16,
    path: &'static str,
    authorization: Option<String>,
    pid: u32,
    /// The PostgreSQL database its store is, whose backends' CPU is its own.
    database: Option<String>,
    _process: Stopped,
    _folder: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `mcp-proxy` from `TOOLGATE_BENCH_MCP_PROXY`, `PATH` or cargo's bin
/// folder; none when it is not installed.
fn mcp_proxy_binary() -> Option<PathBuf> {
    if let Some(binary) = std::env::var_os("TOOLGATE_BENCH_MCP_PROXY") {
        return Some(PathBuf::from(binary));
    }
    let home = std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo/bin"));
    std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(home)
        .map(|folder| folder.join("mcp-proxy"))
        .find(|binary| binary.is_file())
}

fn wait_for_port(port: u16) {
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "nothing listens on {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn mcp_proxy(binary: &Path, script: &Path) -> Gateway {
    let folder = tempfile::tempdir().expect("folder");
    let port = free_port();
    let config = folder.path().join("proxy.toml");
    std::fs::write(
        &config,
        format!(
            "[proxy]\nname = \"bench\"\n[proxy.listen]\nhost = \"127.0.0.1\"\nport = {port}\n\
             [[backends]]\nname = \"everything\"\ntransport = \"stdio\"\ncommand = \"node\"\n\
             args = [{:?}, \"stdio\"]\n[observability]\nlog_level = \"warn\"\n",
            script.display().to_string()
        ),
    )
    .expect("config");
    let child = Command::new(binary)
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("mcp-proxy starts");
    let pid = child.id();
    let process = Stopped(child);
    wait_for_port(port);
    Gateway {
        name: "mcp-proxy".into(),
        port,
        path: "/",
        authorization: None,
        pid,
        database: None,
        _process: process,
        _folder: folder,
    }
}

/// A toolgate node whose front door serves server-everything's tools.
fn toolgate_gateway(
    toolgate: &Path,
    script: &Path,
    name: &str,
    store_url: impl FnOnce(&Path) -> (String, Option<String>),
) -> Gateway {
    let folder = tempfile::tempdir().expect("folder");
    let port = free_port();
    let (url, database) = store_url(folder.path());
    let server = format!(
        "[[mcp.servers]]\nserver_id = \"everything\"\ncommand = \"/usr/bin/node\"\n\
         args = [{:?}, \"stdio\"]\nside_effect = \"none\"\nrisk = \"low\"\n\
         idempotency = \"read_only\"\nrequired_scopes = [\"mcp.everything.use\"]\n",
        script.display().to_string()
    );
    let process = serve_with(
        toolgate,
        folder.path(),
        &url,
        port,
        "mcp.everything.echo",
        &server,
    );
    Gateway {
        name: name.into(),
        port,
        path: "/mcp",
        authorization: Some(format!("Bearer {KEY}")),
        pid: process.0.id(),
        database,
        _process: process,
        _folder: folder,
    }
}

/// Another build of toolgate (the one before a change) that the peers and
/// the throughput measure beside this one, from `TOOLGATE_BENCH_BASELINE`.
fn baseline_binary() -> Option<PathBuf> {
    std::env::var_os("TOOLGATE_BENCH_BASELINE").map(PathBuf::from)
}

/// `mcp-proxy` when installed, and toolgate on SQLite and (with
/// `postgres`) on PostgreSQL, each in front of server-everything; the
/// baseline build on each store too, when one is given.
fn gateways(
    toolgate: &Path,
    script: &Path,
    proxy: Option<&Path>,
    postgres: Option<&Postgres>,
) -> Vec<Gateway> {
    let mut gateways = Vec::new();
    if let Some(proxy) = proxy {
        gateways.push(mcp_proxy(proxy, script));
    }
    let baseline = baseline_binary();
    let builds = std::iter::once((toolgate, "toolgate"))
        .chain(baseline.as_deref().map(|binary| (binary, "baseline")));
    for (binary, build) in builds {
        gateways.push(toolgate_gateway(
            binary,
            script,
            &format!("{build} sqlite"),
            |folder| {
                (
                    format!("sqlite://{}", folder.join("toolgate.db").display()),
                    None,
                )
            },
        ));
        if let Some(postgres) = postgres {
            gateways.push(toolgate_gateway(
                binary,
                script,
                &format!("{build} postgres"),
                |_| {
                    let (url, database) = postgres.database();
                    (url, Some(database))
                },
            ));
        }
    }
    gateways
}

/// PostgreSQL's side of the bench: the admin connection that makes and
/// drops databases and names a database's backends.
struct Postgres {
    admin: String,
    runtime: tokio::runtime::Runtime,
    created: std::sync::Mutex<Vec<String>>,
    /// Kept for naming backends between blocks: a connection opened and
    /// closed for each block would start and end a server process while
    /// the next block is timed.
    watching: std::sync::Mutex<Option<sqlx::PgConnection>>,
}

impl Postgres {
    fn from_env() -> Option<Postgres> {
        let admin = std::env::var("DATABASE_URL").ok()?;
        Some(Postgres {
            admin,
            runtime: tokio::runtime::Runtime::new().expect("a runtime"),
            created: std::sync::Mutex::new(Vec::new()),
            watching: std::sync::Mutex::new(None),
        })
    }

    fn connection(&self) -> sqlx::PgConnection {
        use sqlx::Connection as _;
        self.runtime
            .block_on(sqlx::PgConnection::connect(&self.admin))
            .expect("the admin database")
    }

    fn execute(&self, sql: String) {
        let mut connection = self.connection();
        self.runtime
            .block_on(sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&mut connection))
            .expect("admin SQL");
    }

    /// A new database; its URL and its name.
    fn database(&self) -> (String, String) {
        let database = format!("bench_front_{}", Uuid::new_v4().simple());
        self.execute(format!("CREATE DATABASE {database}"));
        self.created.lock().unwrap().push(database.clone());
        let url = match self.admin.rsplit_once('/') {
            Some((base, _)) => format!("{base}/{database}"),
            None => self.admin.clone(),
        };
        (url, database)
    }

    /// The server processes serving `database`'s connections now.
    fn backends(&self, database: &str) -> Vec<u32> {
        let mut watching = self.watching.lock().unwrap();
        let connection = watching.get_or_insert_with(|| self.connection());
        let pids: Vec<i32> = self
            .runtime
            .block_on(
                sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE datname = $1")
                    .bind(database)
                    .fetch_all(connection),
            )
            .expect("pg_stat_activity");
        pids.into_iter().map(|pid| pid as u32).collect()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        for database in self.created.lock().unwrap().drain(..).collect::<Vec<_>>() {
            self.execute(format!("DROP DATABASE {database} WITH (FORCE)"));
        }
    }
}

/// A measured path: how a call is made, and whose CPU it costs.
enum Client {
    Direct(Direct),
    Session(Session, String),
}

impl Client {
    fn call(&mut self, id: usize) {
        let answer = match self {
            Client::Direct(direct) => direct.exchange(&call_echo(id, "echo")),
            Client::Session(session, tool) => session.exchange(&call_echo(id, tool)),
        };
        assert!(
            answer["result"]["isError"] != true && answer.get("error").is_none(),
            "{answer}"
        );
    }
}

/// A path's name, p50, p99, gateway CPU per call and database CPU per call.
type PathFigures = (String, Duration, Duration, Duration, Duration);

/// Per path, alternated in blocks of 50: p50, p99, the p50 added over the
/// direct client, the gateway's CPU per call and its database backends'.
fn peers(toolgate: &Path, calls: usize, rounds: usize, postgres: Option<&Postgres>) {
    let Some(script) = everything() else {
        println!("server-everything is not installed (scripts/test installs it): peers skipped");
        return;
    };
    let proxy = mcp_proxy_binary();
    if proxy.is_none() {
        println!("mcp-proxy is not installed (cargo install mcp-proxy --no-default-features)");
    }
    let mut all: Vec<Vec<PathFigures>> = Vec::new();
    for _ in 0..rounds {
        let gateways = gateways(toolgate, &script, proxy.as_deref(), postgres);
        let mut paths: Vec<(String, Client, Option<&Gateway>)> = vec![(
            "direct stdio".into(),
            Client::Direct(Direct::start(&script)),
            None,
        )];
        for gateway in &gateways {
            let mut session =
                Session::open(gateway.port, gateway.path, gateway.authorization.as_deref());
            let tool = session.echo_tool();
            paths.push((
                gateway.name.clone(),
                Client::Session(session, tool),
                Some(gateway),
            ));
        }
        let mut latencies = vec![Vec::new(); paths.len()];
        let mut cpu = vec![(0.0f64, 0.0f64); paths.len()];
        let mut next = 1usize;
        for (_, client, _) in &mut paths {
            for _ in 0..50 {
                next += 1;
                client.call(next);
            }
        }
        while latencies[0].len() < calls {
            for (index, (_, client, gateway)) in paths.iter_mut().enumerate() {
                let gateway = *gateway;
                let backends = match (gateway, postgres) {
                    (
                        Some(Gateway {
                            database: Some(database),
                            ..
                        }),
                        Some(postgres),
                    ) => postgres.backends(database),
                    _ => Vec::new(),
                };
                let database_cpu = || backends.iter().map(|pid| cpu_seconds(*pid)).sum::<f64>();
                let gateway_cpu = || gateway.map(|g| cpu_seconds(g.pid)).unwrap_or(0.0);
                let (before, database_before) = (gateway_cpu(), database_cpu());
                for _ in 0..50 {
                    next += 1;
                    let started = Instant::now();
                    client.call(next);
                    latencies[index].push(started.elapsed());
                }
                cpu[index].0 += gateway_cpu() - before;
                cpu[index].1 += database_cpu() - database_before;
            }
        }
        all.push(
            paths
                .iter()
                .enumerate()
                .map(|(index, (name, _, _))| {
                    let mut sorted = latencies[index].clone();
                    sorted.sort();
                    let per_call =
                        |seconds: f64| Duration::from_secs_f64(seconds / sorted.len() as f64);
                    (
                        name.clone(),
                        percentile(&sorted, 0.5),
                        percentile(&sorted, 0.99),
                        per_call(cpu[index].0),
                        per_call(cpu[index].1),
                    )
                })
                .collect(),
        );
    }
    println!(
        "\nserver-everything's echo, one client, blocks of 50 alternated ({calls} calls a path, \
         median of {rounds} round(s))"
    );
    println!(
        "{:>18} | {:>9} | {:>9} | {:>10} | {:>8} | {:>9} | {:>9}",
        "path", "p50", "p99", "added p50", "× proxy", "cpu/call", "db cpu"
    );
    let figure = |path: usize, pick: fn(&PathFigures) -> Duration| {
        median(all.iter().map(|round| pick(&round[path])).collect())
    };
    let direct = figure(0, |f| f.1);
    let proxy_added = proxy
        .as_ref()
        .map(|_| figure(1, |f| f.1).saturating_sub(direct));
    for (path, (name, ..)) in all[0].iter().enumerate() {
        let p50 = figure(path, |f| f.1);
        let added = p50.saturating_sub(direct);
        println!(
            "{name:>18} | {p50:>9.2?} | {:>9.2?} | {:>10} | {:>8} | {:>7}µs | {:>7}µs",
            figure(path, |f| f.2),
            if path == 0 {
                "-".to_owned()
            } else {
                format!("{added:.2?}")
            },
            match proxy_added {
                Some(base) if path > 0 && !base.is_zero() =>
                    format!("{:.2}", added.as_secs_f64() / base.as_secs_f64()),
                _ => "-".to_owned(),
            },
            figure(path, |f| f.3).as_micros(),
            figure(path, |f| f.4).as_micros(),
        );
    }
}

/// Throughput at `clients` concurrent sessions per gateway, each making
/// sequential calls: calls a second, p50 and p99 over every call.
fn throughput(toolgate: &Path, calls: usize, postgres: Option<&Postgres>) {
    let Some(script) = everything() else {
        return;
    };
    println!("\nserver-everything's echo, concurrent sessions ({calls} calls in all per row)");
    println!(
        "{:>18} | {:>7} | {:>9} | {:>9} | {:>9} | {:>9}",
        "gateway", "clients", "calls/s", "p50", "p99", "cpu/call"
    );
    for clients in [8usize, 32] {
        let gateways = gateways(toolgate, &script, mcp_proxy_binary().as_deref(), postgres);
        for gateway in &gateways {
            let each = calls.div_ceil(clients);
            let start = std::sync::Arc::new(std::sync::Barrier::new(clients + 1));
            let threads: Vec<_> = (0..clients)
                .map(|client| {
                    let start = start.clone();
                    let (port, path, authorization) =
                        (gateway.port, gateway.path, gateway.authorization.clone());
                    std::thread::spawn(move || {
                        let mut session = Session::open(port, path, authorization.as_deref());
                        let tool = session.echo_tool();
                        for i in 0..20 {
                            session.exchange(&call_echo(i + 2, &tool));
                        }
                        start.wait();
                        (0..each)
                            .map(|i| {
                                let started = Instant::now();
                                let answer =
                                    session.exchange(&call_echo(client * each + i + 100, &tool));
                                assert!(answer.get("error").is_none(), "{answer}");
                                started.elapsed()
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            start.wait();
            let began = Instant::now();
            let cpu_before = cpu_seconds(gateway.pid);
            let mut latencies: Vec<Duration> = threads
                .into_iter()
                .flat_map(|thread| thread.join().expect("a client"))
                .collect();
            let wall = began.elapsed();
            let cpu = cpu_seconds(gateway.pid) - cpu_before;
            latencies.sort();
            println!(
                "{:>18} | {clients:>7} | {:>9.0} | {:>9.2?} | {:>9.2?} | {:>9.0?}",
                gateway.name,
                latencies.len() as f64 / wall.as_secs_f64(),
                percentile(&latencies, 0.5),
                percentile(&latencies, 0.99),
                Duration::from_secs_f64(cpu / latencies.len() as f64),
            );
        }
    }
}

/// The rows of the operators' lists bench, as SQL over `n` (1 to the row
/// count): runs of a hundred calls (the first ten thousand one run), half
/// the runs tenant `bench`'s and the rest spread over seven tenants, five
/// tools, one call in two hundred UNCERTAIN, one in a hundred failed, one in
/// two hundred waiting for approval; two and a half seconds apart, so a
/// million rows span a month, the newest now.
struct Fill {
    /// `n` as a UUID whose last twelve hex digits are `n`'s, given the
    /// prefix's first eight.
    uuid: fn(&str, &str) -> String,
    /// The time `n` of `rows` was created at, in the store's type.
    created: fn(&str, usize) -> String,
    series: fn(usize) -> String,
    json: fn(&[(&str, String)]) -> String,
}

fn lists_sql(fill: &Fill, rows: usize) -> Vec<String> {
    let run = "(CASE WHEN n <= 10000 THEN 0 ELSE n / 100 END)";
    let tenant = format!("(CASE WHEN {run} % 2 = 0 THEN 'bench' ELSE 't' || ({run} % 7) END)");
    let id = (fill.uuid)("00000001", "n");
    let status = "(CASE WHEN n % 200 = 0 THEN 'uncertain' WHEN n % 100 = 1 THEN 'failed' \
                  WHEN n % 200 = 2 THEN 'waiting_for_approval' ELSE 'succeeded' END)";
    let outcome =
        format!("(CASE WHEN {status} = 'waiting_for_approval' THEN NULL ELSE {status} END)");
    let reason = "(CASE WHEN n % 200 = 0 THEN 'tool.outcome_unknown' WHEN n % 100 = 1 \
                  THEN 'tool.upstream_error' WHEN n % 200 = 2 THEN 'policy.rule.approval_required' END)";
    let tool = "(CASE n % 5 WHEN 0 THEN 'demo.echo' WHEN 1 THEN 'demo.set_value' WHEN 2 \
                THEN 'mcp.everything.echo' WHEN 3 THEN 'mcp.git.status' ELSE 'demo.time' END)";
    let created = (fill.created)("n", rows);
    let completed = format!("(CASE WHEN {outcome} IS NULL THEN NULL ELSE {created} END)");
    let approval = (fill.uuid)("00000002", "n");
    let payload = |kind: &str| {
        (fill.json)(&[
            ("invocation_id", id.clone()),
            ("run_id", (fill.uuid)("00000003", run)),
            ("tool_name", tool.to_owned()),
            ("kind", format!("'{kind}'")),
        ])
    };
    let series = (fill.series)(rows);
    vec![
        format!(
            "INSERT INTO tool_invocations (id, tenant_id, session_id, run_id, step_number, call_id, \
             tool_name, tool_version, tool_source, arguments, arguments_hash, idempotency_key, status, \
             idempotency_class, side_effect, principal, origin_trust, lease_epoch, created_at, \
             started_at, outcome_status, reason_code, completed_at, approval_id) \
             SELECT {id}, {tenant}, {}, {}, n, 'c', {tool}, '1', 'builtin', '{{\"text\":\"x\"}}', \
             'h' || n, 'k' || n, {status}, 'read_only', 'none', '{{\"id\":\"p\",\"scopes\":[]}}', \
             'user', 0, {created}, {created}, {outcome}, {reason}, {completed}, \
             CASE WHEN {status} = 'waiting_for_approval' THEN {approval} END FROM {series}",
            (fill.uuid)("00000004", run),
            (fill.uuid)("00000003", run),
        ),
        format!(
            "INSERT INTO approvals (id, tenant_id, invocation_id, tool_name, reason_code, status, \
             requested_at) SELECT {approval}, {tenant}, {id}, {tool}, 'policy.rule.approval_required', \
             'pending', {created} FROM {series} WHERE n % 200 = 2"
        ),
        format!(
            "INSERT INTO events (tenant_id, event_type, payload, created_at) \
             SELECT {tenant}, 'tool.call.started', {}, {created} FROM {series}",
            payload("started")
        ),
        format!(
            "INSERT INTO events (tenant_id, event_type, payload, created_at) \
             SELECT {tenant}, 'tool.call.completed', {}, {created} FROM {series}",
            payload("completed")
        ),
    ]
}

/// The operators' lists over a store of `rows` calls, through the control
/// API: the median of ten of each, after one to warm.
fn lists(toolgate: &Path, rows: usize, postgres: Option<&Postgres>) {
    let sqlite = Fill {
        uuid: |prefix, n| format!("printf('{prefix}-0000-4000-8000-%012x', {n})"),
        created: |n, rows| {
            format!("(CAST(strftime('%s', 'now') AS INTEGER) * 1000000 - ({rows} - {n}) * 2500000)")
        },
        series: |rows| {
            format!(
                "(WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < {rows}) \
                 SELECT n FROM s)"
            )
        },
        json: |fields| {
            let pairs: Vec<String> = fields
                .iter()
                .map(|(key, value)| format!("'{key}', {value}"))
                .collect();
            format!("json_object({})", pairs.join(", "))
        },
    };
    let postgres_fill = Fill {
        uuid: |prefix, n| {
            format!("('{prefix}-0000-4000-8000-' || lpad(to_hex({n}), 12, '0'))::uuid")
        },
        created: |n, rows| format!("(now() - (({rows} - {n}) * interval '2.5 seconds'))"),
        series: |rows| format!("generate_series(1, {rows}) AS s(n)"),
        json: |fields| {
            let pairs: Vec<String> = fields
                .iter()
                .map(|(key, value)| format!("'{key}', {value}"))
                .collect();
            format!("jsonb_build_object({})", pairs.join(", "))
        },
    };
    println!("\noperators' lists over {rows} calls (median of 10, control socket)");
    println!(
        "{:>8} | {:>58} | {:>9} | {:>6}",
        "store", "request", "median", "items"
    );
    {
        let folder = tempfile::tempdir().expect("folder");
        let url = format!("sqlite://{}", folder.path().join("toolgate.db").display());
        drop(serve(toolgate, folder.path(), &url, free_port()));
        let started = Instant::now();
        let connection =
            rusqlite::Connection::open(folder.path().join("toolgate.db")).expect("the store");
        connection
            .execute_batch("PRAGMA foreign_keys = OFF; BEGIN")
            .expect("begins");
        for sql in lists_sql(&sqlite, rows) {
            connection.execute_batch(&sql).expect("fills");
        }
        connection.execute_batch("COMMIT").expect("commits");
        drop(connection);
        println!("  (sqlite filled in {:.0?})", started.elapsed());
        time_lists(toolgate, folder.path(), &url, "sqlite", rows);
    }
    if let Some(postgres) = postgres {
        let folder = tempfile::tempdir().expect("folder");
        let (url, _) = postgres.database();
        drop(serve(toolgate, folder.path(), &url, free_port()));
        let started = Instant::now();
        let mut connection = postgres
            .runtime
            .block_on(<sqlx::PgConnection as sqlx::Connection>::connect(&url))
            .expect("the store");
        let mut script = String::from("SET toolgate.scope = 'system';");
        for sql in lists_sql(&postgres_fill, rows) {
            script.push_str(&sql);
            script.push(';');
        }
        script.push_str("ANALYZE;");
        postgres
            .runtime
            .block_on(sqlx::raw_sql(sqlx::AssertSqlSafe(script)).execute(&mut connection))
            .expect("fills");
        drop(connection);
        println!(
            "  (postgres filled and analyzed in {:.0?})",
            started.elapsed()
        );
        time_lists(toolgate, folder.path(), &url, "postgres", rows);
    }
}

fn time_lists(toolgate: &Path, root: &Path, url: &str, label: &str, rows: usize) {
    // A run of a hundred calls in the middle of the table, and a call of it.
    let middle = (rows as u64 / 2).max(10_001) / 100;
    // An even run is tenant `bench`'s.
    let middle = middle - middle % 2;
    let served = serve(toolgate, root, url, free_port());
    let mut control = unix(&root.join("run/control.sock"));
    let run = |uuid_prefix: &str, n: u64| format!("{uuid_prefix}-0000-4000-8000-{n:012x}");
    let first_page = "/v1/invocations?tenant_id=bench&limit=50";
    let (_, body) = control.get(first_page);
    let cursor = serde_json::from_slice::<Value>(&body).expect("JSON")["next_cursor"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_default();
    let day = |days: i64| (chrono::Utc::now() - chrono::Duration::days(days)).to_rfc3339();
    let requests = [
        "/v1/invocations?limit=50".to_owned(),
        first_page.to_owned(),
        format!("/v1/invocations?tenant_id=bench&limit=50&cursor={cursor}"),
        "/v1/invocations?tenant_id=t3&limit=50".to_owned(),
        "/v1/invocations?tenant_id=bench&tool_name=demo.time&limit=50".to_owned(),
        "/v1/invocations?tenant_id=bench&status=uncertain&limit=50".to_owned(),
        format!(
            "/v1/invocations?tenant_id=bench&session_id={}&limit=50",
            run("00000004", middle)
        ),
        format!(
            "/v1/invocations?since={}&until={}&limit=50",
            urlencode(&day(15)),
            urlencode(&day(14))
        ),
        "/v1/review?tenant_id=bench".to_owned(),
        "/v1/approvals?tenant_id=bench".to_owned(),
        format!(
            "/v1/runs/{}/invocations?tenant_id=bench",
            run("00000003", middle)
        ),
        format!(
            "/v1/runs/{}/invocations?tenant_id=bench",
            run("00000003", 0)
        ),
        format!("/v1/invocations/{}", run("00000001", middle * 100 + 50)),
        "/v1/tool-health?window=hour".to_owned(),
        "/v1/tool-health?window=day".to_owned(),
    ];
    for request in &requests {
        let mut times = Vec::new();
        let mut items = 0;
        for i in 0..11 {
            let started = Instant::now();
            let (status, body) = control.get(request);
            let took = started.elapsed();
            assert_eq!(status, 200, "{request}: {}", String::from_utf8_lossy(&body));
            if i == 0 {
                let answer: Value = serde_json::from_slice(&body).expect("JSON");
                items = answer
                    .as_object()
                    .and_then(|fields| fields.values().find_map(Value::as_array))
                    .map_or(1, Vec::len);
                continue;
            }
            times.push(took);
        }
        let shown: String = request.chars().take(58).collect();
        println!(
            "{label:>8} | {shown:>58} | {:>9.2?} | {items:>6}",
            median(times)
        );
    }
    drop(served);
}

/// A query value's reserved characters, escaped.
fn urlencode(value: &str) -> String {
    value
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' => {
                (byte as char).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

fn main() {
    let calls: usize = std::env::var("TOOLGATE_BENCH_CALLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let rounds: usize = std::env::var("TOOLGATE_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let toolgate = toolgate();
    if std::env::var_os("TOOLGATE_BENCH_FAIRNESS").is_some() {
        fairness(&toolgate, calls, rounds);
        return;
    }
    let part = std::env::var("TOOLGATE_BENCH_PART").unwrap_or_default();
    let postgres = Postgres::from_env();
    if postgres.is_none() {
        println!("DATABASE_URL is unset: PostgreSQL is skipped");
    }
    if part.is_empty() || part == "stores" {
        println!(
            "{:>8} | {:>18} | {:>9} | {:>9} | {:>10} | {:>9}",
            "store", "path", "p50", "p99", "added p50", "cpu/call"
        );
        store(
            &toolgate,
            "sqlite",
            |folder| format!("sqlite://{}", folder.join("toolgate.db").display()),
            calls,
            rounds,
        );
        if let Some(postgres) = &postgres {
            store(
                &toolgate,
                "postgres",
                |_| postgres.database().0,
                calls,
                rounds,
            );
        }
    }
    if part.is_empty() || part == "peers" {
        peers(&toolgate, calls, rounds, postgres.as_ref());
    }
    if part.is_empty() || part == "throughput" {
        throughput(&toolgate, calls * 2, postgres.as_ref());
    }
    // A million rows take minutes to write: only when asked for.
    if part == "lists" {
        let rows = std::env::var("TOOLGATE_BENCH_LIST_ROWS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1_000_000);
        lists(&toolgate, rows, postgres.as_ref());
    }
}
