//! A stdio server's child process: its environment is constructed, never
//! inherited; it runs as the operator's `run_as` user when one is set; it
//! leads its own process group, so ending it ends everything it started;
//! its stderr is drained into bounded, escaped log lines, within a byte
//! budget per interval, that reach an operator, never the model.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};

use crate::domain::SecretValue;
use crate::domain::environment::{SYNTHESIZED, is_tier0};
use crate::domain::secret::scrub;
use crate::ports::Metrics;

/// The PATH every stdio server gets: the system's program folders and
/// nothing from toolgate's own environment.
pub const CHILD_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// The locale every stdio server gets.
pub const CHILD_LANG: &str = "C.UTF-8";
/// The longest stderr line kept; the rest of a longer line is cut.
pub const MAXIMUM_STDERR_LINE: usize = 1024;
/// Bytes of one server's stderr logged per [`STDERR_INTERVAL`]; the rest is
/// counted and summarized, so a server cannot flood the operator's log.
pub const STDERR_BUDGET_BYTES: usize = 16 * 1024;
/// The interval the stderr budget is counted over.
pub const STDERR_INTERVAL: Duration = Duration::from_secs(10);

/// The user a child runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunAs {
    /// Its uid.
    pub uid: u32,
    /// Its primary group; supplementary groups are cleared.
    pub gid: u32,
}

/// What a child is started from.
#[derive(Debug)]
pub struct ChildSpec {
    /// The server, for logs and the state folder.
    pub server_id: String,
    /// The program.
    pub program: String,
    /// Its arguments: never a credential.
    pub args: Vec<String>,
    /// The operator's declared non-secret variables.
    pub declared: BTreeMap<String, String>,
    /// For the `env` scheme: the one credential variable and its value.
    pub credential: Option<(String, SecretValue)>,
    /// This server's state folder; HOME and TMPDIR live in it.
    pub state_dir: PathBuf,
    /// The user it runs as; toolgate's own when `None`.
    pub run_as: Option<RunAs>,
    /// Its `PATH` (also where a bare program name is looked up);
    /// [`CHILD_PATH`] when `None`.
    pub path: Option<String>,
}

/// Why a child could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    /// The state folder could not be prepared.
    #[error("state folder for {server_id}: {kind}")]
    StateDir {
        /// The server.
        server_id: String,
        /// What the filesystem said.
        kind: std::io::ErrorKind,
    },
    /// The program did not start.
    #[error("{server_id} did not start: {kind}")]
    Spawn {
        /// The server.
        server_id: String,
        /// What the system said.
        kind: std::io::ErrorKind,
    },
}

/// The child's whole environment: the synthesized tier, then the declared
/// variables (tier-0 names refused, as configuration validation refuses
/// them), then the credential variable. Nothing else.
pub fn environment(spec: &ChildSpec) -> Vec<(String, String)> {
    let home = spec.state_dir.display().to_string();
    let tmp = spec.state_dir.join("tmp").display().to_string();
    let mut environment: BTreeMap<String, String> = [
        (
            "PATH",
            spec.path.clone().unwrap_or_else(|| CHILD_PATH.to_owned()),
        ),
        ("HOME", home),
        ("LANG", CHILD_LANG.to_owned()),
        ("TMPDIR", tmp),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value))
    .collect();
    debug_assert!(
        SYNTHESIZED
            .iter()
            .all(|name| environment.contains_key(*name))
    );
    for (name, value) in &spec.declared {
        if !is_tier0(name) {
            environment.insert(name.clone(), value.clone());
        }
    }
    if let Some((name, value)) = &spec.credential
        && !is_tier0(name)
    {
        // One of the two places a credential is revealed: a child's
        // environment, never its argv.
        environment.insert(name.clone(), value.reveal().to_owned());
    }
    environment.into_iter().collect()
}

/// Prepares the state folder (0700, the child's own) and the command:
/// environment cleared and rebuilt, its user, stdio piped, its own process
/// group.
pub fn command(spec: &ChildSpec) -> Result<Command, ChildError> {
    prepare_state_dir(&spec.state_dir, spec.run_as).map_err(|error| ChildError::StateDir {
        server_id: spec.server_id.clone(),
        kind: error.kind(),
    })?;
    let mut command = Command::new(&spec.program);
    command
        .args(&spec.args)
        .env_clear()
        .envs(environment(spec))
        .current_dir(&spec.state_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(run_as) = spec.run_as {
        // The group first, then the user; the standard library also drops
        // supplementary groups when it changes the user.
        command.gid(run_as.gid).uid(run_as.uid);
    }
    without_privileges(&mut command);
    Ok(command)
}

/// What capset(2) takes: which thread (0: this one), in the layout of
/// version 3, and two words of each set.
#[repr(C)]
struct CapabilityHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapabilityData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `_LINUX_CAPABILITY_VERSION_3`.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Whether this process holds any capability a child could keep: its
/// permitted, inheritable or ambient set is not empty (a toolgate given
/// CAP_SETUID and the like to run servers as other users; root).
fn holds_capabilities() -> bool {
    std::fs::read_to_string("/proc/self/status").map_or(true, |status| {
        status.lines().any(|line| {
            ["CapPrm:", "CapInh:", "CapAmb:"].iter().any(|set| {
                line.strip_prefix(set)
                    .is_some_and(|value| value.trim().bytes().any(|digit| digit != b'0'))
            })
        })
    })
}

/// A child holds none of toolgate's privileges: after its user is set, and
/// before it runs its program, every capability is dropped from its
/// bounding set (possible only while it is still root; a child of another
/// user has none to drop), its permitted, effective, inheritable and
/// ambient sets are emptied when toolgate holds any (a toolgate that is not
/// root keeps its capabilities across the change of user, and a program's
/// file capabilities would keep what the process held), and no program it
/// runs can gain any (no new privileges: set-uid bits and file capabilities
/// are not honoured). Even run as root by an operator's explicit choice, it
/// has no capability. A toolgate holding none makes no capset call, which
/// a system call filter may refuse.
#[allow(unsafe_code)]
fn without_privileges(command: &mut Command) {
    use nix::libc::{PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, SYS_capset, c_ulong, prctl, syscall};
    let clear = holds_capabilities();
    // SAFETY: the closure runs in the forked child before exec, where only
    // async-signal-safe work is allowed: it makes prctl(2) and capset(2)
    // system calls on integers and on structures on its own stack alone,
    // allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(move || {
            let zero: c_ulong = 0;
            // Past the kernel's last capability this fails (EINVAL), and
            // without CAP_SETPCAP it fails (EPERM) with nothing to drop.
            for capability in 0..64 as c_ulong {
                prctl(PR_CAPBSET_DROP, capability, zero, zero, zero);
            }
            if clear {
                let header = CapabilityHeader {
                    version: CAPABILITY_VERSION_3,
                    pid: 0,
                };
                let none = [CapabilityData {
                    effective: 0,
                    permitted: 0,
                    inheritable: 0,
                }; 2];
                // Emptying the permitted and inheritable sets empties the
                // ambient one too.
                if syscall(SYS_capset, &raw const header, none.as_ptr()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if prctl(PR_SET_NO_NEW_PRIVS, 1 as c_ulong, zero, zero, zero) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn prepare_state_dir(state_dir: &Path, run_as: Option<RunAs>) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
    let tmp = state_dir.join("tmp");
    // A folder an earlier start handed to the server's user is that user's
    // own: a toolgate that is not root (holding CAP_CHOWN, not CAP_FOWNER
    // or CAP_DAC_OVERRIDE) can neither change its mode nor look inside,
    // and need not.
    if let Some(run_as) = run_as
        && std::fs::symlink_metadata(state_dir)
            .is_ok_and(|metadata| metadata.is_dir() && metadata.uid() == run_as.uid)
    {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&tmp)?;
    std::fs::set_permissions(state_dir, std::fs::Permissions::from_mode(0o700))?;
    if let Some(run_as) = run_as {
        for folder in [state_dir, tmp.as_path()] {
            std::os::unix::fs::chown(folder, Some(run_as.uid), Some(run_as.gid))?;
        }
    }
    Ok(())
}

/// Starts the child.
pub fn spawn(spec: &ChildSpec) -> Result<Child, ChildError> {
    command(spec)?.spawn().map_err(|error| ChildError::Spawn {
        server_id: spec.server_id.clone(),
        kind: error.kind(),
    })
}

/// Drains a child's stderr into log lines until the pipe closes: each cut
/// to [`MAXIMUM_STDERR_LINE`] bytes, scrubbed of `secrets`, with every
/// control character escaped (no terminal sequence, carriage return or fake
/// line reaches the log as written), and at most [`STDERR_BUDGET_BYTES`]
/// logged per [`STDERR_INTERVAL`]. What is dropped is counted in
/// `mcp_stderr_dropped_bytes_total` and told in one summary line per
/// interval. Returns how many lines it logged.
pub async fn drain_stderr(
    server_id: String,
    stderr: ChildStderr,
    secrets: Vec<SecretValue>,
    metrics: Arc<dyn Metrics>,
) -> usize {
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    let mut logged = 0;
    let mut budget = StderrBudget::default();
    let mut tick = tokio::time::interval(STDERR_INTERVAL);
    tick.tick().await;
    loop {
        line.clear();
        // Reads at most one line past the cap, so a child that never ends a
        // line cannot grow this buffer without bound.
        let read = tokio::select! {
            read = read_bounded_line(&mut reader, &mut line) => read,
            _ = tick.tick() => {
                budget.roll(&server_id, metrics.as_ref());
                continue;
            }
        };
        match read {
            Ok(0) | Err(_) => {
                budget.roll(&server_id, metrics.as_ref());
                return logged;
            }
            Ok(read) => {
                if !budget.spend(read) {
                    continue;
                }
                // A server can print its own environment; its credential
                // never reaches a log line.
                let mut text = scrub(&String::from_utf8_lossy(&line), &secrets);
                if line.len() == MAXIMUM_STDERR_LINE {
                    text = crate::domain::secret::scrub_cut_prefix(text, &secrets);
                }
                let text = escape_control(text.trim_end_matches(['\n', '\r']));
                tracing::info!(server = %server_id, line = %text, "mcp server stderr");
                logged += 1;
            }
        }
    }
}

/// One server's stderr budget in the current interval.
#[derive(Debug, Default)]
struct StderrBudget {
    spent: usize,
    dropped_bytes: u64,
    dropped_lines: u64,
}

impl StderrBudget {
    /// Whether a line of `bytes` may be logged; counts it as dropped if not.
    fn spend(&mut self, bytes: usize) -> bool {
        if self.spent.saturating_add(bytes.min(MAXIMUM_STDERR_LINE)) > STDERR_BUDGET_BYTES {
            self.dropped_bytes += bytes as u64;
            self.dropped_lines += 1;
            return false;
        }
        self.spent += bytes.min(MAXIMUM_STDERR_LINE);
        true
    }

    /// Ends the interval: one summary line and the metric for what was
    /// dropped in it.
    fn roll(&mut self, server_id: &str, metrics: &dyn Metrics) {
        if self.dropped_lines > 0 {
            tracing::warn!(
                server = %server_id,
                dropped_lines = self.dropped_lines,
                dropped_bytes = self.dropped_bytes,
                "mcp server stderr over its budget; the rest of the interval was dropped"
            );
            metrics.add(
                "mcp_stderr_dropped_bytes_total",
                vec![("server", server_id.to_owned())],
                self.dropped_bytes,
            );
        }
        *self = StderrBudget::default();
    }
}

/// `text` with every control character written as `\u{…}`.
pub fn escape_control(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

async fn read_bounded_line<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
) -> std::io::Result<usize> {
    let mut total = 0;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(total);
        }
        let (chunk, done) = match available.iter().position(|b| *b == b'\n') {
            Some(end) => (&available[..=end], true),
            None => (available, false),
        };
        let used = chunk.len();
        let room = MAXIMUM_STDERR_LINE.saturating_sub(line.len());
        line.extend_from_slice(&chunk[..used.min(room)]);
        reader.consume(used);
        total += used;
        if done {
            return Ok(total);
        }
    }
}

/// Ends the child's whole process group: SIGTERM, up to `grace` to exit,
/// then SIGKILL. Returns whether it exited within the grace.
pub async fn terminate(child: &mut Child, grace: Duration) -> bool {
    let Some(id) = child.id() else {
        // Already reaped.
        return true;
    };
    let group = Pid::from_raw(id as i32);
    let _ = killpg(group, Signal::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_ok() {
        // The leader is gone; anything it left in the group goes too.
        let _ = killpg(group, Signal::SIGKILL);
        return true;
    }
    let _ = killpg(group, Signal::SIGKILL);
    let _ = child.wait().await;
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn spec(folder: &Path, program: &str, args: &[&str]) -> ChildSpec {
        ChildSpec {
            server_id: "probe".into(),
            program: program.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            declared: [
                ("LOG_LEVEL".to_owned(), "debug".to_owned()),
                ("LD_PRELOAD".to_owned(), "/tmp/evil.so".to_owned()),
            ]
            .into(),
            credential: Some(("API_TOKEN".to_owned(), SecretValue::new("tok-123"))),
            state_dir: folder.join("state/probe"),
            run_as: None,
            path: None,
        }
    }

    /// Counts what is added, by name.
    #[derive(Default)]
    struct Counted(std::sync::Mutex<BTreeMap<&'static str, u64>>);

    impl Metrics for Counted {
        fn add(&self, name: &'static str, _: crate::ports::Labels, amount: u64) {
            *self.0.lock().unwrap().entry(name).or_default() += amount;
        }
        fn observe(&self, _: &'static str, _: crate::ports::Labels, _: f64) {}
        fn render(&self) -> crate::ports::BoxFuture<'_, String> {
            Box::pin(async { String::new() })
        }
    }

    /// The child sees the built environment and nothing of ours: cargo sets
    /// CARGO_MANIFEST_DIR in this test process, and it must not come back.
    #[tokio::test]
    async fn the_environment_is_built_not_inherited() {
        assert!(
            std::env::var("CARGO_MANIFEST_DIR").is_ok(),
            "the sentinel is in our own environment"
        );
        let folder = tempfile::tempdir().unwrap();
        let spec = spec(folder.path(), "/usr/bin/env", &[]);
        let mut child = spawn(&spec).unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut text = String::new();
        stdout.read_to_string(&mut text).await.unwrap();
        child.wait().await.unwrap();
        let mut names: Vec<&str> = text
            .lines()
            .filter_map(|line| line.split_once('=').map(|(n, _)| n))
            .collect();
        names.sort();
        assert_eq!(
            names,
            vec!["API_TOKEN", "HOME", "LANG", "LOG_LEVEL", "PATH", "TMPDIR"],
            "{text}"
        );
        assert!(text.contains("API_TOKEN=tok-123"));
        assert!(!text.contains("CARGO_MANIFEST_DIR") && !text.contains("LD_PRELOAD"));
        assert!(text.contains(&format!("HOME={}", spec.state_dir.display())));
        // The credential never reaches argv.
        let command = command(&spec).unwrap();
        assert!(
            command
                .as_std()
                .get_args()
                .all(|arg| !arg.to_string_lossy().contains("tok-123"))
        );
    }

    #[tokio::test]
    async fn stderr_is_drained_in_bounded_lines() {
        let folder = tempfile::tempdir().unwrap();
        // Three lines, the middle one 5,000 bytes long: logged as three, cut.
        let script =
            "printf 'one\\n' >&2; head -c 5000 /dev/zero | tr '\\0' x >&2; printf '\\ntwo\\n' >&2";
        let mut child = spawn(&spec(folder.path(), "/bin/sh", &["-c", script])).unwrap();
        let stderr = child.stderr.take().unwrap();
        let metrics = Arc::new(Counted::default());
        let lines = tokio::spawn(drain_stderr(
            "probe".into(),
            stderr,
            Vec::new(),
            metrics.clone(),
        ));
        child.wait().await.unwrap();
        assert_eq!(lines.await.unwrap(), 3);
        assert!(metrics.0.lock().unwrap().is_empty(), "nothing was dropped");
    }

    /// 8 MiB of stderr in one call: the budget's worth is logged, the rest
    /// is counted, and the drain keeps up (the child is never blocked).
    #[tokio::test]
    async fn stderr_past_its_budget_is_counted_not_logged() {
        let folder = tempfile::tempdir().unwrap();
        let script = "head -c 8388608 /dev/zero | tr '\\0' '\\n' | sed 's/^/fake INFO line/' >&2";
        let started = tokio::time::Instant::now();
        let mut child = spawn(&spec(folder.path(), "/bin/sh", &["-c", script])).unwrap();
        let stderr = child.stderr.take().unwrap();
        let metrics = Arc::new(Counted::default());
        let lines = tokio::spawn(drain_stderr(
            "probe".into(),
            stderr,
            Vec::new(),
            metrics.clone(),
        ));
        child.wait().await.unwrap();
        let logged = lines.await.unwrap();
        // A loaded machine may stretch the flood over several intervals,
        // each with a budget of its own.
        let intervals = 1 + (started.elapsed().as_secs() / STDERR_INTERVAL.as_secs()) as usize;
        assert!(
            logged * "fake INFO line".len()
                <= intervals * (STDERR_BUDGET_BYTES + MAXIMUM_STDERR_LINE),
            "{logged} lines logged in {intervals} interval(s)"
        );
        let dropped = metrics.0.lock().unwrap()["mcp_stderr_dropped_bytes_total"];
        assert!(dropped > 8_000_000, "{dropped} bytes counted as dropped");
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(
            escape_control("\u{1b}[31mred\r2026 INFO fake\u{7}"),
            "\\u{1b}[31mred\\u{d}2026 INFO fake\\u{7}"
        );
        assert_eq!(escape_control("plain é"), "plain é");
    }

    #[test]
    fn a_secret_cut_at_the_cap_is_redacted_too() {
        let secrets = [SecretValue::new("tok-SECRET-9876")];
        let line = format!("{}tok-SEC", "x".repeat(10));
        assert_eq!(
            crate::domain::secret::scrub_cut_prefix(line, &secrets),
            format!("{}[redacted]", "x".repeat(10))
        );
        assert_eq!(
            crate::domain::secret::scrub_cut_prefix("plain".into(), &secrets),
            "plain"
        );
    }

    #[tokio::test]
    async fn a_long_line_is_cut_at_the_cap() {
        let mut input: &[u8] = &[b'x'; 5000];
        let mut reader = BufReader::new(&mut input);
        let mut line = Vec::new();
        assert_eq!(
            read_bounded_line(&mut reader, &mut line).await.unwrap(),
            5000
        );
        assert_eq!(line.len(), MAXIMUM_STDERR_LINE);
    }

    #[tokio::test]
    async fn terminate_ends_the_whole_group() {
        let folder = tempfile::tempdir().unwrap();
        // The shell starts a grandchild that would outlive it, and ignores TERM.
        let script = "trap '' TERM; sleep 30 & sleep 30; wait";
        let mut child = spawn(&spec(folder.path(), "/bin/sh", &["-c", script])).unwrap();
        let group = child.id().unwrap() as i32;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let graceful = terminate(&mut child, Duration::from_millis(300)).await;
        assert!(!graceful, "TERM was ignored, so it took KILL");
        // No live process of the group is left (a killed orphan may linger as
        // a zombie until the system reaps it).
        let mut survivors = live_members(group);
        for _ in 0..20 {
            if survivors.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            survivors = live_members(group);
        }
        assert!(
            survivors.is_empty(),
            "group members still running: {survivors:?}"
        );
    }

    /// Processes of process group `group` that are not zombies.
    fn live_members(group: i32) -> Vec<i32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|entry| {
                let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
                let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
                let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
                let (state, pgrp) = (fields.first()?, fields.get(2)?.parse::<i32>().ok()?);
                (pgrp == group && *state != "Z").then_some(pid)
            })
            .collect()
    }
}
