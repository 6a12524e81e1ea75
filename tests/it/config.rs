//! `toolgate check-config`, run as a real process on real files.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `toolgate check-config FILE` and returns (success, stdout, stderr).
fn check_config(file: &Path) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .arg("check-config")
        .arg(file)
        .env_remove("TOOLGATE_STORE_URL")
        .env_remove("TOOLGATE_CONTROL_SOCKET")
        .output()
        .expect("toolgate runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

const BASE: &str = r#"
[control]
socket = "control.sock"

[store]
url = "sqlite://toolgate.db"

[artifacts]
directory = "artifacts"
"#;

const SERVER: &str = r#"
[[mcp.servers]]
server_id = "acme"
command = "acme-mcp"
"#;

fn write(dir: &tempfile::TempDir, text: &str) -> PathBuf {
    let path = dir.path().join("toolgate.toml");
    std::fs::write(&path, text).expect("writes");
    path
}

#[test]
fn the_example_configuration_is_valid() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/toolgate.toml");
    let (ok, stdout, stderr) = check_config(&example);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("ok"), "{stdout}");
}

#[test]
fn a_minimal_configuration_is_valid() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, _, stderr) = check_config(&write(&dir, &format!("{BASE}{SERVER}")));
    assert!(ok, "{stderr}");
}

/// Each invalid file fails, and names the field path.
#[test]
fn invalid_configurations_name_the_field_path() {
    let cases: Vec<(String, &str)> = vec![
        (format!("{BASE}\n[limits]\nbogus = 1\n"), "limits"),
        (
            format!("{BASE}{SERVER}timeout_seconds = \"soon\"\n"),
            "mcp.servers[0].timeout_seconds",
        ),
        (
            format!("{BASE}{SERVER}side_effect = \"EXTERNAL_WRITE\"\n"),
            "mcp.servers[0].side_effect",
        ),
        (
            format!("{BASE}{SERVER}[mcp.servers.auth]\nscheme = \"basic\"\n"),
            "mcp.servers[0].auth.scheme",
        ),
        (
            format!(
                "{BASE}{SERVER}[mcp.servers.auth]\nscheme = \"header\"\nname = \"X-Key\"\ncredential_ref = \"env:K\"\n"
            ),
            "mcp.servers[0].auth.scheme",
        ),
        (
            format!(
                "{BASE}{SERVER}[mcp.servers.auth]\nscheme = \"env\"\nname = \"LD_PRELOAD\"\ncredential_ref = \"env:K\"\n"
            ),
            "mcp.servers[0].auth.name",
        ),
        (
            format!("{BASE}{SERVER}env = {{ NODE_OPTIONS = \"--require=/tmp/x.js\" }}\n"),
            "mcp.servers[0].env.NODE_OPTIONS",
        ),
        (
            format!("{BASE}{SERVER}required_scopes = [\"session.write\"]\n"),
            "mcp.servers[0].required_scopes[0]",
        ),
        (
            format!("{BASE}{SERVER}{SERVER}"),
            "mcp.servers[1].server_id",
        ),
        (
            format!("{BASE}{}", SERVER.replace("acme\"", "Acme\"")),
            "mcp.servers[0].server_id",
        ),
        (
            format!("{BASE}\n[limits]\ninline_maximum_bytes = 512\n"),
            "limits.inline_maximum_bytes",
        ),
        (
            format!("{BASE}\n[egress]\nallow = [\"https://user@host.example\"]\n"),
            "egress.allow[0]",
        ),
        (
            BASE.replace("sqlite://toolgate.db", "mysql://db"),
            "store.url",
        ),
        (
            BASE.replace("[store]\nurl = \"sqlite://toolgate.db\"\n", ""),
            "store",
        ),
        (
            format!("{BASE}\n[policy]\nfile = \"missing-policy.toml\"\n"),
            "policy.file",
        ),
    ];
    for (text, path) in cases {
        let dir = tempfile::tempdir().unwrap();
        let (ok, _, stderr) = check_config(&write(&dir, &text));
        assert!(!ok, "accepted a file that should fail at {path}:\n{text}");
        assert!(
            stderr.contains(path),
            "expected {path} in:\n{stderr}\nfor:\n{text}"
        );
    }
}

#[test]
fn every_problem_is_reported_at_once() {
    let text = format!(
        "{}{SERVER}[mcp.servers.auth]\nscheme = \"env\"\n",
        BASE.replace(
            "socket = \"control.sock\"",
            "socket = \"control.sock\"\ntcp = \"0.0.0.0:7420\""
        )
    );
    let dir = tempfile::tempdir().unwrap();
    let (ok, _, stderr) = check_config(&write(&dir, &text));
    assert!(!ok);
    for path in [
        "control.tcp",
        "control.token_ref",
        "mcp.servers[0].auth.credential_ref",
        "mcp.servers[0].auth.name",
    ] {
        assert!(stderr.contains(path), "expected {path} in:\n{stderr}");
    }
}

#[test]
fn errors_never_echo_values() {
    let text = format!(
        "{BASE}{SERVER}[mcp.servers.auth]\nscheme = \"env\"\nname = \"API_TOKEN\"\ncredential_ref = \"sk-live-0123456789abcdef\"\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let (ok, stdout, stderr) = check_config(&write(&dir, &text));
    assert!(!ok);
    assert!(
        stderr.contains("mcp.servers[0].auth.credential_ref"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("sk-live") && !stdout.contains("sk-live"),
        "{stderr}"
    );
}

#[test]
fn an_unreadable_file_is_an_error_not_a_panic() {
    let (ok, _, stderr) = check_config(Path::new("/nonexistent/toolgate.toml"));
    assert!(!ok);
    assert!(stderr.contains("cannot read"), "{stderr}");
    assert!(!stderr.contains("panicked"));
}

#[test]
fn an_invalid_policy_file_is_reported_at_its_field() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("policy.toml"),
        "[[rules]]\ntools = [\"x.*\"]\ndecision = \"perhaps\"\n",
    )
    .unwrap();
    let (ok, _, stderr) = check_config(&write(
        &dir,
        &format!("{BASE}\n[policy]\nfile = \"policy.toml\"\n"),
    ));
    assert!(!ok);
    assert!(
        stderr.contains("policy.file") && stderr.contains("rules[0].decision"),
        "{stderr}"
    );
}

/// A discovery that takes long says so as it goes, on standard error: what
/// it starts, then that it is still waiting. The server here starts only
/// once the test has read the second line, so the wait is the test's doing.
#[test]
fn a_long_discovery_says_what_it_is_doing() {
    use std::io::BufRead as _;
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    let text = format!(
        "{BASE}\n[mcp]\nstate_directory = \"mcp-state\"\n\n\
         [[mcp.servers]]\nserver_id = \"slow\"\ncommand = \"/bin/sh\"\n\
         args = [\"-c\", \"while [ ! -e {gate} ]; do /bin/sleep 0.05; done; exec {server}\"]\n\
         side_effect = \"external_read\"\nrisk = \"low\"\nidempotency = \"read_only\"\n",
        gate = gate.display(),
        server = crate::mcp::scripted_server().display(),
    );
    let file = write(&dir, &text);
    let mut child = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["discover", "--config"])
        .arg(&file)
        .env_remove("TOOLGATE_STORE_URL")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("toolgate runs");
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut said = Vec::new();
    while !said
        .iter()
        .any(|line: &String| line.contains("still waiting for the servers' catalogs"))
    {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "discover ended without saying it waits: {said:?}"
        );
        said.push(line);
    }
    assert!(
        said[0].starts_with("toolgate: starting 1 stdio server(s) and dialling 0 HTTP server(s)"),
        "{said:?}"
    );
    std::fs::write(&gate, "").unwrap();
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout} {output:?}");
    assert!(stdout.contains("registered mcp.slow.echo"), "{stdout}");
    // The report itself stays on standard output alone.
    assert!(!stdout.contains("still waiting"), "{stdout}");
}

/// `toolgate discover` on a file naming the scripted server: the operator's
/// settings reach the child (the catalog it is told to serve, its state
/// folder under `mcp.state_directory`), rejections are reported with their
/// stable reasons, and a server that cannot connect fails the command.
#[test]
fn discover_reports_each_servers_catalog_from_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let server = crate::mcp::scripted_server();
    let text = format!(
        "{BASE}\n[mcp]\nstate_directory = \"mcp-state\"\n\n\
         [[mcp.servers]]\nserver_id = \"hostile\"\ncommand = \"{}\"\n\
         env = {{ SCRIPTED_CATALOG = \"hostile\" }}\n\
         side_effect = \"external_read\"\nrisk = \"low\"\nidempotency = \"read_only\"\n",
        server.display()
    );
    let file = write(&dir, &text);
    let output = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["discover", "--config"])
        .arg(&file)
        .env_remove("TOOLGATE_STORE_URL")
        .output()
        .expect("toolgate runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout} {output:?}");
    assert!(stdout.contains("mcp.server.connected"), "{stdout}");
    assert!(stdout.contains("registered mcp.hostile.ok"), "{stdout}");
    assert!(
        stdout.contains("\"reason\":\"input_schema.too_deep\""),
        "{stdout}"
    );
    assert!(stdout.contains("mcp.catalog.conflict"), "{stdout}");
    assert!(!stdout.contains("IGNORE ALL PREVIOUS"), "{stdout}");
    assert!(dir.path().join("mcp-state/hostile/tmp").is_dir());
    // Nothing is recorded: the configured store is not even created, and
    // nothing complains of a missing table.
    assert!(!dir.path().join("toolgate.db").exists());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("no such table"), "{stderr}");

    let failing = text.replace("\"hostile\" }", "\"requires_roots\" }");
    let file = write(&dir, &failing);
    let output = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["discover", "--config"])
        .arg(&file)
        .env_remove("TOOLGATE_STORE_URL")
        .output()
        .expect("toolgate runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "{stdout}");
    assert!(stdout.contains("tool.capability_unsupported"), "{stdout}");
}

/// Every key of the configuration is in `docs/configuration.md`, and its
/// example of every key is a valid configuration.
#[test]
fn the_configuration_reference_covers_every_key() {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md"),
    )
    .unwrap();
    let example = doc
        .split("## Every key, in one example")
        .nth(1)
        .and_then(|rest| rest.split("```toml").nth(1))
        .and_then(|rest| rest.split("```").next())
        .expect("the example block");
    let config: toolgate::config::Config =
        toml::from_str(example).unwrap_or_else(|error| panic!("the example: {error}"));
    // As JSON every field is present (an unset option as null), so a key
    // added to the configuration and not to the document fails here.
    let value = serde_json::to_value(&config).unwrap();
    fn paths(value: &serde_json::Value, prefix: &str, out: &mut Vec<String>) {
        let Some(object) = value.as_object() else {
            return;
        };
        for (key, field) in object {
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            match field {
                // Tables of names (env, per-tenant holds) are values.
                serde_json::Value::Object(_)
                    if key != "env" && key != "tenant_approval_hold_seconds" =>
                {
                    paths(field, &path, out)
                }
                serde_json::Value::Array(items)
                    if items.first().is_some_and(|item| item.is_object()) =>
                {
                    paths(&items[0], &format!("{path}[]"), out)
                }
                _ => out.push(path),
            }
        }
    }
    let mut keys = Vec::new();
    paths(&value, "", &mut keys);
    assert!(keys.len() > 60, "{keys:?}");
    let documented = |path: &str| {
        let last = path.rsplit('.').next().unwrap_or(path);
        doc.contains(&format!("`{path}`"))
            || (path.contains(".auth.") && doc.contains(&format!("`…auth.{last}`")))
            || (path.starts_with("mcp.http_servers[].") && doc.contains(&format!("`{last}`")))
    };
    let missing: Vec<&String> = keys.iter().filter(|path| !documented(path)).collect();
    assert!(
        missing.is_empty(),
        "not in docs/configuration.md: {missing:?}"
    );
}
