//! Every shipped artifact run as it runs toolgate, as far as this machine
//! can apply it: a real `toolgate serve` under `setpriv` with the unit's or
//! the pod's or the image's uid, gids, supplementary groups, capabilities
//! and no-new-privileges, on folders made as systemd-tmpfiles, the unit, the
//! kubelet and its init container, or the image make them, with the
//! artifact's own configuration. Then the three users: the agent runtime,
//! in the declared group, opens a session over the control socket; a script
//! running as the turn's sandbox uid calls through its turn's socket; a
//! script as another uid is refused at both sockets; a stdio server runs as
//! its own user, holding nothing. The systemd unit's syscall filter cannot
//! be applied here: every system call toolgate and its server made is
//! traced instead and must be one the filter allows.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

use super::{
    SystemUsers, ci, deploy, instruction, manifest, repository, required_tool, stage, toolgate,
};

/// Fixed uids no account of a test machine has: the agent runtime, the
/// sandbox a turn is for, and another sandbox.
const RUNTIME_UID: u32 = 10010;
const SANDBOX_UID: u32 = 10020;
const OTHER_UID: u32 = 10021;

/// Docker's and Podman's default capabilities: a container's bounding set
/// unless it adds or drops some.
const ENGINE_DEFAULT_CAPABILITIES: [&str; 14] = [
    "chown",
    "dac_override",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "net_bind_service",
    "net_raw",
    "sys_chroot",
    "mknod",
    "audit_write",
    "setfcap",
];

/// Who a process runs as and what it may do: what `setpriv` gives it.
#[derive(Debug, Clone)]
struct Identity {
    uid: u32,
    gid: u32,
    /// Supplementary groups; none when empty.
    groups: Vec<u32>,
    /// The bounding set (capability names without `cap_`, lowercase).
    bounding: Vec<String>,
    /// Ambient capabilities (inheritable too, as the kernel requires).
    ambient: Vec<String>,
    no_new_privs: bool,
}

impl Identity {
    /// A process of `uid` (its gid the same) in `groups`, with no
    /// capability and no way to gain one: the runtime and the sandboxes.
    fn plain(uid: u32, groups: &[u32]) -> Identity {
        Identity {
            uid,
            gid: uid,
            groups: groups.to_vec(),
            bounding: Vec::new(),
            ambient: Vec::new(),
            no_new_privs: true,
        }
    }

    /// `setpriv` with this identity, then `program`.
    fn command(&self, program: &Path) -> Command {
        let list = |names: &[String]| {
            std::iter::once("-all".to_owned())
                .chain(names.iter().map(|name| format!("+{name}")))
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut command = Command::new("setpriv");
        command
            .arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid));
        if self.groups.is_empty() {
            command.arg("--clear-groups");
        } else {
            let groups: Vec<String> = self.groups.iter().map(u32::to_string).collect();
            command.arg(format!("--groups={}", groups.join(",")));
        }
        command
            .arg(format!("--bounding-set={}", list(&self.bounding)))
            .arg(format!("--inh-caps={}", list(&self.ambient)))
            .arg(format!("--ambient-caps={}", list(&self.ambient)));
        if self.no_new_privs {
            command.arg("--no-new-privs");
        }
        command
            .arg(program)
            .env_clear()
            .env("PATH", "/usr/bin:/bin");
        command
    }
}

/// A folder tree standing for the machine's root: `/run/toolgate` is
/// `<root>/run/toolgate`, and so on. Traversable, as `/` is.
fn machine_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    root
}

/// `path` (absolute) under `root`.
fn under(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// Makes `path` and the folders above it under `root` as root's, 0755 (as
/// the kubelet makes a hostPath folder, and as `/etc` is).
fn root_folder(root: &Path, path: &str) -> PathBuf {
    let folder = under(root, path);
    std::fs::create_dir_all(&folder).unwrap();
    let mut at = folder.as_path();
    while at != root {
        std::fs::set_permissions(at, std::fs::Permissions::from_mode(0o755)).unwrap();
        at = at.parent().unwrap();
    }
    folder
}

/// Makes a folder `uid:gid` with `mode`, as the unit's directory settings,
/// tmpfiles or an image's `install -d` make it.
fn owned_folder(path: &Path, uid: u32, gid: u32, mode: u32) {
    std::fs::create_dir_all(path).unwrap();
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A configuration's absolute paths moved under `root`, and its operations
/// listener on a free port of loopback (several artifacts run at once).
fn rooted_config(text: &str, root: &Path, prefixes: &[&str]) -> (String, u16) {
    let mut text = text.to_owned();
    for prefix in prefixes {
        text = text.replace(
            &format!("\"{prefix}"),
            &format!("\"{}", under(root, prefix).display()),
        );
        text = text.replace(
            &format!("sqlite://{prefix}"),
            &format!("sqlite://{}", under(root, prefix).display()),
        );
    }
    let port = crate::support::free_port();
    let listen = text
        .lines()
        .find(|line| line.starts_with("listen = "))
        .expect("the operations listener is configured")
        .to_owned();
    (
        text.replace(&listen, &format!("listen = \"127.0.0.1:{port}\"")),
        port,
    )
}

/// The stdio server the runs add: the probe, which reports its uid, its
/// groups and capabilities, and whether it reaches toolgate's environment,
/// control socket and database.
fn probe_server(run_as: &str) -> String {
    format!(
        "\n[[mcp.servers]]\nserver_id = \"probe\"\ncommand = \"{}\"\nrun_as = \"{run_as}\"\nenv = {{ SCRIPTED_CATALOG = \"probe\" }}\nside_effect = \"external_read\"\nrisk = \"low\"\nidempotency = \"read_only\"\nrequired_scopes = [\"mcp.probe.use\"]\n",
        crate::mcp::scripted_server().display()
    )
}

/// One HTTP exchange over a unix socket from Python (a process of its
/// own, so of its own identity): prints the status and body, or the error
/// the socket gave. The bearer token, when any, comes from the
/// environment, never the command line.
const CLIENT: &str = r#"
import http.client, json, os, socket, sys

class Unix(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("toolgate", timeout=60)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(60)
        self.sock.connect(self.unix_path)

path, method, target, body = sys.argv[1:5]
headers = {"Content-Type": "application/json"}
if os.environ.get("TOKEN"):
    headers["Authorization"] = "Bearer " + os.environ["TOKEN"]
try:
    connection = Unix(path)
    connection.request(method, target, body=body.encode() or None, headers=headers)
    answer = connection.getresponse()
    print(json.dumps({"status": answer.status, "body": answer.read().decode()}))
except OSError as error:
    print(json.dumps({"error": type(error).__name__, "errno": error.errno}))
"#;

/// The sandbox's script: the bridge client calling a builtin and, when the
/// run has one, the stdio server, through the turn's socket.
const SCRIPT: &str = r#"
import json, os
from toolgate_bridge import call, text

out = {"echo": text(call("demo.echo", text="from the sandbox"))}
if os.environ.get("PROBE_SOCKET"):
    out["probe"] = json.loads(text(call("mcp.probe.probe", linger=True,
        socket=os.environ["PROBE_SOCKET"], database=os.environ["PROBE_DATABASE"])))
print(json.dumps(out))
"#;

/// An artifact's toolgate, set up under a machine root and ready to run.
struct Deployment {
    /// What the test calls it in messages.
    name: &'static str,
    root: PathBuf,
    /// The program (toolgate itself, or a copy carrying file capabilities).
    program: PathBuf,
    /// Its arguments, the artifact's own with paths under the root.
    args: Vec<String>,
    identity: Identity,
    /// The runtime's supplementary groups (the control socket's group).
    runtime_groups: Vec<u32>,
    /// The operations listener's port.
    ops_port: u16,
    control: PathBuf,
    database: PathBuf,
    /// The uid the stdio probe runs as, when the run has one.
    stdio_uid: Option<u32>,
}

/// A running deployment: toolgate (perhaps under strace) and its log.
struct Running {
    child: Child,
    /// toolgate's own pid (strace's child when traced).
    pid: i32,
    log: PathBuf,
}

impl Running {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, as systemd, the kubelet and the engines stop it: it drains
    /// and exits 0.
    fn stop(mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGTERM,
        );
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                assert!(status.success(), "{status}:\n{}", self.log());
                return;
            }
            if started.elapsed() > Duration::from_secs(60) {
                let _ = self.child.kill();
                panic!("toolgate did not stop:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Deployment {
    /// Starts toolgate as the artifact does, under `strace` when `trace`
    /// names the file its record goes to, and waits for the control socket.
    fn start(&self, trace: Option<&Path>) -> Running {
        let log = self.root.join(format!("toolgate-{}.log", Uuid::new_v4()));
        let mut command = match trace {
            Some(record) => {
                let mut command = Command::new("strace");
                command.args(["-f", "-qq", "-o"]).arg(record);
                let inner = self.identity.command(&self.program);
                command.arg(inner.get_program()).args(inner.get_args());
                command.env_clear().env("PATH", "/usr/bin:/bin");
                command
            }
            None => self.identity.command(&self.program),
        };
        command
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let mut child = command.spawn().expect("setpriv runs toolgate");
        let started = Instant::now();
        loop {
            if std::os::unix::net::UnixStream::connect(&self.control).is_ok() {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "{}: toolgate exited ({status}):\n{}",
                    self.name,
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{}: no control socket",
                self.name
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let pid = match trace {
            // strace's one child is toolgate (setpriv executes it).
            Some(_) => {
                let children =
                    std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", child.id()))
                        .unwrap();
                children.trim().parse().unwrap()
            }
            None => i32::try_from(child.id()).unwrap(),
        };
        Running { child, pid, log }
    }

    /// Python as `identity` with `vars`.
    fn python(&self, identity: &Identity, args: &[&str], vars: &[(&str, &str)]) -> Value {
        let output = identity
            .command(Path::new("/usr/bin/python3"))
            .args(args)
            .env("PYTHONPATH", self.root.join("bridge"))
            .envs(vars.iter().copied())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&output.stdout);
        serde_json::from_str(text.trim()).unwrap_or_else(|_| {
            panic!(
                "{}: {args:?} as {}: {text}\n{}",
                self.name,
                identity.uid,
                String::from_utf8_lossy(&output.stderr)
            )
        })
    }

    /// One request on `socket` as `identity`.
    fn request(
        &self,
        identity: &Identity,
        socket: &Path,
        method: &str,
        target: &str,
        body: &Value,
        token: &str,
    ) -> Value {
        let client = self.root.join("bridge/client.py");
        let body = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        self.python(
            identity,
            &[
                client.to_str().unwrap(),
                socket.to_str().unwrap(),
                method,
                target,
                &body,
            ],
            &[("TOKEN", token)],
        )
    }

    /// The three users against a running toolgate.
    fn three_users(&self, running: &Running) {
        let name = self.name;
        let runtime = Identity::plain(RUNTIME_UID, &self.runtime_groups);
        let sandbox = Identity::plain(SANDBOX_UID, &[]);
        let other = Identity::plain(OTHER_UID, &[]);
        let answer = |reply: &Value| -> (u64, Value) {
            let status = reply["status"]
                .as_u64()
                .unwrap_or_else(|| panic!("{name}: {reply}\n{}", running.log()));
            let body = serde_json::from_str(reply["body"].as_str().unwrap()).unwrap_or(Value::Null);
            (status, body)
        };

        // The runtime, in the control socket's group, opens a session and a
        // turn for the sandbox's uid.
        let session = Uuid::new_v4();
        let (status, body) = answer(&self.request(
            &runtime,
            &self.control,
            "POST",
            "/v1/sessions",
            &json!({"session_id": session, "tenant_id": "deploy",
                    "principal": {"id": "runtime", "scopes": ["demo.use", "mcp.probe.use"]},
                    "agent": {"tools": ["demo.*", "mcp.probe.*"]}}),
            "",
        ));
        assert_eq!(status, 200, "{name}: {body}");
        let script_sha256 = toolgate::domain::sha256_hex(SCRIPT.as_bytes());
        let (status, turn) = answer(&self.request(
            &runtime,
            &self.control,
            "POST",
            "/v1/turns",
            &json!({"session_id": session, "run_id": Uuid::new_v4(), "step_number": 1,
                    "origin_trust": "user", "script_sha256": script_sha256,
                    "sandbox_uid": SANDBOX_UID}),
            "",
        ));
        assert_eq!(status, 200, "{name}: {turn}");
        let socket = PathBuf::from(turn["socket_path"].as_str().unwrap());
        let token = turn["token"].as_str().unwrap();

        // The sandbox's script calls through its turn.
        let script = self.root.join("bridge/script.py");
        let control = self.control.to_str().unwrap();
        let database = self.database.to_str().unwrap();
        let mut vars = vec![
            ("TOOLGATE_BRIDGE_SOCKET", socket.to_str().unwrap()),
            ("TOOLGATE_BRIDGE_TOKEN", token),
        ];
        if self.stdio_uid.is_some() {
            vars.extend([("PROBE_SOCKET", control), ("PROBE_DATABASE", database)]);
        }
        let called = self.python(&sandbox, &[script.to_str().unwrap()], &vars);
        assert_eq!(called["echo"], "from the sandbox", "{name}: {called}");
        if let Some(uid) = self.stdio_uid {
            // The stdio server is its own user: none of toolgate's groups
            // or capabilities, and none of its secrets within reach.
            let probe = &called["probe"];
            assert_eq!(probe["uid"], uid, "{name}: {probe}");
            for (key, expected) in [
                ("environ", "refused"),
                ("socket", "refused"),
                ("database", "refused"),
            ] {
                assert_eq!(probe[key], expected, "{name}: {key}: {probe}");
            }
            // (Its bounding set stays as toolgate's where toolgate is not
            // root, which may not empty it: with nothing permitted,
            // inheritable or ambient and no new privileges, nothing in it
            // can be gained.)
            for set in ["CapEff", "CapPrm", "CapAmb", "CapInh"] {
                assert_eq!(
                    probe["privileges"][set], "0000000000000000",
                    "{name}: {set}: {probe}"
                );
            }
            assert_eq!(probe["privileges"]["Groups"], "", "{name}: {probe}");
            assert_eq!(probe["privileges"]["NoNewPrivs"], "1", "{name}: {probe}");
        }

        // Another uid, holding the token: its connection is closed unread,
        // and it cannot reach the control socket at all.
        let refused = self.request(
            &other,
            &socket,
            "POST",
            "/v1/call",
            &json!({"call": "demo.echo", "arguments": {"text": "not mine"}}),
            token,
        );
        assert!(
            refused["status"].is_null() && refused["error"].is_string(),
            "{name}: another uid was answered: {refused}"
        );
        for stranger in [&other, &sandbox] {
            let control =
                self.request(stranger, &self.control, "GET", "/healthz", &Value::Null, "");
            assert_eq!(
                control["errno"], 13,
                "{name}: uid {} reached the control socket: {control}",
                stranger.uid
            );
        }
        let metrics = ops_get(self.ops_port, "/metrics");
        assert!(
            metrics.contains("toolgate_bridge_refusals_total{code=\"forbidden_peer\"} 1\n"),
            "{name}: the refusal is not counted:\n{metrics}"
        );
        // The probes the DaemonSet and a supervisor use.
        let started = Instant::now();
        while !ops_get(self.ops_port, "/readyz").starts_with("HTTP/1.1 200") {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{name}: never ready:\n{}",
                running.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts toolgate, runs the three users, stops it; no process of the
    /// stdio server's user outlives it.
    fn run(&self) {
        let running = self.start(None);
        self.three_users(&running);
        running.stop();
        if let Some(uid) = self.stdio_uid {
            assert!(
                processes_of(uid, &self.root).is_empty(),
                "{}: a server, or a process it started, outlived toolgate",
                self.name
            );
        }
    }
}

/// A GET on the operations listener: the body.
fn ops_get(port: u16, path: &str) -> String {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: ops\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}

/// The pids of `uid`'s processes working under `root` (a server's working
/// folder is its state folder; the artifacts' tests share uids and run at
/// once).
pub(super) fn processes_of(uid: u32, root: &Path) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let owned =
                std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
                    status
                        .lines()
                        .find(|line| line.starts_with("Uid:"))
                        .and_then(|line| line.split_whitespace().nth(1))
                        == Some(&uid.to_string())
                });
            owned
                && std::fs::read_link(format!("/proc/{pid}/cwd"))
                    .is_ok_and(|folder| folder.starts_with(root))
        })
        .collect()
}

/// Writes the clients under the root, readable by every uid.
fn clients(root: &Path) {
    let folder = root_folder(root, "bridge");
    std::fs::copy(
        repository().join("sandbox-bridge/toolgate_bridge.py"),
        folder.join("toolgate_bridge.py"),
    )
    .unwrap();
    std::fs::write(folder.join("client.py"), CLIENT).unwrap();
    std::fs::write(folder.join("script.py"), SCRIPT).unwrap();
    for file in ["toolgate_bridge.py", "client.py", "script.py"] {
        std::fs::set_permissions(folder.join(file), std::fs::Permissions::from_mode(0o644))
            .unwrap();
    }
}

/// Writes the configuration and policy as a package or a ConfigMap has
/// them: root's, readable by all, in a root folder.
fn config_folder(root: &Path, path: &str, config: &str, policy: &str) -> PathBuf {
    let folder = root_folder(root, path);
    for (name, text) in [("toolgate.toml", config), ("policy.toml", policy)] {
        std::fs::write(folder.join(name), text).unwrap();
        std::fs::set_permissions(folder.join(name), std::fs::Permissions::from_mode(0o644))
            .unwrap();
    }
    folder.join("toolgate.toml")
}

/// A copy of toolgate carrying `capabilities` as file capabilities, as
/// the stdio image's binary does.
fn with_file_capabilities(root: &Path, capabilities: &str) -> PathBuf {
    let folder = root_folder(root, "usr/bin");
    let program = folder.join("toolgate");
    std::fs::copy(toolgate(), &program).unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let setcap = Command::new("setcap")
        .arg(capabilities)
        .arg(&program)
        .output()
        .unwrap();
    assert!(
        setcap.status.success(),
        "{}",
        String::from_utf8_lossy(&setcap.stderr)
    );
    program
}

/// The tools these tests need, and root: missing, they skip, except under
/// `CI=true`, where everything here is installable and they fail.
fn prerequisites(tools: &[&str]) -> bool {
    let root = nix::unistd::geteuid().is_root();
    assert!(root || !ci(), "the deploy identity tests run as root in CI");
    if !root {
        eprintln!("not root: the artifacts' identities are not tried here");
        return false;
    }
    tools.iter().all(|tool| required_tool(tool))
}

// --- systemd ---------------------------------------------------------------

/// The unit's settings, the drop-in's after the unit's: every value of
/// each key, in order.
fn unit_settings(texts: &[String]) -> BTreeMap<String, Vec<String>> {
    let mut settings: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for text in texts {
        for line in text.lines() {
            if let Some((key, value)) = line.split_once('=')
                && !line.starts_with('#')
                && !line.starts_with('[')
            {
                settings
                    .entry(key.trim().to_owned())
                    .or_default()
                    .push(value.trim().to_owned());
            }
        }
    }
    settings
}

/// A capability list setting (`CapabilityBoundingSet=`,
/// `AmbientCapabilities=`) as systemd reads it: an empty value resets,
/// others add.
fn capabilities(settings: &BTreeMap<String, Vec<String>>, key: &str) -> Vec<String> {
    let mut set = Vec::new();
    for value in settings.get(key).into_iter().flatten() {
        if value.is_empty() {
            set.clear();
        }
        set.extend(
            value
                .split_whitespace()
                .map(|name| name.trim_start_matches("CAP_").to_lowercase()),
        );
    }
    set
}

fn id_of(kind: &str, name: &str) -> u32 {
    let output = Command::new("getent").args([kind, name]).output().unwrap();
    let line = String::from_utf8_lossy(&output.stdout);
    line.split(':')
        .nth(2)
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("{kind} {name}: {line}"))
}

/// The system calls the unit's `SystemCallFilter=` lines allow, with the
/// groups as this systemd defines them: the first line an allow list,
/// then `~` lines take away and the others add back.
fn allowed_calls(settings: &BTreeMap<String, Vec<String>>) -> BTreeSet<String> {
    let output = Command::new("systemd-analyze")
        .arg("syscall-filter")
        .output()
        .unwrap();
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current = String::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        if let Some(name) = line.strip_prefix('@') {
            current = format!("@{}", name.trim());
        } else if let Some(entry) = line.strip_prefix("    ")
            && !entry.starts_with('#')
            && !current.is_empty()
        {
            groups
                .entry(current.clone())
                .or_default()
                .push(entry.trim().to_owned());
        }
    }
    fn expand(name: &str, groups: &BTreeMap<String, Vec<String>>, into: &mut BTreeSet<String>) {
        match groups.get(name) {
            Some(members) => {
                for member in members {
                    expand(member, groups, into);
                }
            }
            None => {
                into.insert(name.to_owned());
            }
        }
    }
    let mut allowed = BTreeSet::new();
    for value in &settings["SystemCallFilter"] {
        let (deny, names) = match value.strip_prefix('~') {
            Some(names) => (true, names),
            None => (false, value.as_str()),
        };
        let mut calls = BTreeSet::new();
        for name in names.split_whitespace() {
            expand(name, &groups, &mut calls);
        }
        if deny {
            allowed.retain(|call| !calls.contains(call));
        } else {
            allowed.extend(calls);
        }
    }
    allowed
}

/// The system calls in a strace record made once `program` was executed
/// (setpriv's own come before).
fn traced_calls(record: &Path, program: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(record).unwrap();
    let executed = format!("execve(\"{}\"", program.display());
    let mut started = false;
    let mut calls = BTreeSet::new();
    for line in text.lines() {
        let Some((_, event)) = line.split_once(' ') else {
            continue;
        };
        let event = event.trim_start();
        if !started {
            started = event.starts_with(&executed) && event.ends_with("= 0");
            continue;
        }
        let name: String = event
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() && event[name.len()..].starts_with('(') {
            calls.insert(name);
        }
    }
    assert!(started, "toolgate's execve is not in the record");
    calls
}

/// The systemd unit, as the package installs it (after its sysusers and
/// tmpfiles snippets ran): toolgate as `toolgate` with the unit's groups,
/// capabilities and no-new-privileges, on the unit's runtime and state
/// folders, with the package's configuration. First the unit alone, then
/// with `run-as.conf`, its stdio server run as `toolgate-mcp` (and again
/// after a restart, on the state folder it was handed). Every system call
/// both made is one the unit's filter allows.
#[test]
fn the_systemd_unit_runs_the_three_users() {
    if !prerequisites(&[
        "setpriv",
        "systemd-sysusers",
        "systemd-tmpfiles",
        "systemd-analyze",
        "strace",
    ]) {
        return;
    }
    let _users = SystemUsers::take();
    let systemd = deploy().join("systemd");
    let sysusers = Command::new("systemd-sysusers")
        .arg(systemd.join("toolgate.sysusers"))
        .output()
        .unwrap();
    assert!(
        sysusers.status.success(),
        "{}",
        String::from_utf8_lossy(&sysusers.stderr)
    );
    let unit = std::fs::read_to_string(systemd.join("toolgate.service")).unwrap();
    let drop_in = std::fs::read_to_string(systemd.join("run-as.conf")).unwrap();
    let config = std::fs::read_to_string(systemd.join("toolgate.toml")).unwrap();
    let policy = std::fs::read_to_string(repository().join("config/policy.toml")).unwrap();

    for with_drop_in in [false, true] {
        let texts = if with_drop_in {
            vec![unit.clone(), drop_in.clone()]
        } else {
            vec![unit.clone()]
        };
        let settings = unit_settings(&texts);
        let name = if with_drop_in {
            "systemd + run-as.conf"
        } else {
            "systemd"
        };
        let user = &settings["User"][0];
        let group = &settings["Group"][0];
        let (uid, gid) = (id_of("passwd", user), id_of("group", group));
        let root = machine_root();
        let root = root.path();

        // The package's postinst: tmpfiles' folders.
        let tmpfiles = std::fs::read_to_string(systemd.join("toolgate.tmpfiles"))
            .unwrap()
            .replace(
                " /var/lib/toolgate",
                &format!(" {}", under(root, "/var/lib/toolgate").display()),
            )
            .replace(
                " /run/toolgate",
                &format!(" {}", under(root, "/run/toolgate").display()),
            );
        let snippet = root.join("toolgate-tmpfiles.conf");
        std::fs::write(&snippet, tmpfiles).unwrap();
        root_folder(root, "var/lib");
        root_folder(root, "run");
        let created = Command::new("systemd-tmpfiles")
            .arg("--create")
            .arg(&snippet)
            .output()
            .unwrap();
        assert!(
            created.status.success(),
            "{}",
            String::from_utf8_lossy(&created.stderr)
        );
        // The unit's start: its runtime and state folders, its user's, at
        // its modes.
        let mode = |key: &str| u32::from_str_radix(&settings[key][0], 8).unwrap();
        for folder in settings["RuntimeDirectory"][0].split_whitespace() {
            owned_folder(
                &under(root, &format!("/run/{folder}")),
                uid,
                gid,
                mode("RuntimeDirectoryMode"),
            );
        }
        for folder in settings["StateDirectory"][0].split_whitespace() {
            owned_folder(
                &under(root, &format!("/var/lib/{folder}")),
                uid,
                gid,
                mode("StateDirectoryMode"),
            );
        }
        assert_eq!(
            settings["UMask"],
            ["0077"],
            "toolgate sets the same umask itself"
        );

        let (mut text, ops_port) =
            rooted_config(&config, root, &["/run/toolgate", "/var/lib/toolgate"]);
        let stdio_uid = with_drop_in.then(|| id_of("passwd", "toolgate-mcp"));
        if with_drop_in {
            text.push_str(&probe_server("toolgate-mcp"));
        }
        let config_path = config_folder(root, "etc/toolgate", &text, &policy);
        let exec: Vec<String> = settings["ExecStart"][0]
            .split_whitespace()
            .map(|arg| {
                arg.replace(
                    "/etc/toolgate",
                    under(root, "/etc/toolgate").to_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(exec[0], "/usr/bin/toolgate");
        assert_eq!(PathBuf::from(&exec[exec.len() - 1]), config_path);

        // The unit's user with its groups (systemd gives the user's
        // groups, toolgate-control among them, and SupplementaryGroups=).
        let groups = Command::new("id").arg("-G").arg(user).output().unwrap();
        let mut groups: Vec<u32> = String::from_utf8_lossy(&groups.stdout)
            .split_whitespace()
            .map(|gid| gid.parse().unwrap())
            .collect();
        for extra in settings.get("SupplementaryGroups").into_iter().flatten() {
            groups.extend(extra.split_whitespace().map(|name| id_of("group", name)));
        }
        let control_group = id_of("group", "toolgate-control");
        assert!(
            groups.contains(&control_group),
            "toolgate is not in toolgate-control: {groups:?}"
        );
        let deployment = Deployment {
            name,
            root: root.to_owned(),
            program: toolgate().into(),
            args: exec[1..].to_vec(),
            identity: Identity {
                uid,
                gid,
                groups,
                bounding: capabilities(&settings, "CapabilityBoundingSet"),
                ambient: capabilities(&settings, "AmbientCapabilities"),
                no_new_privs: settings["NoNewPrivileges"] == ["true"],
            },
            runtime_groups: vec![control_group],
            ops_port,
            control: under(root, "/run/toolgate/control.sock"),
            database: under(root, "/var/lib/toolgate/toolgate.db"),
            stdio_uid,
        };
        clients(root);
        let record = root.join("strace.record");
        let running = deployment.start(Some(&record));
        deployment.three_users(&running);
        running.stop();
        if let Some(uid) = stdio_uid {
            assert!(
                processes_of(uid, root).is_empty(),
                "{name}: a server, or a process it started, outlived toolgate"
            );
            // Started again: the server's state folder is its user's now.
            deployment.run();
        }
        let allowed = allowed_calls(&settings);
        let made = traced_calls(&record, toolgate().as_ref());
        let refused: Vec<&String> = made.difference(&allowed).collect();
        assert!(
            refused.is_empty(),
            "{name}: the unit's SystemCallFilter would kill toolgate for {refused:?}"
        );
        if with_drop_in {
            for call in ["setuid", "setgid", "setgroups", "chown", "capset"] {
                assert!(
                    made.contains(call),
                    "{name}: {call} was not traced: {made:?}"
                );
            }
        }
    }
}

// --- the container image ----------------------------------------------------

/// The stage's toolgate arguments: ENTRYPOINT's after the binary, and
/// CMD's (which a pod's `args` replace).
fn entrypoint_args(lines: &[String]) -> (Vec<String>, Vec<String>) {
    let array = |keyword| serde_json::from_str::<Vec<String>>(instruction(lines, keyword)).unwrap();
    let entrypoint = array("ENTRYPOINT");
    let at = entrypoint
        .iter()
        .position(|arg| arg == "/usr/bin/toolgate")
        .expect("the entrypoint runs toolgate");
    (entrypoint[at + 1..].to_vec(), array("CMD"))
}

/// The two images as an engine runs them (`podman run`, Docker's defaults):
/// their USER, the groups its /etc/group gives it, the engines' default
/// bounding set and no ambient capability, no no-new-privileges; volumes
/// as the image made the folders; the image's configuration. The stdio
/// image's binary carries its file capabilities, and its server runs as
/// the image's toolgate-mcp.
#[test]
fn the_container_images_run_the_three_users() {
    if !prerequisites(&["setpriv", "setcap"]) {
        return;
    }
    let containerfile = std::fs::read_to_string(deploy().join("container/Containerfile")).unwrap();
    let policy = std::fs::read_to_string(repository().join("config/policy.toml")).unwrap();
    for (target, config_name) in [
        ("toolgate", "toolgate.toml"),
        ("stdio", "toolgate-stdio.toml"),
    ] {
        let lines = stage(&containerfile, target);
        let user = instruction(&lines, "USER");
        let (uid, gid) = user.split_once(':').unwrap();
        let (uid, gid): (u32, u32) = (uid.parse().unwrap(), gid.parse().unwrap());
        let run = lines.iter().find(|line| line.contains("useradd")).unwrap();
        // The image's own user and groups, as USER and /etc/group give them.
        assert!(
            run.contains(&format!("groupadd --system --gid {gid} toolgate ")),
            "{run}"
        );
        assert!(
            run.contains("groupadd --system --gid 10002 toolgate-control"),
            "{run}"
        );
        assert!(
            run.contains(&format!(
                "useradd --system --uid {uid} --gid toolgate --groups toolgate-control "
            )),
            "{run}"
        );
        let folders = "install -d -o toolgate -g toolgate -m 0711 /var/lib/toolgate /run/toolgate /run/toolgate/turns";
        assert!(run.contains(folders), "{run}");
        let root = machine_root();
        let root = root.path();
        root_folder(root, "var/lib");
        root_folder(root, "run");
        for folder in ["/var/lib/toolgate", "/run/toolgate", "/run/toolgate/turns"] {
            owned_folder(&under(root, folder), uid, gid, 0o711);
        }
        let config = std::fs::read_to_string(deploy().join("container").join(config_name)).unwrap();
        assert!(
            containerfile.contains(&format!(
                "COPY deploy/container/{config_name} /etc/toolgate/toolgate.toml"
            )),
            "{config_name}"
        );
        let (mut text, ops_port) =
            rooted_config(&config, root, &["/run/toolgate", "/var/lib/toolgate"]);
        let parsed: toml::Value = toml::from_str(&config).unwrap();
        let run_as = parsed["mcp"].get("run_as").and_then(toml::Value::as_str);
        let stdio_uid = run_as.map(|run_as| {
            text.push_str(&probe_server(run_as));
            let (server_uid, _) = run_as.split_once(':').unwrap();
            let server_uid: u32 = server_uid.parse().unwrap();
            assert!(
                run.contains(&format!(
                    "useradd --system --uid {server_uid} --gid toolgate-mcp "
                )),
                "{run}"
            );
            server_uid
        });
        assert_eq!(parsed["control"]["socket_group"].as_str(), Some("10002"));
        let config_path = config_folder(root, "etc/toolgate", &text, &policy);
        let program = match lines.iter().find_map(|line| {
            line.split("setcap ")
                .nth(1)?
                .split_whitespace()
                .next()
                .map(str::to_owned)
        }) {
            Some(capabilities) => {
                let program = with_file_capabilities(root, &capabilities);
                // A container that drops them from its bounding set cannot
                // start the binary at all (the kernel refuses to run it
                // without the capabilities it must have).
                let dropped = Identity {
                    no_new_privs: false,
                    ..Identity::plain(uid, &[])
                }
                .command(&program)
                .arg("--version")
                .output()
                .unwrap();
                assert!(
                    !dropped.status.success()
                        && String::from_utf8_lossy(&dropped.stderr)
                            .contains("Operation not permitted"),
                    "{}",
                    String::from_utf8_lossy(&dropped.stderr)
                );
                program
            }
            None => toolgate().into(),
        };
        assert_eq!(
            stdio_uid.is_some(),
            program != Path::new(toolgate()),
            "{target}"
        );
        let (entrypoint, cmd) = entrypoint_args(&lines);
        let args: Vec<String> = entrypoint
            .into_iter()
            .chain(cmd)
            .map(|arg| {
                if arg == "/etc/toolgate/toolgate.toml" {
                    config_path.display().to_string()
                } else {
                    arg
                }
            })
            .collect();
        let deployment = Deployment {
            name: if stdio_uid.is_some() {
                "the stdio image"
            } else {
                "the image"
            },
            root: root.to_owned(),
            program,
            args,
            identity: Identity {
                uid,
                gid,
                groups: vec![10002],
                bounding: ENGINE_DEFAULT_CAPABILITIES
                    .iter()
                    .map(|name| (*name).to_owned())
                    .collect(),
                ambient: Vec::new(),
                no_new_privs: false,
            },
            runtime_groups: vec![10002],
            ops_port,
            control: under(root, "/run/toolgate/control.sock"),
            database: under(root, "/var/lib/toolgate/toolgate.db"),
            stdio_uid,
        };
        clients(root);
        deployment.run();
    }
}

// --- Kubernetes ---------------------------------------------------------------

/// A container's identity from its pod's and its own securityContext.
fn pod_identity(pod: &Value, container: &Value) -> Identity {
    let setting = |key: &str| {
        let own = &container["securityContext"][key];
        if own.is_null() {
            pod["securityContext"][key].clone()
        } else {
            own.clone()
        }
    };
    let capabilities = &container["securityContext"]["capabilities"];
    assert_eq!(capabilities["drop"], json!(["ALL"]));
    let added: Vec<String> = capabilities["add"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|name| name.as_str().unwrap().to_lowercase())
        .collect();
    let uid = u32::try_from(setting("runAsUser").as_u64().unwrap()).unwrap();
    Identity {
        uid,
        gid: u32::try_from(setting("runAsGroup").as_u64().unwrap()).unwrap(),
        groups: pod["securityContext"]["supplementalGroups"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|gid| u32::try_from(gid.as_u64().unwrap()).unwrap())
            .collect(),
        // A non-root process keeps no capability past exec, whatever it
        // was given, but file capabilities within the bounding set.
        bounding: added.clone(),
        ambient: Vec::new(),
        no_new_privs: setting("allowPrivilegeEscalation") != json!(true),
    }
}

/// The DaemonSet as the kubelet runs it: hostPath folders the kubelet made
/// (root's, 0755), the init container's command as its securityContext
/// says, then toolgate as the pod's user with its supplementary groups, no
/// capability and no-new-privileges, on the ConfigMap's configuration.
/// Then the stdio-servers overlay: the stdio image's binary with its file
/// capabilities, the overlay's capabilities and privilege escalation, and
/// the ConfigMap's run_as.
#[test]
fn the_kubernetes_daemonset_runs_the_three_users() {
    if !prerequisites(&["setpriv", "setcap"]) {
        return;
    }
    let daemonset = manifest("base/daemonset.yaml");
    let configmap = manifest("base/configmap.yaml");
    let overlay = manifest("stdio-servers/daemonset.yaml");
    let containerfile = std::fs::read_to_string(deploy().join("container/Containerfile")).unwrap();
    let pod = &daemonset["spec"]["template"]["spec"];
    let config = configmap["data"]["toolgate.toml"].as_str().unwrap();
    let policy = configmap["data"]["policy.toml"].as_str().unwrap();
    let volumes: BTreeMap<String, String> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|volume| {
            Some((
                volume["name"].as_str()?.to_owned(),
                volume["hostPath"]["path"].as_str()?.to_owned(),
            ))
        })
        .collect();

    for with_overlay in [false, true] {
        let root = machine_root();
        let root = root.path();
        // The kubelet: DirectoryOrCreate makes a missing folder root's, 0755.
        for path in volumes.values() {
            root_folder(root, path);
        }
        // A container's mount path is its volume's host folder here.
        let host = |container: &Value, path: &str| -> String {
            let mut path = path.to_owned();
            for mount in container["volumeMounts"].as_array().unwrap() {
                let mount_path = mount["mountPath"].as_str().unwrap();
                if let Some(host_path) = volumes.get(mount["name"].as_str().unwrap()) {
                    path = path.replace(mount_path, under(root, host_path).to_str().unwrap());
                }
            }
            path
        };
        let init = &pod["initContainers"][0];
        let command: Vec<String> = init["command"]
            .as_array()
            .unwrap()
            .iter()
            .map(|arg| host(init, arg.as_str().unwrap()))
            .collect();
        let identity = pod_identity(pod, init);
        let prepared = identity
            .command(Path::new(&command[0]))
            .args(&command[1..])
            .output()
            .unwrap();
        assert!(
            prepared.status.success(),
            "the init container: {}",
            String::from_utf8_lossy(&prepared.stderr)
        );

        let mut container = pod["containers"][0].clone();
        if with_overlay {
            let patch = &overlay["spec"]["template"]["spec"]["containers"][0];
            assert_eq!(patch["name"], container["name"]);
            container["image"] = patch["image"].clone();
            for (key, value) in patch["securityContext"].as_object().unwrap() {
                container["securityContext"][key] = value.clone();
            }
        }
        let identity = pod_identity(pod, &container);
        // Every configuration path is under a volume; the config's mount
        // is the ConfigMap's files.
        let mut text = config.to_owned();
        for mount in container["volumeMounts"].as_array().unwrap() {
            let mount_path = mount["mountPath"].as_str().unwrap();
            if volumes.contains_key(mount["name"].as_str().unwrap()) {
                text = text.replace(
                    &format!("\"{mount_path}"),
                    &format!("\"{}", host(&container, mount_path)),
                );
                text = text.replace(
                    &format!("sqlite://{mount_path}"),
                    &format!("sqlite://{}", host(&container, mount_path)),
                );
            }
        }
        let (mut text, ops_port) = rooted_config(&text, root, &[]);
        let parsed: toml::Value = toml::from_str(config).unwrap();
        let stdio_uid = with_overlay.then(|| {
            let run_as = parsed["mcp"]["run_as"].as_str().unwrap();
            text.push_str(&probe_server(run_as));
            run_as.split_once(':').unwrap().0.parse::<u32>().unwrap()
        });
        let control_group: u32 = parsed["control"]["socket_group"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(identity.groups.contains(&control_group), "{identity:?}");
        let config_path = config_folder(root, "etc/toolgate", &text, policy);
        let lines = stage(
            &containerfile,
            if with_overlay { "stdio" } else { "toolgate" },
        );
        let program = match lines.iter().find_map(|line| {
            line.split("setcap ")
                .nth(1)?
                .split_whitespace()
                .next()
                .map(str::to_owned)
        }) {
            Some(capabilities) => {
                // The overlay adds what the binary's capabilities need.
                for name in capabilities.trim_end_matches("+ep").split(',') {
                    let name = name.trim_start_matches("cap_").to_owned();
                    assert!(identity.bounding.contains(&name), "{name}: {identity:?}");
                }
                with_file_capabilities(root, &capabilities)
            }
            None => toolgate().into(),
        };
        assert_eq!(
            container["image"].as_str().unwrap().contains("stdio"),
            with_overlay
        );
        let (mut args, _) = entrypoint_args(&lines);
        args.extend(container["args"].as_array().unwrap().iter().map(|arg| {
            arg.as_str()
                .unwrap()
                .replace("/etc/toolgate/toolgate.toml", config_path.to_str().unwrap())
        }));
        let deployment = Deployment {
            name: if with_overlay {
                "kubernetes/stdio-servers"
            } else {
                "kubernetes"
            },
            root: root.to_owned(),
            program,
            args,
            identity,
            runtime_groups: vec![control_group],
            ops_port,
            control: PathBuf::from(host(
                &container,
                parsed["control"]["socket"].as_str().unwrap(),
            )),
            database: PathBuf::from(host(&container, "/var/lib/toolgate/toolgate.db")),
            stdio_uid,
        };
        clients(root);
        deployment.run();
    }
}
