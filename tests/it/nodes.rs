//! Nodes sharing one PostgreSQL store, each a real `toolgate serve`: a lease
//! that outlives a start-up sweep, clocks that disagree, a copied node
//! folder, a paused node, the database dying under a call, and readiness
//! that means it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::Connection as _;
use toolgate::adapters::store::PostgresStore;
use toolgate::domain::InvocationStatus;
use toolgate::ports::{InvocationRecord, InvocationStore as _, Schema as _};
use uuid::Uuid;

use crate::serve::{Served, TENANT, http, json_of, sha256};
use crate::store::PgSchema;
use crate::support::free_port;

/// A lease of three seconds renewed every second, swept every second: what
/// happens at thirty seconds in production happens here in three.
const FAST_NODE: &str = "\n[node]\nlease_seconds = 3\nheartbeat_seconds = 1\nsweep_seconds = 1\n";

/// Whether a test that needs a tool (faketime) must fail rather than skip
/// without it.
fn required() -> bool {
    std::env::var("CI").is_ok_and(|value| value == "true")
        || std::env::var("TOOLGATE_REQUIRE_POSTGRES").is_ok_and(|value| value == "1")
}

/// A file the writes servers of several nodes append their effects to,
/// reachable by the unprivileged user stdio servers run as under root;
/// beside it their gate ([`Gate`]), open.
fn effects_file() -> (tempfile::TempDir, PathBuf) {
    use std::os::unix::fs::PermissionsExt as _;
    let folder = tempfile::tempdir().unwrap();
    std::fs::set_permissions(folder.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let effects = folder.path().join("effects");
    std::fs::write(&effects, "").unwrap();
    std::fs::set_permissions(&effects, std::fs::Permissions::from_mode(0o666)).unwrap();
    Gate::of(&effects).open();
    (folder, effects)
}

/// The scripted servers' gate beside an effects file: while it is shut, a
/// `write` waits before its effect and a `sleep` before its answer, so a
/// test holds a call open until the moment it tests has happened.
struct Gate(PathBuf);

impl Gate {
    fn of(effects: &Path) -> Gate {
        Gate(effects.with_extension("gate"))
    }

    fn shut(&self) {
        let _ = std::fs::remove_file(&self.0);
    }

    fn open(&self) {
        std::fs::write(&self.0, "").unwrap();
    }
}

/// A GET over TCP: (status, body).
fn get_tcp(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    let _ = write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: ops\r\nConnection: close\r\n\r\n"
    );
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
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

/// A node on `store_url`: the quickstart's test configuration with `extra`
/// appended, every `write` waiting `write_delay_ms` first and appending to
/// `effects`, and `env` added to its environment.
fn node(
    store_url: &str,
    effects: &Path,
    write_delay_ms: u64,
    extra: &str,
    env: &[(&str, String)],
) -> Served {
    node_with(store_url, effects, write_delay_ms, "", extra, env)
}

/// [`node`], with `mcp` added to its `[mcp]` table.
fn node_with(
    store_url: &str,
    effects: &Path,
    write_delay_ms: u64,
    mcp: &str,
    extra: &str,
    env: &[(&str, String)],
) -> Served {
    let (url, effects, mcp, extra) = (
        store_url.to_owned(),
        effects.display().to_string(),
        mcp.to_owned(),
        extra.to_owned(),
    );
    Served::start_edited(
        move |root, config| {
            let config = config
                .replace(
                    "state_directory = \"state/mcp\"",
                    &format!("state_directory = \"state/mcp\"\n{mcp}"),
                )
                .replace(
                    "url = \"sqlite://toolgate.db\"",
                    &format!("url = \"{url}\""),
                )
                .replace(
                    "env = { SCRIPTED_CATALOG = \"basic\" }\nside_effect",
                    &format!(
                        "env = {{ SCRIPTED_CATALOG = \"basic\", SCRIPTED_GATE = \"{}\" }}\nside_effect",
                        Gate::of(Path::new(&effects)).0.display()
                    ),
                )
                .replace(
                    &format!(
                        "SCRIPTED_EFFECTS = \"{}\"",
                        root.join("writes.effects").display()
                    ),
                    &format!(
                        "SCRIPTED_EFFECTS = \"{effects}\", SCRIPTED_WRITE_DELAY_MS = \"{write_delay_ms}\", \
                         SCRIPTED_GATE = \"{}\"",
                        Gate::of(Path::new(&effects)).0.display()
                    ),
                );
            assert_eq!(config.matches("SCRIPTED_GATE").count(), 2, "{config}");
            format!("{config}\n{extra}")
        },
        env,
    )
}

/// Runs `toolgate serve` once on `served`'s folder (which must not be
/// serving) with `env` added, expecting it to refuse to start: its exit
/// status and what it logged.
fn refused_start(folder: &Path, env: &[(&str, String)]) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["serve", "--config"])
        .arg(folder.join("toolgate.toml"))
        .env_remove("TOOLGATE_STORE_URL")
        .env_remove("TOOLGATE_CONTROL_SOCKET")
        .envs(env.iter().map(|(name, value)| (*name, value)))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve starts");
    let started = Instant::now();
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("serve did not refuse to start");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().expect("serve ends");
    (
        output.status,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The store as its owner sees it, for reading rows.
async fn owner_store(schema: &PgSchema) -> PostgresStore {
    PostgresStore::connect(&schema.owner_url)
        .await
        .expect("the owner connects")
}

/// Polls `check` every 100 ms until it returns something, for up to
/// `within`.
async fn eventually<T, F, Fut>(within: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = Instant::now();
    while started.elapsed() < within {
        if let Some(found) = check().await {
            return Some(found);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// A run's only row, once it satisfies `check`.
async fn row_where(
    store: &PostgresStore,
    run_id: Uuid,
    within: Duration,
    check: impl Fn(&InvocationRecord) -> bool,
) -> Option<InvocationRecord> {
    eventually(within, || async {
        store
            .run_invocations(TENANT, run_id)
            .await
            .ok()?
            .into_iter()
            .find(|row| check(row))
    })
    .await
}

/// A node's newest worker: (worker id, last heartbeat, released).
async fn newest_worker(
    schema: &PgSchema,
    node_folder: &Path,
) -> Option<(Uuid, chrono::DateTime<chrono::Utc>, bool)> {
    let node = std::fs::read_to_string(node_folder.join("var/node/node.id")).ok()?;
    let mut connection = sqlx::PgConnection::connect(&schema.owner_url).await.ok()?;
    sqlx::query_as::<_, (Uuid, chrono::DateTime<chrono::Utc>, bool)>(
        "SELECT worker_id, heartbeat_at, released_at IS NOT NULL FROM workers \
         WHERE node = $1 ORDER BY started_at DESC LIMIT 1",
    )
    .bind(node.trim())
    .fetch_optional(&mut connection)
    .await
    .ok()?
}

/// One step of `/v1/calls` on `served`, on a thread of its own: the answer
/// when it comes.
fn call_in_background(
    served: &Served,
    session: Uuid,
    run_id: Uuid,
    name: &str,
    arguments: Value,
) -> std::thread::JoinHandle<(u16, Value)> {
    let socket = served.socket.clone();
    let body = json!({"session_id": session, "run_id": run_id, "step_number": 1,
        "origin_trust": "user",
        "calls": [{"call_id": "c1", "name": name, "arguments": arguments}]})
    .to_string();
    std::thread::spawn(move || {
        let (status, _, answer) = http(
            &socket,
            "POST",
            "/v1/calls",
            &[("Content-Type", "application/json")],
            Some(body.as_bytes()),
        );
        (status, json_of(&answer))
    })
}

/// A node whose start-up sweep re-runs a call longer than its lease keeps
/// renewing the lease meanwhile (on a task of its own), stays ready, and no
/// other node takes the call it is re-running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_up_sweep_never_starves_the_lease() {
    let Some(schema) = PgSchema::create().await else {
        eprintln!("DATABASE_URL unset: the node tests run on PostgreSQL only");
        return;
    };
    let store = owner_store(&schema).await;
    let (_folder, effects) = effects_file();
    let ops = free_port();
    let mut a = node(
        &schema.url,
        &effects,
        0,
        &format!("{FAST_NODE}\n[ops]\nlisten = \"127.0.0.1:{ops}\"\n"),
        &[],
    );
    let session = a.session();
    let run_id = Uuid::new_v4();
    let answer = call_in_background(
        &a,
        session,
        run_id,
        "mcp.reads.sleep",
        json!({"seconds": 8}),
    );
    row_where(&store, run_id, Duration::from_secs(20), |row| {
        row.status() == InvocationStatus::Running
    })
    .await
    .expect("the call is running");
    a.kill();
    let _ = answer.join();
    a.start_again();
    // The restarted node's sweep takes the call and runs it again: eight
    // seconds, more than two leases.
    let (worker, first_beat, _) = newest_worker(&schema, a.folder.path())
        .await
        .expect("a's new worker");
    let rerun = row_where(&store, run_id, Duration::from_secs(30), |row| {
        row.state.worker() == Some(worker) && row.status() == InvocationStatus::Running
    })
    .await
    .expect("a's start-up sweep re-runs the call");
    assert_eq!(rerun.attempt_number, 2);
    // Another node starts once a's re-run is live, not while a restarts:
    // a call whose node died is any node's to take, a live one is not.
    let b = node(&schema.url, &effects, 0, FAST_NODE, &[]);
    let mut beats = std::collections::BTreeSet::new();
    let mut ready = 0;
    for _ in 0..16 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let (_, beat, released) = newest_worker(&schema, a.folder.path()).await.unwrap();
        assert!(!released);
        beats.insert(beat);
        if get_tcp(ops, "/readyz").0 == 200 {
            ready += 1;
        }
    }
    assert!(
        beats.iter().filter(|beat| **beat > first_beat).count() >= 2,
        "the lease was renewed during the sweep: {beats:?}"
    );
    assert!(ready >= 12, "ready while the sweep runs: {ready} of 16");
    let done = row_where(&store, run_id, Duration::from_secs(20), |row| {
        row.status().is_terminal()
    })
    .await
    .expect("the re-run ends");
    assert_eq!(done.status(), InvocationStatus::Succeeded);
    assert_eq!(
        done.ended().and_then(|ended| ended.worker),
        Some(worker),
        "b never took a live call"
    );
    assert_eq!(done.attempt_number, 2);
    drop(b);
}

/// The library faketime preloads, when installed.
fn faketime() -> Option<PathBuf> {
    let library = PathBuf::from("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1");
    if library.exists() {
        return Some(library);
    }
    assert!(
        !required(),
        "faketime is not installed (apt-get install faketime) and this run requires it"
    );
    None
}

/// Leases are judged by the database's clock: a node whose clock is two
/// minutes off refuses to start (either way), and one within the bound
/// never takes another node's live call however its own clock reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clocks_that_disagree_never_take_a_live_call() {
    let Some(schema) = PgSchema::create().await else {
        eprintln!("DATABASE_URL unset: the node tests run on PostgreSQL only");
        return;
    };
    let Some(library) = faketime() else {
        eprintln!("faketime is not installed: the clock-skew test is skipped");
        return;
    };
    let skewed = |offset: &str| {
        vec![
            ("LD_PRELOAD", library.display().to_string()),
            ("FAKETIME", offset.to_owned()),
            ("FAKETIME_DONT_RESET", "1".to_owned()),
        ]
    };
    let store = owner_store(&schema).await;
    let (_folder, effects) = effects_file();
    let a = node(&schema.url, &effects, 0, FAST_NODE, &[]);
    let session = a.session();
    let run_id = Uuid::new_v4();
    let answer = call_in_background(
        &a,
        session,
        run_id,
        "mcp.reads.sleep",
        json!({"seconds": 6}),
    );
    row_where(&store, run_id, Duration::from_secs(20), |row| {
        row.status() == InvocationStatus::Running
    })
    .await
    .expect("the call is running");
    // Two minutes ahead, and two behind: refused, naming the clock.
    let mut b = node(&schema.url, &effects, 0, FAST_NODE, &[]);
    assert!(b.stop());
    for offset in ["+120s", "-120s"] {
        let (status, logged) = refused_start(b.folder.path(), &skewed(offset));
        assert!(!status.success(), "{offset}: {logged}");
        assert!(logged.contains("clock"), "{offset}: {logged}");
    }
    // Four seconds ahead: within the 5-second bound, serving, sweeping every
    // second, and further ahead than the 3-second lease, so a claim judged
    // by this node's clock would see the live call's lease as ended.
    b.env = skewed("+4s")
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
    b.start_again();
    let (status, answer) = answer.join().unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["results"][0]["outcome"]["status"], "succeeded",
        "{answer}"
    );
    let row = store.run_invocations(TENANT, run_id).await.unwrap();
    assert_eq!(row.len(), 1);
    assert_eq!(row[0].attempt_number, 1, "nobody took the live call");
}

/// A node folder copied elsewhere is another place with the same identity:
/// while the original lives the copy is refused (and the original keeps
/// its lease and serves); once it is gone the copy may start, saying it was
/// moved; and then the original is refused in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copied_node_folder_is_refused_while_its_original_lives() {
    let Some(schema) = PgSchema::create().await else {
        eprintln!("DATABASE_URL unset: the node tests run on PostgreSQL only");
        return;
    };
    let (_folder, effects) = effects_file();
    let mut a = node(&schema.url, &effects, 0, FAST_NODE, &[]);
    let mut copy = node(&schema.url, &effects, 0, FAST_NODE, &[]);
    assert!(copy.stop());
    std::fs::copy(
        a.folder.path().join("var/node/node.id"),
        copy.folder.path().join("var/node/node.id"),
    )
    .unwrap();
    let (status, logged) = refused_start(copy.folder.path(), &[]);
    assert!(!status.success(), "{logged}");
    assert!(logged.contains("held by a live worker"), "{logged}");
    // The original kept its lease through the refusal, and serves.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (_, _, released) = newest_worker(&schema, a.folder.path()).await.unwrap();
    assert!(!released, "the original keeps its lease");
    let session = a.session();
    let (status, answer) = a.echo(session, Uuid::new_v4(), 1, "c1", "mcp.reads.echo");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["results"][0]["outcome"]["status"], "succeeded");
    // The original gone, the copy starts and says the folder moved; the
    // original is then the one refused.
    assert!(a.stop());
    copy.start_again();
    // Its socket listens before its worker registers: the warning follows.
    let said = eventually(Duration::from_secs(20), || async {
        copy.logs
            .lock()
            .unwrap()
            .contains("copied or moved")
            .then_some(())
    })
    .await;
    assert!(said.is_some(), "{}", copy.logs.lock().unwrap());
    let (status, logged) = refused_start(a.folder.path(), &[]);
    assert!(!status.success(), "{logged}");
    assert!(logged.contains("held by a live worker"), "{logged}");
}

/// A node paused past its lease: another node takes its call (uncertain,
/// since its effect may have been sent), the paused node's answer is the
/// row's truth, and once it runs again it serves again as a new worker of
/// its node, without a restart; its old worker can write nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_answers_truly_and_serves_again_as_a_new_worker() {
    let Some(schema) = PgSchema::create().await else {
        eprintln!("DATABASE_URL unset: the node tests run on PostgreSQL only");
        return;
    };
    let store = owner_store(&schema).await;
    let (_folder, effects) = effects_file();
    let mut a = node(&schema.url, &effects, 2500, FAST_NODE, &[]);
    let b = node(&schema.url, &effects, 0, FAST_NODE, &[]);
    let session = a.session();
    let run_id = Uuid::new_v4();
    let script = "paused node script";
    // The write's effect is held until the node is paused.
    let gate = Gate::of(&effects);
    gate.shut();
    let (status, turn) = a.post(
        "/v1/turns",
        &json!({"session_id": session, "run_id": run_id, "step_number": 1,
                "script_sha256": sha256(script), "origin_trust": "user"}),
    );
    assert_eq!(status, 200, "{turn}");
    let (socket, token) = (
        PathBuf::from(turn["socket_path"].as_str().unwrap()),
        turn["token"].as_str().unwrap().to_owned(),
    );
    let script_call = {
        let (socket, token) = (socket.clone(), token.clone());
        std::thread::spawn(move || {
            let body = json!({"call": "mcp.writes.write", "arguments": {"line": "paused"}});
            let (status, _, answer) = http(
                &socket,
                "POST",
                "/v1/call",
                &[("Authorization", &format!("Bearer {token}"))],
                Some(body.to_string().as_bytes()),
            );
            (status, json_of(&answer))
        })
    };
    row_where(&store, run_id, Duration::from_secs(20), |row| {
        row.effect_sent_at.is_some()
    })
    .await
    .expect("the write is under way");
    let (before, _, _) = newest_worker(&schema, a.folder.path())
        .await
        .expect("a's worker");
    let pid = nix::unistd::Pid::from_raw(a.pid().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    gate.open();
    let taken = row_where(&store, run_id, Duration::from_secs(20), |row| {
        row.status().is_terminal()
    })
    .await
    .expect("b takes the paused node's call");
    assert_eq!(taken.status(), InvocationStatus::Uncertain);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let (status, answer) = script_call.join().unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["status"], "uncertain", "the row's truth: {answer}");
    let written = std::fs::read_to_string(&effects).unwrap_or_default();
    assert_eq!(written.lines().count(), 1, "the effect once: {written}");
    // The paused node serves again, as a new worker of its node, in the
    // same process.
    let served = eventually(Duration::from_secs(30), || async {
        let (_, answer) = a.post(
            "/v1/calls",
            &json!({"session_id": session, "run_id": Uuid::new_v4(), "step_number": 1,
                "origin_trust": "user",
                "calls": [{"call_id": "c1", "name": "demo.echo", "arguments": {"text": "again"}}]}),
        );
        (answer["results"][0]["outcome"]["status"] == "succeeded").then_some(answer)
    })
    .await;
    assert!(served.is_some(), "{}", a.logs.lock().unwrap());
    assert!(
        a.child.as_mut().unwrap().try_wait().unwrap().is_none(),
        "the same process serves"
    );
    let (after, _, released) = newest_worker(&schema, a.folder.path())
        .await
        .expect("a's worker");
    assert_ne!(after, before, "a new incarnation holds the node");
    assert!(!released);
    let logs = a.logs.lock().unwrap().clone();
    assert!(logs.contains("serves again as a new worker"), "{logs}");
    drop(b);
}

/// One script call over a turn's socket: (status, the `Toolgate-Ordinal`
/// header if any, the answer).
fn script_call(socket: &Path, token: &str, body: &Value) -> (u16, Option<u32>, Value) {
    // A node that stopped has no socket: as a turn closed under it.
    let Ok(stream) = std::os::unix::net::UnixStream::connect(socket) else {
        return (410, None, json!({"error": {"code": "turn_closed"}}));
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut stream = stream;
    use std::io::{Read as _, Write as _};
    let body = body.to_string();
    let request = format!(
        "POST /v1/call HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: Bearer {token}\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut response = Vec::new();
    if stream.write_all(request.as_bytes()).is_err() || stream.read_to_end(&mut response).is_err() {
        return (410, None, json!({"error": {"code": "turn_closed"}}));
    }
    let text = String::from_utf8_lossy(&response).into_owned();
    // A node that stopped mid-answer: as a turn closed under it.
    let Some((head, answer)) = text.split_once("\r\n\r\n") else {
        return (410, None, json!({"error": {"code": "turn_closed"}}));
    };
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let ordinal = head.lines().find_map(|line| {
        line.to_ascii_lowercase()
            .strip_prefix("toolgate-ordinal:")
            .and_then(|value| value.trim().parse().ok())
    });
    (status, ordinal, json_of(answer.as_bytes()))
}

/// Opens a turn for `script` on `served`: (socket, token).
fn open_turn(served: &Served, session: Uuid, run_id: Uuid, script: &str) -> (PathBuf, String) {
    let (status, turn) = served.post(
        "/v1/turns",
        &json!({"session_id": session, "run_id": run_id, "step_number": 1,
                "script_sha256": sha256(script), "origin_trust": "user"}),
    );
    assert_eq!(status, 200, "{turn}");
    (
        PathBuf::from(turn["socket_path"].as_str().unwrap()),
        turn["token"].as_str().unwrap().to_owned(),
    )
}

/// A call whose row another node took while its own node was paused: the
/// answer is the row's outcome, or "in progress" with the ordinal given
/// back, so the script's retry is the same call (same call id, one row);
/// replayed on the other node it reads that one row's outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_for_a_call_another_node_took_keeps_its_call_id() {
    let Some(schema) = PgSchema::create().await else {
        eprintln!("DATABASE_URL unset: the node tests run on PostgreSQL only");
        return;
    };
    let store = owner_store(&schema).await;
    let (_folder, effects) = effects_file();
    let a = node(&schema.url, &effects, 0, FAST_NODE, &[]);
    let b = node(&schema.url, &effects, 0, FAST_NODE, &[]);
    let session = a.session();
    let run_id = Uuid::new_v4();
    let script = "taken over script";
    let (socket, token) = open_turn(&a, session, run_id, script);
    let body = json!({"call": "mcp.reads.sleep", "arguments": {"seconds": 4}});
    let first = {
        let (socket, token, body) = (socket.clone(), token.clone(), body.clone());
        std::thread::spawn(move || script_call(&socket, &token, &body))
    };
    let running = row_where(&store, run_id, Duration::from_secs(20), |row| {
        row.status() == InvocationStatus::Running
    })
    .await
    .expect("the call is running on a");
    let pid = nix::unistd::Pid::from_raw(a.pid().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    row_where(&store, run_id, Duration::from_secs(20), |row| {
        row.state.worker() != running.state.worker()
    })
    .await
    .expect("b takes the call over");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let (status, ordinal, answer) = first.join().unwrap();
    assert_eq!(status, 200, "{answer}");
    let unsettled = |answer: &Value| {
        matches!(
            answer["reason_code"].as_str(),
            Some("tool.concurrency_conflict" | "tool.record_unavailable")
        )
    };
    if unsettled(&answer) {
        assert_eq!(
            ordinal, None,
            "an unsettled answer gives its ordinal back: {answer}"
        );
        // Asked again on a while it is still up: the same call, never a
        // second one. (A settled first answer used its ordinal: the script
        // asking again would be making a new call, which it does not.)
        let (status, ordinal, again) = script_call(&socket, &token, &body);
        if status == 200 && !unsettled(&again) {
            assert_eq!(ordinal, Some(0), "the same call: {again}");
        }
    } else {
        // b finished first and a read its row: the row's outcome.
        assert_eq!(ordinal, Some(0), "{answer}");
        assert_eq!(answer["status"], "succeeded", "{answer}");
    }
    // Replayed on b: the one row's outcome.
    let (socket, token) = open_turn(&b, session, run_id, script);
    let settled = eventually(Duration::from_secs(30), || async {
        let (status, ordinal, answer) = script_call(&socket, &token, &body);
        (status == 200 && answer["status"] == "succeeded").then_some((ordinal, answer))
    })
    .await
    .expect("the replay reads the call's outcome");
    assert_eq!(settled.0, Some(0), "{}", settled.1);
    let rows = store.run_invocations(TENANT, run_id).await.unwrap();
    assert_eq!(rows.len(), 1, "one call, one row: {rows:?}");
    assert_eq!(rows[0].status(), InvocationStatus::Succeeded);
}

/// A PostgreSQL server of the test's own, which it may kill.
pub struct OwnPostgres {
    folder: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    /// `name=value` server settings beyond its defaults.
    settings: Vec<String>,
}

impl OwnPostgres {
    fn as_postgres(&self, program: &str, args: &[&str]) -> std::process::Output {
        Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join(program))
            .args(args)
            .output()
            .expect("runuser runs")
    }

    fn start() -> Option<OwnPostgres> {
        OwnPostgres::start_with(&[])
    }

    /// A server run with `settings` (`name=value`); none when its binaries
    /// are missing and PostgreSQL is not required.
    pub fn start_with(settings: &[&str]) -> Option<OwnPostgres> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .flatten()
            .map(|entry| entry.path().join("bin"))
            .find(|bin| bin.join("initdb").exists());
        let Some(bin) = bin else {
            assert!(
                !required(),
                "PostgreSQL's server binaries are not installed"
            );
            return None;
        };
        let folder = tempfile::tempdir().unwrap();
        let (uid, gid) = postgres_user();
        std::os::unix::fs::chown(folder.path(), Some(uid), Some(gid)).unwrap();
        let own = OwnPostgres {
            folder,
            bin,
            port: free_port(),
            settings: settings
                .iter()
                .map(|setting| (*setting).to_owned())
                .collect(),
        };
        let data = own.data();
        let initdb = own.as_postgres(
            "initdb",
            &["-D", &data, "-A", "trust", "-U", "postgres", "--no-sync"],
        );
        assert!(initdb.status.success(), "{initdb:?}");
        own.up();
        Some(own)
    }

    fn data(&self) -> String {
        self.folder.path().join("data").display().to_string()
    }

    fn up(&self) {
        let mut options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.folder.path().display()
        );
        for setting in &self.settings {
            options.push_str(" -c ");
            options.push_str(setting);
        }
        let started = self.as_postgres(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-o",
                &options,
                "-l",
                &self.folder.path().join("log").display().to_string(),
                "-w",
                "start",
            ],
        );
        assert!(started.status.success(), "{started:?}");
    }

    /// Kills the server outright, as a crash would.
    fn kill(&self) {
        let stopped = self.as_postgres("pg_ctl", &["-D", &self.data(), "-m", "immediate", "stop"]);
        assert!(stopped.status.success(), "{stopped:?}");
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = self.as_postgres("pg_ctl", &["-D", &self.data(), "-m", "immediate", "stop"]);
    }
}

fn postgres_user() -> (u32, u32) {
    let user = nix::unistd::User::from_name("postgres")
        .ok()
        .flatten()
        .expect("the postgres user exists");
    (user.uid.as_raw(), user.gid.as_raw())
}

/// The database dies while a call runs and comes back: a non-idempotent
/// call whose effect was applied answers `uncertain` (what its row will
/// hold), never `failed`, and the row is settled so (in the review queue)
/// without a restart; a read answers "ask again" and the same call, asked
/// again once the database is back, gets the result the node kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_dying_mid_call_never_makes_an_answer_false() {
    let Some(postgres) = OwnPostgres::start() else {
        eprintln!("no PostgreSQL server binaries: the database-failure test is skipped");
        return;
    };
    let setup = PostgresStore::connect(&postgres.url()).await.unwrap();
    setup.migrate().await.unwrap();
    let (_folder, effects) = effects_file();
    // A long lease: the outage is shorter, so the node keeps it.
    let a = node(
        &postgres.url(),
        &effects,
        3000,
        "\n[node]\nlease_seconds = 60\nheartbeat_seconds = 2\nsweep_seconds = 2\n",
        &[],
    );
    let session = a.session();

    // A non-idempotent write: its effect lands while the database is down
    // (held at the gate until it is).
    let gate = Gate::of(&effects);
    gate.shut();
    let run_id = Uuid::new_v4();
    let write = call_in_background(
        &a,
        session,
        run_id,
        "mcp.writes.write",
        json!({"line": "while the database is down"}),
    );
    row_where(&setup, run_id, Duration::from_secs(20), |row| {
        row.effect_sent_at.is_some()
    })
    .await
    .expect("the write is under way");
    postgres.kill();
    gate.open();
    let (status, answer) = write.join().unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["results"][0]["outcome"]["status"], "uncertain",
        "{answer}"
    );
    assert_eq!(
        std::fs::read_to_string(&effects)
            .unwrap_or_default()
            .lines()
            .count(),
        1
    );
    postgres.up();
    let settled = row_where(&setup, run_id, Duration::from_secs(60), |row| {
        row.status().is_terminal()
    })
    .await
    .expect("the node settles the row once the database is back");
    assert_eq!(settled.status(), InvocationStatus::Uncertain);
    let (status, queue) = a.get(&format!("/v1/review?tenant_id={TENANT}"));
    assert_eq!(status, 200);
    assert!(
        String::from_utf8_lossy(&queue).contains(&settled.identity.id.to_string()),
        "the review queue shows it without a restart"
    );

    // A read: "ask again", and asked again it is the result the node kept.
    // It answers only once the database is down.
    gate.shut();
    let run_id = Uuid::new_v4();
    let read = call_in_background(
        &a,
        session,
        run_id,
        "mcp.reads.sleep",
        json!({"seconds": 3}),
    );
    row_where(&setup, run_id, Duration::from_secs(20), |row| {
        row.status() == InvocationStatus::Running
    })
    .await
    .expect("the read is under way");
    postgres.kill();
    gate.open();
    let (status, answer) = read.join().unwrap();
    assert_eq!(status, 200, "{answer}");
    let outcome = &answer["results"][0]["outcome"];
    assert_eq!(
        outcome["reason_code"], "tool.record_unavailable",
        "{answer}"
    );
    assert_eq!(outcome["retryable"], true);
    postgres.up();
    let again = eventually(Duration::from_secs(60), || async {
        let (status, answer) = a.post(
            "/v1/calls",
            &json!({"session_id": session, "run_id": run_id, "step_number": 1,
                "origin_trust": "user",
                "calls": [{"call_id": "c1", "name": "mcp.reads.sleep", "arguments": {"seconds": 3}}]}),
        );
        (status == 200 && answer["results"][0]["outcome"]["status"] == "succeeded")
            .then_some(answer)
    })
    .await
    .expect("asked again, the same call has its result");
    let rows = setup.run_invocations(TENANT, run_id).await.unwrap();
    assert_eq!(rows.len(), 1, "{again}");
    assert_eq!(rows[0].attempt_number, 1, "the kept result, not a re-run");
}

/// A node that cannot renew its lease (its database gone) stops claiming and
/// says it is not ready before the lease can run out on the store, so no
/// other node takes a call it still serves; with the database back it
/// serves again (renewed in time, or as a new worker), never restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_cannot_renew_stops_serving_before_its_lease_ends() {
    let Some(postgres) = OwnPostgres::start() else {
        eprintln!("no PostgreSQL server binaries: the renewal test is skipped");
        return;
    };
    let setup = PostgresStore::connect(&postgres.url()).await.unwrap();
    setup.migrate().await.unwrap();
    let (_folder, effects) = effects_file();
    let ops = free_port();
    let lease = Duration::from_secs(9);
    let a = node(
        &postgres.url(),
        &effects,
        0,
        &format!(
            "\n[node]\nlease_seconds = 9\nheartbeat_seconds = 3\nsweep_seconds = 3\n\n[ops]\nlisten = \"127.0.0.1:{ops}\"\n"
        ),
        &[],
    );
    let session = a.session();
    assert_eq!(get_tcp(ops, "/readyz").0, 200);
    // The lease was last renewed before this instant, so it ends on the
    // store's clock no later than a lease from now.
    let killed = Instant::now();
    postgres.kill();
    let (status, body) = eventually(lease, || async {
        let (status, body) = get_tcp(ops, "/readyz");
        (status != 200).then_some((status, body))
    })
    .await
    .expect("not ready before the lease could end");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("lease_not_live") || body.contains("store_unavailable"),
        "{body}"
    );
    assert!(killed.elapsed() < lease, "{:?}", killed.elapsed());
    // Once the lease is past its local view, calls are refused unrecorded
    // (retryable: the same call asked again is served where a lease lives).
    tokio::time::sleep(lease.saturating_sub(killed.elapsed())).await;
    let (status, answer) = a.post(
        "/v1/calls",
        &json!({"session_id": session, "run_id": Uuid::new_v4(), "step_number": 1,
            "origin_trust": "user",
            "calls": [{"call_id": "c1", "name": "demo.echo", "arguments": {"text": "no lease"}}]}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["results"][0]["outcome"]["reason_code"], "tool.record_unavailable",
        "{answer}"
    );
    assert_eq!(answer["results"][0]["outcome"]["retryable"], true);
    postgres.up();
    eventually(Duration::from_secs(30), || async {
        (get_tcp(ops, "/readyz").0 == 200).then_some(())
    })
    .await
    .expect("ready again once the store answers");
    let (_, answer) = a.post(
        "/v1/calls",
        &json!({"session_id": session, "run_id": Uuid::new_v4(), "step_number": 1,
            "origin_trust": "user",
            "calls": [{"call_id": "c1", "name": "demo.echo", "arguments": {"text": "renewed"}}]}),
    );
    assert_eq!(
        answer["results"][0]["outcome"]["status"], "succeeded",
        "{answer}"
    );
    let mut a = a;
    assert!(
        a.child.as_mut().unwrap().try_wait().unwrap().is_none(),
        "the same process serves"
    );
}

/// Ready means ready: not before the warm-up's first round (or its bound),
/// then ready, with sessions pinning the warmed servers without connecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_waits_for_the_warm_up_within_its_bound() {
    let Some(schema) = PgSchema::create().await else {
        eprintln!("DATABASE_URL unset: the node tests run on PostgreSQL only");
        return;
    };
    let (_folder, effects) = effects_file();
    let ops = free_port();
    // Four servers that never answer their handshakes, each warmed for at
    // most four seconds, one after another: the warm-up's first round lasts
    // sixteen seconds, four times readiness's bound.
    let mut silent = format!("{FAST_NODE}\n[ops]\nlisten = \"127.0.0.1:{ops}\"\n");
    for server in 0..4 {
        silent.push_str(&format!(
            "\n[[mcp.servers]]\nserver_id = \"silent{server}\"\n\
             command = \"/bin/sleep\"\nargs = [\"3600\"]\nconnect_timeout_seconds = 1\n"
        ));
    }
    let started = Instant::now();
    let a = node_with(
        &schema.url,
        &effects,
        0,
        "warmup_connect_timeout_seconds = 4",
        &silent,
        &[],
    );
    let (status, body) = get_tcp(ops, "/readyz");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("warming_up"), "{body}");
    let ready = eventually(Duration::from_secs(30), || async {
        (get_tcp(ops, "/readyz").0 == 200).then(Instant::now)
    })
    .await
    .expect("ready once the warm-up's bound passed");
    assert!(
        ready - started >= Duration::from_secs(3),
        "not before its bound"
    );
    // Ready at its bound, not when the warm-up's first round ends.
    assert!(
        ready - started < Duration::from_secs(12),
        "ready {:?} after the start: it waited for the whole warm-up, not its bound",
        ready - started
    );
    // The servers the warm-up reached are pinned without a handshake.
    a.session();
    let (_, events) = a.get("/v1/events?after=0");
    let events = String::from_utf8_lossy(&events);
    let pinned: Vec<Value> = events
        .lines()
        .map(|line| json_of(line.as_bytes()))
        .filter(|event| event["event_type"] == "mcp.server.pinned")
        .collect();
    assert!(
        ["reads", "writes"].iter().all(|server| pinned
            .iter()
            .any(|event| event["payload"]["server"] == *server)),
        "{events}"
    );
    assert!(!events.contains("mcp.server.connected"), "{events}");
}

/// What one call of a load was answered: the line it wrote, and its
/// outcome's status (or what refused it).
#[derive(Debug)]
struct Answered {
    line: String,
    status: String,
}

/// A script on a turn held open throughout and a front-door client on a
/// session of its own, each writing a line of its own per call until `stop`.
fn load(
    node: usize,
    served: &Served,
    front: crate::front::Client,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<std::thread::JoinHandle<Vec<Answered>>> {
    use std::sync::atomic::Ordering;
    let session = served.session();
    let (mut socket, mut token) = open_turn(served, session, Uuid::new_v4(), "outage script");
    let control = served.socket.clone();
    let script = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut answers = Vec::new();
            let (mut written, mut in_turn) = (0, 0);
            while !stop.load(Ordering::Relaxed) {
                if in_turn == 50 {
                    // The next turn, before this one's call cap (64).
                    let (status, turn) = crate::serve::post_json(
                        &control,
                        "/v1/turns",
                        &json!({"session_id": session, "run_id": Uuid::new_v4(), "step_number": 1,
                                "script_sha256": sha256("outage script"), "origin_trust": "user"}),
                    );
                    if status != 200 {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                    socket = PathBuf::from(turn["socket_path"].as_str().unwrap());
                    token = turn["token"].as_str().unwrap().to_owned();
                    in_turn = 0;
                }
                let line = format!("node{node}-script-{written}");
                let body = json!({"call": "mcp.writes.write", "arguments": {"line": line}});
                let (status, _, answer) = script_call(&socket, &token, &body);
                // As a script does: the call asked again while its answer
                // says to (its ordinal was given back: the same call).
                if !(status == 200 && answer["retryable"] == true) {
                    written += 1;
                    in_turn += 1;
                }
                let status = match answer["status"].as_str() {
                    Some(outcome) if status == 200 => {
                        format!("script {outcome} {}", answer["reason_code"])
                    }
                    _ => format!("http {status} {}", answer["error"]["code"]),
                };
                answers.push(Answered { line, status });
                std::thread::sleep(Duration::from_millis(20));
            }
            answers
        })
    };
    let mcp_session = front.open(crate::front::KEY_A);
    let client = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut answers = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let line = format!("node{node}-front-{}", answers.len());
                let answer = front.rpc(
                    Some(crate::front::KEY_A),
                    Some(&mcp_session),
                    &json!({"jsonrpc": "2.0", "id": answers.len(), "method": "tools/call",
                            "params": {"name": "mcp-writes-write", "arguments": {"line": line}}}),
                );
                let last = answer.last();
                let status = match last["result"]["_meta"]["toolgate/status"].as_str() {
                    Some(outcome) => format!(
                        "front {outcome} {}",
                        last["result"]["structuredContent"]["reason_code"]
                    ),
                    None => format!("front http {} rpc {}", answer.status, last["error"]["code"]),
                };
                answers.push(Answered { line, status });
                std::thread::sleep(Duration::from_millis(20));
            }
            answers
        })
    };
    vec![script, client]
}

/// Whether `served` serves a call now.
fn serves(served: &Served) -> bool {
    let (_, answer) = served.post(
        "/v1/calls",
        &json!({"session_id": served.session(), "run_id": Uuid::new_v4(), "step_number": 1,
            "origin_trust": "user",
            "calls": [{"call_id": "c1", "name": "demo.echo", "arguments": {"text": "probe"}}]}),
    );
    answer["results"][0]["outcome"]["status"] == "succeeded"
}

/// The store stopped under load of scripts and front-door clients on
/// `count` nodes, for less than, about and several times the lease: no
/// node exits or is restarted, every answer is true, no effect happens
/// twice, and every node serves again within seconds of the store's return.
async fn a_store_outage_of_any_length_is_survived(count: usize) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let Some(postgres) = OwnPostgres::start() else {
        eprintln!("no PostgreSQL server binaries: the outage test is skipped");
        return;
    };
    let setup = PostgresStore::connect(&postgres.url()).await.unwrap();
    setup.migrate().await.unwrap();
    let (_folder, effects) = effects_file();
    let lease = Duration::from_secs(3);
    let mut nodes: Vec<(Served, crate::front::Client)> = (0..count)
        .map(|_| {
            let port = free_port();
            let served = node(
                &postgres.url(),
                &effects,
                0,
                &format!("{FAST_NODE}\n{}", crate::front::front_table(port, "")),
                &[],
            );
            let door = crate::front::Door::wait(served, port);
            let client = *door;
            (door.served, client)
        })
        .collect();
    let pids: Vec<Option<u32>> = nodes.iter().map(|(served, _)| served.pid()).collect();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = nodes
        .iter()
        .enumerate()
        .flat_map(|(index, (served, front))| load(index, served, *front, &stop))
        .collect();
    let mut figures = Vec::new();
    // The clients' writes land, each a line: the load is served.
    let written = || {
        std::fs::read_to_string(&effects)
            .unwrap_or_default()
            .lines()
            .count()
    };
    let load_served = |since: usize| {
        let needed = since + 2 * count;
        eventually(Duration::from_secs(60), move || async move {
            (written() >= needed).then_some(())
        })
    };
    for outage in [lease / 3, lease, lease * 3] {
        load_served(written())
            .await
            .expect("the load is served before the outage");
        postgres.kill();
        tokio::time::sleep(outage).await;
        postgres.up();
        let back = Instant::now();
        let mut again = Vec::new();
        for (served, _) in &nodes {
            let served_again = eventually(Duration::from_secs(30), || async {
                serves(served).then_some(back.elapsed())
            })
            .await;
            let Some(elapsed) = served_again else {
                panic!(
                    "a node does not serve {:?} after an outage of {outage:?}: {}",
                    back.elapsed(),
                    served.logs.lock().unwrap()
                );
            };
            again.push(elapsed);
        }
        figures.push((outage, again));
    }
    load_served(written())
        .await
        .expect("the load is served again after the last outage");
    stop.store(true, Ordering::Relaxed);
    let answers: Vec<Answered> = clients
        .into_iter()
        .flat_map(|client| client.join().unwrap())
        .collect();

    // Nothing exited or was restarted.
    for ((served, _), pid) in nodes.iter_mut().zip(&pids) {
        assert_eq!(served.pid(), *pid);
        assert!(
            served.child.as_mut().unwrap().try_wait().unwrap().is_none(),
            "a node exited: {}",
            served.logs.lock().unwrap()
        );
        // Said once per change of state, not once a retry.
        let logs = served.logs.lock().unwrap();
        assert!(
            logs.matches("the lease cannot be renewed").count() <= 3,
            "{logs}"
        );
    }
    // No effect twice, and every answer true: what succeeded happened once.
    let written = std::fs::read_to_string(&effects).unwrap();
    let mut times = std::collections::HashMap::<&str, usize>::new();
    for line in written.lines() {
        *times.entry(line).or_default() += 1;
    }
    let twice: Vec<_> = times.iter().filter(|(_, count)| **count > 1).collect();
    assert!(twice.is_empty(), "effects applied twice: {twice:?}");
    let mut by_status = std::collections::BTreeMap::<&str, usize>::new();
    for answered in &answers {
        *by_status.entry(answered.status.as_str()).or_default() += 1;
        let applied = times.get(answered.line.as_str()).copied().unwrap_or(0);
        if answered.status.contains(" succeeded ") {
            assert_eq!(applied, 1, "{answered:?}");
        }
        assert!(
            !answered.status.contains("turn_closed"),
            "the turn stays open: {answered:?}"
        );
    }
    assert!(
        by_status
            .keys()
            .any(|status| status.contains(" succeeded "))
    );
    eprintln!(
        "outages on {count} node(s) (lease {lease:?}): served again after {figures:?}; \
         answers {by_status:?}; {} effects, none twice",
        written.lines().count()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_of_any_length_is_survived_by_one_node() {
    a_store_outage_of_any_length_is_survived(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_of_any_length_is_survived_by_three_nodes() {
    a_store_outage_of_any_length_is_survived(3).await;
}

/// Debian's PgBouncer in front of the shared PostgreSQL, run as its
/// `postgres` user: database `transaction` pools per transaction, database
/// `session` per session, both onto a database of the test's own, with two
/// servers each so a client's statements hop between them.
struct PgBouncer {
    /// Its configuration and log, kept while it runs.
    _folder: tempfile::TempDir,
    port: u16,
    child: std::process::Child,
    database: String,
    admin_url: String,
}

impl PgBouncer {
    fn start() -> Option<PgBouncer> {
        let binary = Path::new("/usr/sbin/pgbouncer");
        if !binary.exists() {
            assert!(
                !required(),
                "pgbouncer is not installed (apt-get install pgbouncer)"
            );
            return None;
        }
        let Ok(admin_url) = std::env::var("DATABASE_URL") else {
            assert!(
                !required(),
                "DATABASE_URL is unset and this run requires PostgreSQL"
            );
            return None;
        };
        let database = format!("bouncer_{}", Uuid::new_v4().simple());
        let created = Command::new("psql")
            .args([
                admin_url.as_str(),
                "-q",
                "-c",
                &format!("CREATE DATABASE {database}"),
            ])
            .output()
            .expect("psql runs");
        assert!(created.status.success(), "{created:?}");
        let (host, server_port) = {
            let rest = admin_url.split('@').nth(1).expect("a host in DATABASE_URL");
            let address = rest.split('/').next().unwrap_or(rest);
            let (host, port) = address.split_once(':').unwrap_or((address, "5432"));
            (host.to_owned(), port.to_owned())
        };
        let folder = tempfile::tempdir().unwrap();
        let (uid, gid) = postgres_user();
        std::os::unix::fs::chown(folder.path(), Some(uid), Some(gid)).unwrap();
        let port = free_port();
        let at = |name: &str| folder.path().join(name).display().to_string();
        let target = format!("host={host} port={server_port} dbname={database} user=postgres");
        std::fs::write(
            at("pgbouncer.ini"),
            format!(
                "[databases]\ntransaction = {target} pool_mode=transaction\n\
                 session = {target} pool_mode=session\n\n\
                 [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {users}\ndefault_pool_size = 2\n\
                 max_client_conn = 200\nlogfile = {log}\npidfile = {pid}\n",
                users = at("users.txt"),
                log = at("pgbouncer.log"),
                pid = at("pgbouncer.pid"),
            ),
        )
        .unwrap();
        std::fs::write(at("users.txt"), "\"postgres\" \"\"\n").unwrap();
        for name in ["pgbouncer.ini", "users.txt"] {
            std::os::unix::fs::chown(folder.path().join(name), Some(uid), Some(gid)).unwrap();
        }
        let child = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(binary)
            .arg(at("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("pgbouncer starts");
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "pgbouncer listens"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(PgBouncer {
            _folder: folder,
            port,
            child,
            database,
            admin_url,
        })
    }

    fn url(&self, mode: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{mode}", self.port)
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("psql")
            .args([
                self.admin_url.as_str(),
                "-q",
                "-c",
                &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.database),
            ])
            .output();
    }
}

/// toolgate behind PgBouncer. Pooling per transaction, undeclared, is
/// refused at start with what to change; declared
/// (`store.transaction_pooling`), a node migrates and serves calls and
/// scripts from several clients at once, its statements hopping between
/// two servers, every answer whole and every effect once. Pooling per
/// session needs nothing declared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toolgate_works_behind_pgbouncer() {
    let Some(bouncer) = PgBouncer::start() else {
        eprintln!("no pgbouncer or PostgreSQL: the pooler test is skipped");
        return;
    };
    let refused = PostgresStore::connect(&bouncer.url("transaction")).await;
    let Err(error) = refused else {
        panic!("pooling per transaction, undeclared, was accepted");
    };
    assert!(
        error.to_string().contains("store.transaction_pooling"),
        "{error}"
    );
    // Per session: nothing to declare.
    let session = PostgresStore::connect(&bouncer.url("session"))
        .await
        .unwrap();
    assert!(session.pending_migrations().await.is_ok());
    drop(session);

    let (_folder, effects) = effects_file();
    let url = bouncer.url("transaction");
    let served = Served::here().start_edited(
        {
            let effects = effects.display().to_string();
            move |root, config| {
                let config = config
                    .replace(
                        "url = \"sqlite://toolgate.db\"",
                        &format!("url = \"{url}\"\ntransaction_pooling = true"),
                    )
                    .replace(
                        &format!(
                            "SCRIPTED_EFFECTS = \"{}\"",
                            root.join("writes.effects").display()
                        ),
                        &format!("SCRIPTED_EFFECTS = \"{effects}\""),
                    );
                assert!(config.contains("transaction_pooling"), "{config}");
                config
            }
        },
        &[],
    );
    let session = served.session();
    // Eight clients at once: calls through the control API and a script.
    let clients: Vec<_> = (0..8)
        .map(|client| {
            let control = served.socket.clone();
            std::thread::spawn(move || {
                let mut answers = Vec::new();
                for call in 0..10 {
                    let line = format!("client{client}-{call}");
                    let (status, answer) = crate::serve::post_json(
                        &control,
                        "/v1/calls",
                        &json!({"session_id": session, "run_id": Uuid::new_v4(), "step_number": 1,
                            "origin_trust": "user",
                            "calls": [{"call_id": "c1", "name": "mcp.writes.write", "arguments": {"line": line}},
                                      {"call_id": "c2", "name": "demo.echo", "arguments": {"text": line}}]}),
                    );
                    answers.push((line, status, answer));
                }
                answers
            })
        })
        .collect();
    let (socket, token) = open_turn(&served, session, Uuid::new_v4(), "bouncer script");
    for call in 0..10 {
        let line = format!("script-{call}");
        let (status, _, answer) = script_call(
            &socket,
            &token,
            &json!({"call": "mcp.writes.write", "arguments": {"line": line}}),
        );
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["status"], "succeeded", "{answer}");
    }
    let mut lines = 10;
    for client in clients {
        for (line, status, answer) in client.join().unwrap() {
            assert_eq!(status, 200, "{line}: {answer}");
            for result in answer["results"].as_array().unwrap() {
                assert_eq!(result["outcome"]["status"], "succeeded", "{line}: {answer}");
            }
            lines += 1;
        }
    }
    let written = std::fs::read_to_string(&effects).unwrap();
    assert_eq!(written.lines().count(), lines, "every effect once");
    let unique: std::collections::BTreeSet<&str> = written.lines().collect();
    assert_eq!(unique.len(), lines);
}
