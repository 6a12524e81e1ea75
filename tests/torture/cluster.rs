//! The multi-node torture: several `toolgate serve` nodes on one PostgreSQL
//! database, many concurrent scripts calling a non-idempotent MCP tool (a
//! line appended to a file and fsynced: the ground truth, counted outside
//! toolgate) through the bridge, and a killer that SIGKILLs a random node
//! every few seconds and starts it again. A script interrupted by a kill is
//! replayed at once on another node (a new turn for the same run, step and
//! script), as a runtime would. Judged from outside at the end: effects made
//! twice, answers that are not true (a success without its effect, a
//! failure with one, an answer for another ordinal's call, a replay that
//! contradicts an earlier answer), calls left without an answer, and how
//! long a call in flight at a kill took to settle.
//!
//! Shared by the integration tests (a CI-sized run) and by
//! `cargo bench --bench torture` (a large one).

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

/// What a cluster torture is given.
pub struct Cluster {
    /// The `toolgate` binary.
    pub toolgate: PathBuf,
    /// The scripted MCP server binary.
    pub server: PathBuf,
    /// The `postgres://` URL every node shares.
    pub store_url: String,
    /// An administrator's URL, to count each node's connections; `None`
    /// leaves them uncounted.
    pub admin_url: Option<String>,
    /// Nodes.
    pub nodes: usize,
    /// Scripts running at once, across the nodes.
    pub scripts: usize,
    /// Calls each script makes.
    pub calls: usize,
    /// How long scripts keep starting and nodes keep dying.
    pub duration: Duration,
    /// A node is killed every so often: uniformly within this range;
    /// `None` kills nothing (a run that measures what nodes serve).
    pub kill_every: Option<(Duration, Duration)>,
    /// Every `pause_one_in`-th fault, when set, is a pause (SIGSTOP) of this
    /// long instead of a kill: longer than a lease, so the other nodes take
    /// the paused node's calls while it still holds them.
    pub pause: Option<(usize, Duration)>,
    /// Seeds the kills.
    pub seed: u64,
}

/// How the run went.
#[derive(Debug, Default, Clone)]
pub struct ClusterFigures {
    /// Kills made.
    pub kills: usize,
    /// Pauses made.
    pub pauses: usize,
    /// Nodes that stopped on their own (a lost lease) and were started again.
    pub self_stops: usize,
    /// Scripts run to their end.
    pub scripts: usize,
    /// Calls made (scripts × calls).
    pub calls: usize,
    /// Replays of an interrupted script on another node.
    pub replays: usize,
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
    /// An answer for another ordinal's call (its result or its ordinal):
    /// must be zero.
    pub drifted: usize,
    /// A replay's settled answer differing from the earlier one: must be
    /// zero.
    pub contradicted: usize,
    /// Calls with no settled answer at the end: must be zero.
    pub unsettled: usize,
    /// From a script seeing its node die to the settled answer of the call
    /// it had in flight, in milliseconds.
    pub settle_ms: Vec<u64>,
    /// Settled answers per node.
    pub per_node: Vec<usize>,
    /// The most PostgreSQL connections each node held at once (sampled).
    pub connections: Vec<i64>,
    /// CPU each node's `serve` process spent over the run (its MCP
    /// servers not counted).
    pub node_cpu: Vec<Duration>,
    /// CPU the nodes' PostgreSQL backends spent over the run, when counted.
    pub postgres_cpu: Option<Duration>,
    /// The run's length.
    pub elapsed: Duration,
}

impl ClusterFigures {
    /// Whether every promise held.
    pub fn sound(&self) -> bool {
        self.duplicates == 0
            && self.succeeded_missing == 0
            && self.failed_applied == 0
            && self.drifted == 0
            && self.contradicted == 0
            && self.unsettled == 0
    }

    fn percentile(&self, at: f64) -> u64 {
        let mut sorted = self.settle_ms.clone();
        sorted.sort_unstable();
        let index = ((sorted.len() as f64 - 1.0) * at).round() as usize;
        sorted.get(index).copied().unwrap_or(0)
    }
}

impl std::fmt::Display for ClusterFigures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let seconds = self.elapsed.as_secs_f64().max(0.001);
        let per_node: Vec<String> = self
            .per_node
            .iter()
            .map(|count| format!("{:.1}", *count as f64 / seconds))
            .collect();
        let per_call =
            |cpu: Duration, calls: usize| cpu.as_secs_f64() * 1000.0 / calls.max(1) as f64;
        let node_cpu: Vec<String> = self
            .node_cpu
            .iter()
            .zip(&self.per_node)
            .map(|(cpu, calls)| format!("{:.2}", per_call(*cpu, *calls)))
            .collect();
        let answered: usize = self.per_node.iter().sum();
        let postgres_cpu = self
            .postgres_cpu
            .map(|cpu| format!("{:.2} ms", per_call(cpu, answered)))
            .unwrap_or_else(|| "not counted".into());
        write!(
            f,
            "kills {}, pauses {}, self-stops {}, scripts {}, calls {}, replays {}, duplicates {}, \
             succeeded/applied {}, succeeded/missing {}, uncertain/applied {}, uncertain/none {}, \
             failed/none {}, failed/applied {}, drifted {}, contradicted {}, unsettled {}, \
             settle after a death p50 {} ms max {} ms (n={}), calls/s per node [{}], \
             serve CPU per call per node [{}] ms, PostgreSQL CPU per call {}, \
             PostgreSQL connections per node (max) {:?}, {:.0} s",
            self.kills,
            self.pauses,
            self.self_stops,
            self.scripts,
            self.calls,
            self.replays,
            self.duplicates,
            self.succeeded_applied,
            self.succeeded_missing,
            self.uncertain_applied,
            self.uncertain_none,
            self.failed_none,
            self.failed_applied,
            self.drifted,
            self.contradicted,
            self.unsettled,
            self.percentile(0.5),
            self.percentile(1.0),
            self.settle_ms.len(),
            per_node.join(", "),
            node_cpu.join(", "),
            postgres_cpu,
            self.connections,
            seconds,
        )
    }
}

/// A small deterministic generator.
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

/// One answer over a unix socket: status, headers, body. `None` when the
/// peer went away (killed) before a whole answer.
fn exchange(
    socket: &Path,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> Option<(u16, String, Value)> {
    let mut stream = UnixStream::connect(socket).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .ok()?;
    let authorization = token
        .map(|token| format!("Authorization: Bearer {token}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{authorization}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).ok()?;
    let text = String::from_utf8_lossy(&answer);
    let split = text.find("\r\n\r\n")?;
    let status = text.get(9..12)?.parse().ok()?;
    let value = serde_json::from_str(&text[split + 4..]).ok()?;
    Some((status, text[..split].to_ascii_lowercase(), value))
}

/// One node: its folder, its control socket and its process.
struct Node {
    toolgate: PathBuf,
    folder: PathBuf,
    socket: PathBuf,
    child: Mutex<Option<Child>>,
    up: AtomicBool,
}

impl Node {
    fn start(&self) {
        let child = Command::new(&self.toolgate)
            .args(["serve", "--migrate", "--config"])
            .arg(self.folder.join("toolgate.toml"))
            .env_remove("TOOLGATE_STORE_URL")
            .env_remove("TOOLGATE_CONTROL_SOCKET")
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.folder.join("serve.log"))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            )
            .spawn()
            .expect("toolgate serve starts");
        *self.child.lock().unwrap() = Some(child);
        let started = Instant::now();
        while UnixStream::connect(&self.socket).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "serve did not listen: {}",
                std::fs::read_to_string(self.folder.join("serve.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        self.up.store(true, Ordering::SeqCst);
    }

    /// Stops the process (SIGSTOP) for `pause`, then lets it go on.
    fn pause(&self, pause: Duration) {
        let pid = self
            .child
            .lock()
            .unwrap()
            .as_ref()
            .map(|child| nix::unistd::Pid::from_raw(child.id() as i32));
        if let Some(pid) = pid {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP);
            std::thread::sleep(pause);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
        }
    }

    fn kill(&self) {
        self.up.store(false, Ordering::SeqCst);
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether the process stopped on its own.
    fn stopped_by_itself(&self) -> bool {
        let mut child = self.child.lock().unwrap();
        match child.as_mut().map(Child::try_wait) {
            Some(Ok(Some(_))) => {
                child.take();
                self.up.store(false, Ordering::SeqCst);
                true
            }
            _ => false,
        }
    }

    fn stop(&self) {
        self.up.store(false, Ordering::SeqCst);
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(30) {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

fn sha256(text: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

fn line(script: usize, call: usize) -> String {
    format!("s{script}-c{call}")
}

/// What the scripts share.
struct Shared {
    nodes: Vec<Arc<Node>>,
    session: Uuid,
    calls: usize,
    stop_starting: AtomicBool,
    next_script: AtomicUsize,
    /// Per script: its settled answer per ordinal.
    settled: Mutex<BTreeMap<usize, BTreeMap<usize, String>>>,
    settle_ms: Mutex<Vec<u64>>,
    per_node: Vec<AtomicUsize>,
    replays: AtomicUsize,
    drifted: AtomicUsize,
    contradicted: AtomicUsize,
}

/// How long one call may stay unsettled before the script gives up on it
/// (and the judge counts it unsettled).
const UNSETTLED_LIMIT: Duration = Duration::from_secs(120);

/// How one turn of a script ended.
enum TurnEnd {
    /// Every call settled (or one stayed unsettled past the limit).
    Done,
    /// The turn could not be opened there; tried on the next node.
    NotOpened,
    /// The node went away with the ordinal in flight; the script is
    /// replayed elsewhere.
    Interrupted { ordinal: usize, at: Instant },
}

impl Shared {
    /// A live node, starting at `from` and going round.
    fn live_node(&self, from: usize) -> usize {
        loop {
            for offset in 0..self.nodes.len() {
                let index = (from + offset) % self.nodes.len();
                if self.nodes[index].up.load(Ordering::SeqCst) {
                    return index;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs a script to its end, replaying it on another node whenever its
    /// node dies under it.
    fn run_script(&self, index: usize) {
        let run = Uuid::new_v4();
        let hash = sha256(&format!("cluster torture script {index} {run}"));
        let mut node = index % self.nodes.len();
        let mut interrupted: Option<(usize, Instant)> = None;
        let mut first = true;
        loop {
            node = self.live_node(node);
            if !first {
                self.replays.fetch_add(1, Ordering::Relaxed);
            }
            first = false;
            match self.turn(index, run, &hash, node, interrupted) {
                TurnEnd::Done => break,
                TurnEnd::NotOpened => {
                    std::thread::sleep(Duration::from_millis(50));
                    node += 1;
                }
                TurnEnd::Interrupted { ordinal, at } => {
                    if interrupted.is_none() {
                        interrupted = Some((ordinal, at));
                    }
                    // Another node, as a runtime would pick.
                    node += 1;
                }
            }
        }
    }

    /// One turn of a script on `node`: its calls from ordinal 0, each asked
    /// again while unsettled, every answer checked against its ordinal.
    fn turn(
        &self,
        index: usize,
        run: Uuid,
        hash: &str,
        node: usize,
        mut interrupted: Option<(usize, Instant)>,
    ) -> TurnEnd {
        let away = |ordinal| TurnEnd::Interrupted {
            ordinal,
            at: Instant::now(),
        };
        let socket = &self.nodes[node].socket;
        let open = json!({"session_id": self.session, "run_id": run, "step_number": 1,
                          "script_sha256": hash, "origin_trust": "user"});
        let Some((200, _, turn)) = exchange(socket, "POST", "/v1/turns", None, &open.to_string())
        else {
            return TurnEnd::NotOpened;
        };
        let (Some(turn_socket), Some(token)) =
            (turn["socket_path"].as_str(), turn["token"].as_str())
        else {
            return TurnEnd::NotOpened;
        };
        let turn_socket = PathBuf::from(turn_socket);
        for ordinal in 0..self.calls {
            let expected = line(index, ordinal);
            let body = json!({"call": "mcp.writes.write", "arguments": {"line": expected}});
            let asked = Instant::now();
            loop {
                let Some((status, head, answer)) = exchange(
                    &turn_socket,
                    "POST",
                    "/v1/call",
                    Some(token),
                    &body.to_string(),
                ) else {
                    return away(ordinal);
                };
                if status != 200 {
                    // The turn closed under a drain, or the node is going.
                    return away(ordinal);
                }
                let outcome = answer["status"].as_str().unwrap_or_default().to_owned();
                let unsettled = matches!(
                    answer["reason_code"].as_str(),
                    Some("tool.concurrency_conflict" | "tool.record_unavailable")
                );
                if unsettled {
                    // The same call, asked again: the ordinal was given back.
                    if head.contains("toolgate-ordinal:") {
                        self.drifted.fetch_add(1, Ordering::Relaxed);
                    }
                    if asked.elapsed() > UNSETTLED_LIMIT {
                        return TurnEnd::Done;
                    }
                    std::thread::sleep(Duration::from_millis(25));
                    continue;
                }
                let given = head
                    .lines()
                    .find_map(|header| header.strip_prefix("toolgate-ordinal:"))
                    .and_then(|value| value.trim().parse::<usize>().ok());
                let written = answer["result"]["content"][0]["text"].as_str();
                let drifted = given != Some(ordinal)
                    || (outcome == "succeeded" && written != Some(&format!("written {expected}")));
                // The first few are told, to see what drifted when a run fails.
                if drifted && self.drifted.fetch_add(1, Ordering::Relaxed) < 5 {
                    eprintln!(
                        "drifted: ordinal {ordinal} ({expected}) answered as {given:?}: {answer}"
                    );
                }
                self.per_node[node].fetch_add(1, Ordering::Relaxed);
                if let Some((at_ordinal, at)) = interrupted
                    && at_ordinal == ordinal
                {
                    self.settle_ms
                        .lock()
                        .unwrap()
                        .push(u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX));
                    interrupted = None;
                }
                let mut settled = self.settled.lock().unwrap();
                let answers = settled.entry(index).or_default();
                match answers.get(&ordinal) {
                    Some(earlier) if *earlier != outcome => {
                        self.contradicted.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(_) => {}
                    None => {
                        answers.insert(ordinal, outcome);
                    }
                }
                break;
            }
        }
        TurnEnd::Done
    }
}

/// CPU a process has spent (user and system), from `/proc`; zero once it
/// is gone.
fn cpu_of(pid: u32) -> Duration {
    // Linux counts /proc times in USER_HZ, which is 100 everywhere.
    const TICKS_PER_SECOND: u64 = 100;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis; utime and stime are
    // the 14th and 15th of the whole line.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |index: usize| {
        fields
            .get(index)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((ticks(11) + ticks(12)) * 1000 / TICKS_PER_SECOND)
}

/// The nodes' PostgreSQL backends now: (pid, CPU so far).
fn backends(admin_url: &str) -> BTreeMap<u32, Duration> {
    let output = Command::new("psql")
        .arg(admin_url)
        .args([
            "-Atc",
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'toolgate-node-%'",
        ])
        .output();
    output
        .map(|output| {
            String::from_utf8_lossy(&output.stdout)
                .lines()
                .filter_map(|pid| pid.trim().parse::<u32>().ok())
                .map(|pid| (pid, cpu_of(pid)))
                .collect()
        })
        .unwrap_or_default()
}

/// Connections each node's role holds now, by application name.
fn connections(admin_url: &str, nodes: usize) -> Vec<i64> {
    let output = Command::new("psql")
        .arg(admin_url)
        .args([
            "-Atc",
            "SELECT application_name, count(*) FROM pg_stat_activity \
             WHERE application_name LIKE 'toolgate-node-%' GROUP BY 1",
        ])
        .output();
    let mut counts = vec![0; nodes];
    if let Ok(output) = output {
        for row in String::from_utf8_lossy(&output.stdout).lines() {
            if let Some((name, count)) = row.split_once('|')
                && let Some(index) = name
                    .strip_prefix("toolgate-node-")
                    .and_then(|index| index.parse::<usize>().ok())
                && index < nodes
            {
                counts[index] = count.trim().parse().unwrap_or(0);
            }
        }
    }
    counts
}

/// Makes `root` traversable and `effects` writable by the unprivileged user
/// stdio servers run as when toolgate runs as root.
pub fn reachable_by_children(root: &Path, effects: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::write(effects, "").unwrap();
    std::fs::set_permissions(effects, std::fs::Permissions::from_mode(0o666)).unwrap();
}

/// Runs the cluster torture and judges it.
pub fn run(cluster: &Cluster) -> ClusterFigures {
    let folder = tempfile::tempdir().expect("a folder");
    let root = folder.path();
    let effects = root.join("writes.effects");
    reachable_by_children(root, &effects);
    let policy = root.join("policy.toml");
    std::fs::write(
        &policy,
        "[[rules]]\ntools = [\"mcp.writes.*\"]\ndecision = \"allow\"\n",
    )
    .unwrap();
    let separator = if cluster.store_url.contains('?') {
        '&'
    } else {
        '?'
    };
    let nodes: Vec<Arc<Node>> = (0..cluster.nodes)
        .map(|index| {
            let folder = root.join(format!("node-{index}"));
            std::fs::create_dir_all(&folder).unwrap();
            std::fs::write(
                folder.join("toolgate.toml"),
                format!(
                    r#"
[control]
socket = "run/control.sock"

[bridge]
directory = "run/turns"

[store]
url = "{store}{separator}application_name=toolgate-node-{index}"

[artifacts]
directory = "state/artifacts"

[policy]
file = "{policy}"

[node]
directory = "state/node"
lease_seconds = 10
heartbeat_seconds = 2
sweep_seconds = 2

[runtime]
drain_timeout_seconds = 5

[mcp]
state_directory = "state/mcp"

[[mcp.servers]]
server_id = "writes"
command = "{server}"
env = {{ SCRIPTED_CATALOG = "basic", SCRIPTED_EFFECTS = "{effects}", SCRIPTED_WRITE_DELAY_MS = "30" }}
required_scopes = ["mcp.writes.use"]
"#,
                    store = cluster.store_url,
                    policy = policy.display(),
                    server = cluster.server.display(),
                    effects = effects.display(),
                ),
            )
            .unwrap();
            Arc::new(Node {
                toolgate: cluster.toolgate.clone(),
                socket: folder.join("run/control.sock"),
                folder,
                child: Mutex::new(None),
                up: AtomicBool::new(false),
            })
        })
        .collect();
    for node in &nodes {
        node.start();
    }
    let session = Uuid::new_v4();
    let open = json!({"session_id": session, "tenant_id": "torture",
                      "principal": {"id": "p", "scopes": ["mcp.writes.use"]},
                      "agent": {"tools": ["mcp.writes.*"]}});
    let (status, _, body) = exchange(
        &nodes[0].socket,
        "POST",
        "/v1/sessions",
        None,
        &open.to_string(),
    )
    .expect("a session");
    assert_eq!(status, 200, "{body}");
    let shared = Arc::new(Shared {
        nodes: nodes.clone(),
        session,
        calls: cluster.calls,
        stop_starting: AtomicBool::new(false),
        next_script: AtomicUsize::new(0),
        settled: Mutex::new(BTreeMap::new()),
        settle_ms: Mutex::new(Vec::new()),
        per_node: (0..cluster.nodes).map(|_| AtomicUsize::new(0)).collect(),
        replays: AtomicUsize::new(0),
        drifted: AtomicUsize::new(0),
        contradicted: AtomicUsize::new(0),
    });
    let started = Instant::now();
    let serve_cpu = |nodes: &[Arc<Node>]| -> Vec<Duration> {
        nodes
            .iter()
            .map(|node| {
                node.child
                    .lock()
                    .unwrap()
                    .as_ref()
                    .map(|child| cpu_of(child.id()))
                    .unwrap_or_default()
            })
            .collect()
    };
    let cpu_before = serve_cpu(&nodes);
    let backends_before = cluster.admin_url.as_deref().map(backends);
    let runners: Vec<_> = (0..cluster.scripts)
        .map(|_| {
            let shared = shared.clone();
            std::thread::spawn(move || {
                while !shared.stop_starting.load(Ordering::SeqCst) {
                    let index = shared.next_script.fetch_add(1, Ordering::SeqCst);
                    shared.run_script(index);
                }
            })
        })
        .collect();
    // The killer: a random live node, SIGKILL, a pause, started again; a
    // node that stopped on its own is started again too.
    let mut rng = Lcg(cluster.seed);
    let (mut kills, mut pauses, mut self_stops) = (0, 0, 0);
    let mut most = vec![0i64; cluster.nodes];
    let (low, high) = cluster
        .kill_every
        .unwrap_or((cluster.duration, cluster.duration));
    let span = u64::try_from(high.saturating_sub(low).as_millis()).unwrap_or(0);
    while started.elapsed() < cluster.duration {
        let pause = low + Duration::from_millis(rng.next(span + 1));
        let until = (Instant::now() + pause).min(started + cluster.duration);
        while Instant::now() < until {
            std::thread::sleep(Duration::from_millis(100));
            for node in &nodes {
                if node.stopped_by_itself() {
                    self_stops += 1;
                    node.start();
                }
            }
            if let Some(admin) = &cluster.admin_url {
                for (index, count) in connections(admin, cluster.nodes).into_iter().enumerate() {
                    most[index] = most[index].max(count);
                }
            }
        }
        if cluster.kill_every.is_none() || started.elapsed() >= cluster.duration {
            continue;
        }
        let victim = usize::try_from(rng.next(cluster.nodes as u64)).unwrap_or(0);
        match cluster.pause {
            Some((one_in, pause)) if (kills + pauses + 1) % one_in.max(1) == 0 => {
                // Scripts keep running on the other nodes meanwhile.
                nodes[victim].pause(pause);
                pauses += 1;
            }
            _ => {
                nodes[victim].kill();
                kills += 1;
                std::thread::sleep(Duration::from_millis(200 + rng.next(1_300)));
                nodes[victim].start();
            }
        }
    }
    shared.stop_starting.store(true, Ordering::SeqCst);
    // No more kills: every script runs to its end.
    for runner in runners {
        runner.join().expect("a script runner");
    }
    let elapsed = started.elapsed();
    let node_cpu: Vec<Duration> = serve_cpu(&nodes)
        .into_iter()
        .zip(&cpu_before)
        .map(|(after, before)| after.saturating_sub(*before))
        .collect();
    // Backends that lived through the run, and those opened during it.
    let postgres_cpu = match (cluster.admin_url.as_deref(), backends_before) {
        (Some(admin), Some(before)) => Some(
            backends(admin)
                .into_iter()
                .map(|(pid, after)| {
                    after.saturating_sub(before.get(&pid).copied().unwrap_or_default())
                })
                .sum(),
        ),
        _ => None,
    };
    for node in &nodes {
        if node.stopped_by_itself() {
            self_stops += 1;
        }
        node.stop();
    }
    let applied = std::fs::read_to_string(&effects).unwrap_or_default();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for written in applied.lines() {
        *counts.entry(written).or_default() += 1;
    }
    let scripts = shared.next_script.load(Ordering::SeqCst);
    let mut figures = ClusterFigures {
        kills,
        pauses,
        self_stops,
        scripts,
        calls: scripts * cluster.calls,
        replays: shared.replays.load(Ordering::SeqCst),
        duplicates: counts.values().filter(|count| **count > 1).count(),
        drifted: shared.drifted.load(Ordering::SeqCst),
        contradicted: shared.contradicted.load(Ordering::SeqCst),
        settle_ms: shared.settle_ms.lock().unwrap().clone(),
        per_node: shared
            .per_node
            .iter()
            .map(|count| count.load(Ordering::SeqCst))
            .collect(),
        connections: most,
        node_cpu,
        postgres_cpu,
        elapsed,
        ..ClusterFigures::default()
    };
    let settled = shared.settled.lock().unwrap();
    for index in 0..scripts {
        for ordinal in 0..cluster.calls {
            let written = counts
                .get(line(index, ordinal).as_str())
                .copied()
                .unwrap_or(0);
            match (
                settled
                    .get(&index)
                    .and_then(|answers| answers.get(&ordinal))
                    .map(String::as_str),
                written,
            ) {
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
