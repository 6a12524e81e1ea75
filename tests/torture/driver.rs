//! The crash torture: a real `toolgate serve` with a stdio MCP server whose
//! one tool has a real non-idempotent effect (a line appended to a file and
//! fsynced: the ground truth), concurrent scripts calling it through the
//! bridge, `serve` killed with SIGKILL at random moments and started again,
//! and every script re-run in a new turn for the same run and step until all
//! its calls have settled. Judged at the end against the effects file.
//!
//! Shared by the integration tests (a small run, in CI) and by
//! `cargo bench --bench torture` (a large one, by hand).

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

/// What a torture run is given.
pub struct Torture {
    /// The `toolgate` binary.
    pub toolgate: PathBuf,
    /// The scripted MCP server binary.
    pub server: PathBuf,
    /// A `postgres://` URL, or `None` for the embedded SQLite store.
    pub store_url: Option<String>,
    /// How many times `serve` is killed.
    pub kills: usize,
    /// New scripts started in each cycle (beside the re-runs of unfinished
    /// ones), so every kill lands on work in flight.
    pub scripts: usize,
    /// Calls each script makes.
    pub calls: usize,
    /// Seeds the kill moments.
    pub seed: u64,
}

/// How the calls ended, counted against the effects file.
#[derive(Debug, Default, Clone)]
pub struct Figures {
    /// Kills made.
    pub kills: usize,
    /// Calls made (scripts × calls).
    pub calls: usize,
    /// Effects applied more than once: must be zero.
    pub duplicates: usize,
    /// Succeeded, and the effect exists once.
    pub succeeded_applied: usize,
    /// Succeeded without its effect: must be zero.
    pub succeeded_missing: usize,
    /// Uncertain, and the effect exists.
    pub uncertain_applied: usize,
    /// Uncertain, and nothing was applied.
    pub uncertain_none: usize,
    /// Failed or unavailable, and nothing applied.
    pub failed_none: usize,
    /// Failed or unavailable, yet the effect exists: must be zero.
    pub failed_applied: usize,
    /// Calls with no settled answer at the end: must be zero.
    pub unsettled: usize,
    /// From each restart to the settled answer of a call that was in
    /// flight when `serve` was killed, in milliseconds.
    pub restart_to_settled_ms: Vec<u64>,
}

impl Figures {
    /// Whether the run kept every promise.
    pub fn sound(&self) -> bool {
        self.duplicates == 0
            && self.succeeded_missing == 0
            && self.failed_applied == 0
            && self.unsettled == 0
    }

    /// (p50, max) of restart-to-settled, in milliseconds.
    pub fn restart_to_settled(&self) -> (u64, u64) {
        let mut sorted = self.restart_to_settled_ms.clone();
        sorted.sort_unstable();
        let p50 = sorted.get(sorted.len() / 2).copied().unwrap_or(0);
        (p50, sorted.last().copied().unwrap_or(0))
    }
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (p50, max) = self.restart_to_settled();
        write!(
            f,
            "kills {}, calls {}, duplicates {}, succeeded/applied {}, succeeded/missing {}, \
             uncertain/applied {}, uncertain/none {}, failed/none {}, failed/applied {}, \
             unsettled {}, restart-to-settled p50 {} ms max {} ms (n={})",
            self.kills,
            self.calls,
            self.duplicates,
            self.succeeded_applied,
            self.succeeded_missing,
            self.uncertain_applied,
            self.uncertain_none,
            self.failed_none,
            self.failed_applied,
            self.unsettled,
            p50,
            max,
            self.restart_to_settled_ms.len()
        )
    }
}

/// A small deterministic generator for the kill moments.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % below.max(1)
    }
}

/// One HTTP/1.1 exchange over a unix socket; `None` when the peer went away
/// before a whole answer (killed).
fn exchange(
    socket: &Path,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> Option<(u16, Value)> {
    let mut stream = UnixStream::connect(socket).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .ok()?;
    let authorization = token
        .map(|token| format!("Authorization: Bearer {token}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{authorization}\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).ok()?;
    let text = String::from_utf8_lossy(&answer);
    let split = text.find("\r\n\r\n")?;
    let status = text.get(9..12)?.parse().ok()?;
    let value = serde_json::from_str(&text[split + 4..]).ok()?;
    Some((status, value))
}

struct Node {
    toolgate: PathBuf,
    folder: PathBuf,
    socket: PathBuf,
    child: Option<Child>,
}

impl Node {
    fn start(&mut self) {
        let child = Command::new(&self.toolgate)
            .args(["serve", "--migrate", "--config"])
            .arg(self.folder.join("toolgate.toml"))
            .env_remove("TOOLGATE_STORE_URL")
            .env_remove("TOOLGATE_CONTROL_SOCKET")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("toolgate serve starts");
        self.child = Some(child);
        let started = Instant::now();
        while UnixStream::connect(&self.socket).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "serve did not listen"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = child.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Scripts run at once: fewer than the node's connection caps.
const SCRIPTS_AT_ONCE: usize = 12;
/// Rounds of the final pass before what is left counts as unsettled.
const DRAIN_ROUNDS: usize = 200;

/// One script's state across turns: its run, hash, and the answer each
/// ordinal settled with.
#[derive(Clone)]
struct Script {
    run: Uuid,
    hash: String,
    settled: BTreeMap<usize, String>,
}

fn sha256(text: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(text.as_bytes());
    digest.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn line(script: usize, call: usize) -> String {
    format!("s{script}-c{call}")
}

/// What a re-run after a restart times: from the restart to the settled
/// answer of each call that was in flight at the kill.
struct Timing<'a> {
    restarted: Option<Instant>,
    times: &'a Mutex<Vec<u64>>,
    in_flight: &'a BTreeMap<usize, ()>,
}

/// Runs one script up to (not including) ordinal `calls`, or until `serve`
/// goes away: a new turn, the calls in order (each settled ordinal answered
/// from the record). Returns the ordinal in flight when the node went away.
fn run_script(
    socket: &Path,
    session: Uuid,
    index: usize,
    script: &Mutex<Script>,
    calls: usize,
    timing: Timing<'_>,
) -> Option<usize> {
    let Timing {
        restarted,
        times: restart_to_settled,
        in_flight: was_in_flight,
    } = timing;
    let (run, hash) = {
        let script = script.lock().unwrap();
        (script.run, script.hash.clone())
    };
    let open = json!({"session_id": session, "run_id": run, "step_number": 1,
                      "script_sha256": hash, "origin_trust": "user"});
    // A turn that could not be opened (the node is away, or its
    // connections are all taken) leaves the script to a later pass.
    let Some((status, turn)) = exchange(socket, "POST", "/v1/turns", None, &open.to_string())
    else {
        return Some(0);
    };
    if status != 200 {
        return Some(0);
    }
    let turn_socket = PathBuf::from(turn["socket_path"].as_str()?);
    let token = turn["token"].as_str()?.to_owned();
    for ordinal in 0..calls {
        let asked = Instant::now();
        loop {
            let body = json!({"call": "mcp.writes.write",
                              "arguments": {"line": line(index, ordinal)}});
            let answer = exchange(
                &turn_socket,
                "POST",
                "/v1/call",
                Some(&token),
                &body.to_string(),
            );
            let Some((_, answer)) = answer else {
                return Some(ordinal);
            };
            let status = answer["status"].as_str().unwrap_or_default().to_owned();
            if matches!(
                answer["reason_code"].as_str(),
                Some("tool.concurrency_conflict" | "tool.record_unavailable")
            ) {
                // Unsettled (PROTOCOL.md's two answers that give the ordinal
                // back): still held by a worker (this node's recovery, or a
                // predecessor's lease), or not recorded while the store
                // failed under it. Asked again, as a runtime would: the same
                // call, answered by what its row ends with. A store away for
                // long leaves the script to a later pass, which replays it.
                if asked.elapsed() > Duration::from_secs(30) {
                    return Some(ordinal);
                }
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            if status.is_empty() {
                // An edge refusal (the turn closed under a drain): the node
                // is going away.
                return Some(ordinal);
            }
            if let Some(restarted) = restarted
                && was_in_flight.contains_key(&ordinal)
                && !script.lock().unwrap().settled.contains_key(&ordinal)
            {
                restart_to_settled
                    .lock()
                    .unwrap()
                    .push(u64::try_from(restarted.elapsed().as_millis()).unwrap_or(u64::MAX));
            }
            script.lock().unwrap().settled.insert(ordinal, status);
            break;
        }
    }
    None
}

/// Runs the torture and judges it.
pub fn run(torture: &Torture) -> Figures {
    let folder = tempfile::tempdir().expect("a folder");
    let root = folder.path();
    let effects = root.join("writes.effects");
    {
        // Traversable, and the effects writable, by the unprivileged user
        // stdio servers run as when toolgate runs as root.
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o711)).unwrap();
        std::fs::write(&effects, "").unwrap();
        std::fs::set_permissions(&effects, std::fs::Permissions::from_mode(0o666)).unwrap();
    }
    std::fs::write(
        root.join("policy.toml"),
        "[[rules]]\ntools = [\"mcp.writes.*\"]\ndecision = \"allow\"\n",
    )
    .unwrap();
    let store = torture
        .store_url
        .clone()
        .unwrap_or_else(|| "sqlite://toolgate.db".to_owned());
    std::fs::write(
        root.join("toolgate.toml"),
        format!(
            r#"
[control]
socket = "run/control.sock"

[bridge]
directory = "run/turns"

[store]
url = "{store}"

[artifacts]
directory = "state/artifacts"

[policy]
file = "policy.toml"

[node]
directory = "state/node"

[mcp]
state_directory = "state/mcp"

[[mcp.servers]]
server_id = "writes"
command = "{server}"
env = {{ SCRIPTED_CATALOG = "basic", SCRIPTED_EFFECTS = "{effects}" }}
required_scopes = ["mcp.writes.use"]
"#,
            server = torture.server.display(),
            effects = effects.display(),
        ),
    )
    .unwrap();
    let mut node = Node {
        toolgate: torture.toolgate.clone(),
        folder: root.to_path_buf(),
        socket: root.join("run/control.sock"),
        child: None,
    };
    node.start();
    let session = Uuid::new_v4();
    let open = json!({"session_id": session, "tenant_id": "torture",
                      "principal": {"id": "p", "scopes": ["mcp.writes.use"]},
                      "agent": {"tools": ["mcp.writes.*"]}});
    let (status, body) = exchange(
        &node.socket,
        "POST",
        "/v1/sessions",
        None,
        &open.to_string(),
    )
    .expect("a session");
    assert_eq!(status, 200, "{body}");
    let mut scripts: Vec<Arc<Mutex<Script>>> = Vec::new();
    let restart_to_settled = Arc::new(Mutex::new(Vec::new()));
    let mut rng = Lcg(torture.seed);
    let mut in_flight: Vec<BTreeMap<usize, ()>> = Vec::new();
    let mut restarted: Option<Instant> = None;
    // Kill cycles, then one more that runs everything to its end.
    for cycle in 0..=torture.kills {
        let last = cycle == torture.kills;
        if !last {
            for _ in 0..torture.scripts {
                let index = scripts.len();
                scripts.push(Arc::new(Mutex::new(Script {
                    run: Uuid::new_v4(),
                    hash: sha256(&format!("torture script {index}")),
                    settled: BTreeMap::new(),
                })));
                in_flight.push(BTreeMap::new());
            }
        }
        if let Some(restarted) = restarted {
            // First the calls that were in flight at the kill, re-run to
            // their settled answer with no kill pending: the time from the
            // restart to each is what a user waits.
            let resumed: Vec<_> = in_flight
                .iter()
                .enumerate()
                .filter_map(|(index, ordinals)| {
                    let upto = ordinals.keys().next().copied()? + 1;
                    let (socket, script, times) = (
                        node.socket.clone(),
                        scripts[index].clone(),
                        restart_to_settled.clone(),
                    );
                    let was = ordinals.clone();
                    Some(std::thread::spawn(move || {
                        run_script(
                            &socket,
                            session,
                            index,
                            &script,
                            upto,
                            Timing {
                                restarted: Some(restarted),
                                times: &times,
                                in_flight: &was,
                            },
                        )
                    }))
                })
                .collect();
            for thread in resumed {
                assert!(
                    thread.join().expect("a script thread").is_none(),
                    "serve went away with no kill"
                );
            }
            for ordinals in &mut in_flight {
                ordinals.clear();
            }
        }
        // At most SCRIPTS_AT_ONCE scripts run at once, the oldest first, so
        // the driver never outnumbers the node's connection caps.
        let threads: Vec<_> = scripts
            .iter()
            .enumerate()
            .filter(|(_, script)| script.lock().unwrap().settled.len() < torture.calls)
            .take(SCRIPTS_AT_ONCE)
            .map(|(index, script)| {
                let (socket, script, times) = (
                    node.socket.clone(),
                    script.clone(),
                    restart_to_settled.clone(),
                );
                let calls = torture.calls;
                let thread = std::thread::spawn(move || {
                    run_script(
                        &socket,
                        session,
                        index,
                        &script,
                        calls,
                        Timing {
                            restarted: None,
                            times: &times,
                            in_flight: &BTreeMap::new(),
                        },
                    )
                });
                (index, thread)
            })
            .collect();
        if !last {
            std::thread::sleep(Duration::from_millis(20 + rng.next(300)));
            node.kill();
        }
        for (index, thread) in threads {
            if let Some(ordinal) = thread.join().expect("a script thread") {
                in_flight[index].insert(ordinal, ());
            }
        }
        if !last {
            node.start();
            restarted = Some(Instant::now());
        }
    }
    // No more kills: every script runs to its end, a batch at a time; one
    // that could not open its turn is tried again in the next round.
    for _ in 0..DRAIN_ROUNDS {
        let unfinished: Vec<usize> = scripts
            .iter()
            .enumerate()
            .filter(|(_, script)| script.lock().unwrap().settled.len() < torture.calls)
            .map(|(index, _)| index)
            .take(SCRIPTS_AT_ONCE)
            .collect();
        if unfinished.is_empty() {
            break;
        }
        let threads: Vec<_> = unfinished
            .into_iter()
            .map(|index| {
                let (socket, script, times) = (
                    node.socket.clone(),
                    scripts[index].clone(),
                    restart_to_settled.clone(),
                );
                let calls = torture.calls;
                std::thread::spawn(move || {
                    run_script(
                        &socket,
                        session,
                        index,
                        &script,
                        calls,
                        Timing {
                            restarted: None,
                            times: &times,
                            in_flight: &BTreeMap::new(),
                        },
                    )
                })
            })
            .collect();
        for thread in threads {
            if thread.join().expect("a script thread").is_some() {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    node.stop();
    let applied = std::fs::read_to_string(&effects).unwrap_or_default();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for written in applied.lines() {
        *counts.entry(written).or_default() += 1;
    }
    let mut figures = Figures {
        kills: torture.kills,
        calls: scripts.len() * torture.calls,
        duplicates: counts.values().filter(|count| **count > 1).count(),
        restart_to_settled_ms: restart_to_settled.lock().unwrap().clone(),
        ..Figures::default()
    };
    for (index, script) in scripts.iter().enumerate() {
        let script = script.lock().unwrap();
        for ordinal in 0..torture.calls {
            let written = counts
                .get(line(index, ordinal).as_str())
                .copied()
                .unwrap_or(0);
            match (script.settled.get(&ordinal).map(String::as_str), written) {
                (None, _) => figures.unsettled += 1,
                (Some("succeeded"), 0) => figures.succeeded_missing += 1,
                (Some("succeeded"), _) => figures.succeeded_applied += 1,
                (Some("uncertain"), 0) => figures.uncertain_none += 1,
                (Some("uncertain"), _) => figures.uncertain_applied += 1,
                (Some(_), 0) => figures.failed_none += 1,
                (Some(_), _) => figures.failed_applied += 1,
            }
        }
    }
    figures
}
