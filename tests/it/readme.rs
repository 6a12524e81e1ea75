//! README.md as a newcomer follows it: every fenced block, in order, in a
//! copy of the checkout with the example configuration, `cargo run --`
//! standing for the built binary. Each block is run here, compared with
//! what toolgate prints, or named with the test that runs it elsewhere (or
//! why no test can); a block added to README.md that is none of these
//! fails the test.

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// One fenced block: its language (empty for plain output) and its text,
/// with the indentation of its fence taken off.
#[derive(Debug)]
struct Block {
    language: String,
    text: String,
}

fn blocks(readme: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, Block)> = None;
    for line in readme.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match (&mut open, trimmed.strip_prefix("```")) {
            (None, Some(language)) => {
                open = Some((
                    indent,
                    Block {
                        language: language.trim().to_owned(),
                        text: String::new(),
                    },
                ));
            }
            (Some(_), Some("")) => blocks.push(open.take().unwrap().1),
            (Some((indent, block)), _) => {
                block
                    .text
                    .push_str(line.get(*indent..).unwrap_or(line.trim_start()));
                block.text.push('\n');
            }
            (None, None) => {}
        }
    }
    blocks
}

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn copy_folder(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_folder(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A checkout as README.md meets it: the example configuration (its front
/// door on `port`), the bridge clients, an empty `var/`, and `cargo` on
/// the PATH answering `cargo run [-q] -- ARGS` with the built binary.
struct Checkout {
    root: tempfile::TempDir,
    path: String,
    port: u16,
}

impl Checkout {
    fn new() -> Checkout {
        let root = tempfile::tempdir().unwrap();
        copy_folder(&repository().join("config"), &root.path().join("config"));
        copy_folder(
            &repository().join("sandbox-bridge"),
            &root.path().join("sandbox-bridge"),
        );
        std::fs::create_dir_all(root.path().join("var")).unwrap();
        let port = crate::support::free_port();
        let config = root.path().join("config/toolgate.toml");
        let text = std::fs::read_to_string(&config).unwrap();
        assert!(text.contains("127.0.0.1:8766"));
        std::fs::write(
            &config,
            text.replace("127.0.0.1:8766", &format!("127.0.0.1:{port}")),
        )
        .unwrap();
        let shims = root.path().join("shims");
        std::fs::create_dir_all(&shims).unwrap();
        let cargo = shims.join("cargo");
        std::fs::write(
            &cargo,
            format!(
                "#!/bin/sh\n[ \"$1\" = run ] || exit 64\nshift\n[ \"$1\" = -q ] && shift\n[ \"$1\" = -- ] && shift\nexec {} \"$@\"\n",
                env!("CARGO_BIN_EXE_toolgate")
            ),
        )
        .unwrap();
        std::fs::set_permissions(&cargo, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = format!(
            "{}:{}",
            shims.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Checkout { root, path, port }
    }

    fn dir(&self) -> &Path {
        self.root.path()
    }

    /// The block's text with the front door's port as this checkout has it.
    fn local(&self, text: &str) -> String {
        text.replace("127.0.0.1:8766", &format!("127.0.0.1:{}", self.port))
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command
            .current_dir(self.dir())
            .env("PATH", &self.path)
            .env_remove("TOOLGATE_STORE_URL")
            .env_remove("TOOLGATE_CONTROL_SOCKET")
            .env_remove("RUST_LOG");
        command
    }

    /// Runs a shell block as a user pastes it (bash, stopping at the first
    /// failure); the key the key block wrote is in `KEY` when there is one.
    fn shell(&self, text: &str) -> Output {
        let mut command = self.command("bash");
        command.args(["-euo", "pipefail", "-c", &self.local(text)]);
        if let Some(key) = self.key() {
            command.env("KEY", key);
        }
        let output = command.output().unwrap();
        assert!(
            output.status.success(),
            "{text}\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    fn key(&self) -> Option<String> {
        let text = std::fs::read_to_string(self.dir().join("var/front.key")).ok()?;
        text.lines()
            .find_map(|line| line.strip_prefix("key: "))
            .map(str::to_owned)
    }

    /// A long-running block, in a process group of its own.
    fn background(&self, text: &str) -> Child {
        let mut command = self.command("bash");
        command
            .args(["-c", self.local(text).trim()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        command.spawn().unwrap()
    }
}

/// Ends a background block's whole process group.
struct Background(Child);

impl Drop for Background {
    fn drop(&mut self) {
        let group = nix::unistd::Pid::from_raw(-(self.0.id() as i32));
        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.0.wait();
    }
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{what} did not happen"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Blocks no test here runs, each with where it is tried or why it cannot
/// be, by its first line.
const ELSEWHERE: &[(&str, &str)] = &[
    (
        "scripts/test",
        "the test command: this test is part of its run",
    ),
    (
        "scripts/package-deb",
        "deploy::packages builds, installs and purges the package",
    ),
    (
        "scripts/release",
        "deploy::packages builds and unpacks the archive from the commit",
    ),
    (
        "podman build",
        "no container engine on the test machine; deploy tests check the Containerfile",
    ),
    (
        "kubectl create secret",
        "no cluster on the test machine; deploy tests parse the manifests",
    ),
    (
        "cargo bench --bench arguments",
        "benchmarks measure, they assert nothing; clippy --all-targets builds them",
    ),
];

#[test]
fn every_block_of_the_readme_runs_as_written() {
    let readme = std::fs::read_to_string(repository().join("README.md")).unwrap();
    let blocks = blocks(&readme);
    let checkout = Checkout::new();
    let mut ran = vec![false; blocks.len()];
    let position = |first: &str| {
        blocks
            .iter()
            .position(|block| block.text.starts_with(first))
            .unwrap_or_else(|| panic!("README.md has no block starting {first:?}"))
    };

    // Run it.
    let serve = position("cargo run -- serve --migrate");
    let _serving = Background(checkout.background(&blocks[serve].text));
    ran[serve] = true;
    let socket = checkout.dir().join("var/run/control.sock");
    wait_for("the control socket", || {
        std::os::unix::net::UnixStream::connect(&socket).is_ok()
    });

    // A session, a turn and the sample script, printing what README says.
    let session = position(
        "curl -s --unix-socket var/run/control.sock http://toolgate/v1/sessions \\\n  -H 'Content-Type: application/json' \\\n  -d '{\"session_id\": \"0b6e5a8e",
    );
    let opened = stdout(&checkout.shell(&blocks[session].text));
    assert!(opened.contains("mcp.everything.get_sum"), "{opened}");
    ran[session] = true;
    // The stdio server ran with its HOME and TMPDIR absolute and existing:
    // npm's cache is in its state folder, not one level deeper.
    let state = checkout.dir().join("var/mcp/everything");
    assert!(state.join("tmp").is_dir());
    assert!(state.join(".npm").is_dir(), "npx's cache is under HOME");
    assert!(!state.join("var").exists(), "nothing nests a relative HOME");
    let turn = position("SCRIPT=sandbox-bridge/example.py");
    let printed = stdout(&checkout.shell(&blocks[turn].text));
    ran[turn] = true;
    let expected = position("hello from the sandbox");
    assert_eq!(
        printed, blocks[expected].text,
        "the script prints what README.md says"
    );
    ran[expected] = true;

    // A key for the front door, put in force by a reload.
    let key = position("cargo run -q -- key > var/front.key");
    let reloaded = stdout(&checkout.shell(&blocks[key].text));
    assert!(
        reloaded.contains("reloaded: front API keys (1 in force; added me)"),
        "{reloaded}"
    );
    ran[key] = true;

    // Each client's snippet, with the client it names, as pasted.
    let installed = PathBuf::from(
        std::env::var("TOOLGATE_MCP_SERVERS")
            .unwrap_or_else(|_| "/var/tmp/toolgate-mcp-servers".into()),
    );
    for (index, block) in blocks.iter().enumerate() {
        if block.language != "python" {
            continue;
        }
        let venv = if block.text.contains("langchain") {
            "langchain"
        } else {
            "clients"
        };
        let python = installed.join(venv).join("bin/python");
        assert!(
            python.exists(),
            "{} is missing: run scripts/test",
            python.display()
        );
        let output = checkout
            .command(python.to_str().unwrap())
            .arg("-c")
            .arg(checkout.local(&block.text))
            .env("KEY", checkout.key().expect("the key block wrote a key"))
            .output()
            .unwrap();
        let printed = stdout(&output);
        assert!(
            output.status.success(),
            "{}\n{printed}\n{}",
            block.text,
            String::from_utf8_lossy(&output.stderr)
        );
        let expected = if block.text.contains("call_tool") {
            "hi"
        } else {
            "demo-echo"
        };
        assert!(printed.contains(expected), "{}\n{printed}", block.text);
        ran[index] = true;
    }

    // The HTTP server a tenant adds, dialled through egress.
    let http = position("PORT=3001 npx --yes @modelcontextprotocol/server-everything");
    let _remote = Background(checkout.background(&blocks[http].text));
    ran[http] = true;
    wait_for("the HTTP MCP server", || {
        std::net::TcpStream::connect(("127.0.0.1", 3001)).is_ok()
    });
    let put = position("curl -s --unix-socket var/run/control.sock -X PUT");
    let written = stdout(&checkout.shell(&blocks[put].text));
    assert!(written.contains("\"remote\""), "{written}");
    ran[put] = true;
    let remote_session = position(
        "curl -s --unix-socket var/run/control.sock http://toolgate/v1/sessions \\\n  -H 'Content-Type: application/json' \\\n  -d '{\"session_id\": \"7c1f4a52",
    );
    let listed = stdout(&checkout.shell(&blocks[remote_session].text));
    assert!(listed.contains("mcp.remote.get_sum"), "{listed}");
    ran[remote_session] = true;

    // Configuration fragments: each checks beside the example's.
    let check = |fragment: &str| {
        let file = checkout.dir().join("config/fragment.toml");
        let base = std::fs::read_to_string(checkout.dir().join("config/toolgate.toml")).unwrap();
        std::fs::write(&file, format!("{base}\n{fragment}")).unwrap();
        checkout.shell("cargo run -- check-config config/fragment.toml")
    };
    let http_servers = position("[[mcp.http_servers]]");
    check(&blocks[http_servers].text);
    ran[http_servers] = true;

    // An invalid file's report, as README shows it.
    let report = position("toolgate.toml: control.token_ref");
    let invalid = checkout.dir().join("config/invalid.toml");
    let example = std::fs::read_to_string(checkout.dir().join("config/toolgate.toml")).unwrap();
    std::fs::write(
        &invalid,
        example
            .replace(
                "[control]\n",
                "[control]\ntcp = \"127.0.0.1:7000\"\n",
            )
            .replace(
                "\"stdio\"]\n",
                "\"stdio\"]\nauth = { scheme = \"env\", name = \"PATH\", credential_ref = \"env:X\" }\n",
            ),
    )
    .unwrap();
    let output = checkout
        .command("cargo")
        .args(["run", "--", "check-config"])
        .arg(&invalid)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let said: String = String::from_utf8_lossy(&output.stderr)
        .lines()
        .map(|line| {
            line.strip_prefix(&format!("{}: ", invalid.display()))
                .map_or_else(|| line.to_owned(), |rest| format!("toolgate.toml: {rest}"))
                + "\n"
        })
        .collect();
    assert_eq!(
        said, blocks[report].text,
        "check-config reports what README.md shows"
    );
    ran[report] = true;

    // The operator's commands, each line on its own, placeholders filled
    // from the record: each prints JSON, or one line of refusal and fails.
    let operator = position("cargo run -- invocations list");
    let rows = checkout.shell("cargo run -- invocations list --tenant demo");
    let rows: serde_json::Value = serde_json::from_slice(&rows.stdout).unwrap();
    let invocation = rows["invocations"][0]["invocation_id"]
        .as_str()
        .expect("the quickstart recorded calls")
        .to_owned();
    for line in blocks[operator].text.lines() {
        let line = line
            .replace("<invocation_id>", &invocation)
            .replace("<approval_id>", &uuid::Uuid::new_v4().to_string());
        let output = checkout
            .command("bash")
            .args(["-c", &line])
            .output()
            .unwrap();
        if output.status.success() {
            let answer: Result<serde_json::Value, _> = serde_json::from_slice(&output.stdout);
            assert!(answer.is_ok(), "{line}: {}", stdout(&output));
        } else {
            let refusal = String::from_utf8_lossy(&output.stderr);
            assert_eq!(refusal.lines().count(), 1, "{line}: {refusal}");
            assert!(output.stdout.is_empty(), "{line}");
        }
    }
    ran[operator] = true;

    // The console's key and its table.
    let console_key = position("cargo run -- key    #");
    let made = stdout(&checkout.shell(&blocks[console_key].text));
    let sha256 = made
        .lines()
        .find_map(|line| line.strip_prefix("sha256: "))
        .expect("key prints a sha256")
        .to_owned();
    ran[console_key] = true;
    let console = position("[console]");
    check(
        &blocks[console]
            .text
            .replace("<the sha256 printed above>", &sha256)
            .replace(
                "127.0.0.1:8767",
                &format!("127.0.0.1:{}", crate::support::free_port()),
            ),
    );
    ran[console] = true;

    for (index, block) in blocks.iter().enumerate() {
        if ran[index] {
            continue;
        }
        let first = block.text.lines().next().unwrap_or_default();
        assert!(
            ELSEWHERE.iter().any(|(start, _)| first.starts_with(start)),
            "README.md's block starting {first:?} is run by no test"
        );
    }
}
