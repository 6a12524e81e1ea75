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
        let mut status = 0;
        let mut length = 0;
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
                } else if name.eq_ignore_ascii_case("mcp-session-id") {
                    session = Some(value.trim().to_owned());
                }
            }
        }
        let mut body = vec![0; length];
        self.reader.read_exact(&mut body)?;
        Ok((status, session, body))
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
    serve_with(toolgate, root, store_url, port, "")
}

/// As [`serve`], with `extra` appended to the configuration (whole tables,
/// or entries of `[front]`'s keys).
fn serve_with(toolgate: &Path, root: &Path, store_url: &str, port: u16, extra: &str) -> Stopped {
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
             [policy]\nfile = \"policy.toml\"\n[front]\nlisten = \"127.0.0.1:{port}\"\n\
             [[front.api_keys]]\nid = \"bench\"\nsha256 = \"{}\"\ntenant_id = \"bench\"\n\
             principal = {{ id = \"bench\", scopes = [\"demo.use\"] }}\ntools = [\"demo.echo\"]\n{extra}",
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
    let served = serve_with(toolgate, root, &store_url, port, &second_key);
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
    let Ok(admin) = std::env::var("DATABASE_URL") else {
        println!("DATABASE_URL is unset: PostgreSQL is skipped");
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let created = std::sync::Mutex::new(Vec::new());
    let admin_sql = |sql: String| {
        runtime.block_on(async {
            use sqlx::Connection as _;
            let mut connection = sqlx::PgConnection::connect(&admin)
                .await
                .expect("the admin database");
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut connection)
                .await
                .expect("admin SQL");
        })
    };
    let url = |_: &Path| {
        let database = format!("bench_front_{}", Uuid::new_v4().simple());
        admin_sql(format!("CREATE DATABASE {database}"));
        created.lock().unwrap().push(database.clone());
        match admin.rsplit_once('/') {
            Some((base, _)) => format!("{base}/{database}"),
            None => admin.clone(),
        }
    };
    store(&toolgate, "postgres", url, calls, rounds);
    for database in created.lock().unwrap().drain(..) {
        admin_sql(format!("DROP DATABASE {database} WITH (FORCE)"));
    }
}
