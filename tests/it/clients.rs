//! The bridge clients, Python and TypeScript, against a real `toolgate
//! serve`: values rather than envelopes, a structured result, a large output
//! read in full through its artifact, a denial and an approval hold, in
//! both languages through one protocol; and their generated stubs, checked
//! by `mypy --strict` and `tsc --strict` against a hostile catalog and a
//! real turn's.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

use crate::serve::{Served, TENANT, http, json_of};

fn sandbox_bridge() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("sandbox-bridge")
}

fn installed(relative: &str) -> PathBuf {
    let path = PathBuf::from(
        std::env::var("TOOLGATE_MCP_SERVERS")
            .unwrap_or_else(|_| "/var/tmp/toolgate-mcp-servers".into()),
    )
    .join(relative);
    assert!(
        path.exists(),
        "{} is not installed: run the tests with scripts/test",
        path.display()
    );
    path
}

fn succeeded(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what}:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_typescript_client_tests_pass() {
    let output = Command::new("node")
        .args(["--test", "test_toolgate_bridge.mjs"])
        .current_dir(sandbox_bridge().join("typescript"))
        .output()
        .expect("node runs");
    succeeded(&output, "node --test");
}

/// The two scripts of the shared protocol test: the same calls, each
/// printing what it got as JSON.
const PYTHON: &str = r#"
import json
from toolgate_bridge import Denied, artifact, call, call_result

out = {"echo": call("demo.echo", text="hello from a script")}
weather = call("mcp.reads.weather", city="Lisbon")
out["city"], out["temperature"] = weather["city"], weather["temperature"]
large = call_result("mcp.reads.lines", count=12000)
parts = [part for part in large.content if part["type"] == "artifact"]
out["large_declared"], out["large_trust"] = parts[0]["bytes"], parts[0]["trust"]
out["large_read"] = len(artifact(parts[0]["artifact_id"]))
try:
    call("demo.keyed_write", line="no")
except Denied as denied:
    out["denied"] = denied.reason_code
out["approved"] = call("demo.external_write", line="approved once")
print(json.dumps(out))
"#;

const TYPESCRIPT: &str = r#"
import { Denied, artifact, call, callResult, close } from "CLIENT";

const out = { echo: await call("demo.echo", { text: "hello from a script" }) };
const weather = await call("mcp.reads.weather", { city: "Lisbon" });
out.city = weather.city;
out.temperature = weather.temperature;
const large = await callResult("mcp.reads.lines", { count: 12000 });
const parts = large.content.filter((part) => part.type === "artifact");
out.large_declared = parts[0].bytes;
out.large_trust = parts[0].trust;
out.large_read = (await artifact(parts[0].artifact_id)).length;
try {
  await call("demo.keyed_write", { line: "no" });
} catch (error) {
  if (!(error instanceof Denied)) throw error;
  out.denied = error.reasonCode;
}
out.approved = await call("demo.external_write", { line: "approved once" });
console.log(JSON.stringify(out));
close();
"#;

fn approve_when_pending(served: &Served) -> std::thread::JoinHandle<u16> {
    let control = served.socket.clone();
    std::thread::spawn(move || {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(60) {
            let (_, _, body) = http(
                &control,
                "GET",
                &format!("/v1/approvals?status=pending&tenant_id={TENANT}"),
                &[],
                None,
            );
            if let Some(approval) = json_of(&body)["approvals"]
                .as_array()
                .and_then(|approvals| approvals.first())
            {
                let id = approval["approval_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let decision = json!({"decision": "approve", "approver": "ops"}).to_string();
                let (status, _, _) = http(
                    &control,
                    "POST",
                    &format!("/v1/approvals/{id}?tenant_id={TENANT}"),
                    &[],
                    Some(decision.as_bytes()),
                );
                return status;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        0
    })
}

fn session(served: &Served) -> Uuid {
    let session_id = Uuid::new_v4();
    let (status, body) = served.post(
        "/v1/sessions",
        &json!({
            "session_id": session_id, "tenant_id": TENANT,
            "principal": {"id": "user-1", "scopes": ["demo.use", "mcp.reads.use"]},
            "agent": {"tools": ["demo.*", "mcp.reads.*"]},
        }),
    );
    assert_eq!(status, 200, "{body}");
    session_id
}

/// Runs `command` with the turn's socket and token.
fn in_turn(command: &mut Command, socket: &Path, token: &str) -> Output {
    command
        .env("PYTHONPATH", sandbox_bridge())
        .env("TOOLGATE_BRIDGE_SOCKET", socket)
        .env("TOOLGATE_BRIDGE_TOKEN", token)
        .output()
        .expect("the script runs")
}

/// A script blocked on an approval says so: each client, two seconds into
/// a call still unanswered, asks the turn and writes one line on standard
/// error naming the tool, the approval and the wait left. The approval is
/// decided only once the line is read, so the line is what the test waits
/// for, not a time.
#[test]
fn both_clients_say_on_standard_error_what_a_blocked_call_waits_for() {
    use std::io::BufRead as _;
    let served = Served::here().start();
    let session = session(&served);
    let folder = tempfile::tempdir().unwrap();
    let client = sandbox_bridge().join("typescript/toolgate_bridge.mjs");
    let script_file = folder.path().join("wait.mjs");
    std::fs::write(
        &script_file,
        format!(
            "import {{ call, close }} from \"file://{}\";\nconsole.log(JSON.stringify(await call(\"demo.external_write\", {{ line: \"waited\" }})));\nclose();\n",
            client.display()
        ),
    )
    .unwrap();
    let python = "import json\nfrom toolgate_bridge import call\nprint(json.dumps(call(\"demo.external_write\", line=\"waited\")))\n";
    for language in ["python", "typescript"] {
        let (_, socket, token) = served.turn(session, Uuid::new_v4(), "wait", None);
        let mut command = match language {
            "python" => {
                let mut command = Command::new("python3");
                command.arg("-c").arg(python);
                command
            }
            _ => {
                let mut command = Command::new("node");
                command.arg(&script_file);
                command
            }
        };
        let mut child = command
            .env("PYTHONPATH", sandbox_bridge())
            .env("TOOLGATE_BRIDGE_SOCKET", &socket)
            .env("TOOLGATE_BRIDGE_TOKEN", &token)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        stderr.read_line(&mut line).unwrap();
        let prefix = "toolgate: the call to demo.external_write waits for a human's approval (";
        let approval = line
            .strip_prefix(prefix)
            .and_then(|rest| rest.split_once(')'))
            .map(|(id, _)| id.to_owned())
            .unwrap_or_else(|| panic!("{language}: {line:?}"));
        assert!(
            line.contains("this script blocks for up to"),
            "{language}: {line}"
        );
        let seconds: u64 = line
            .split("up to ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|seconds| seconds.parse().ok())
            .unwrap_or_else(|| panic!("{language}: {line}"));
        assert!((1..=30).contains(&seconds), "{language}: {line}");
        let (_, body) = served.get(&format!("/v1/approvals?status=pending&tenant_id={TENANT}"));
        assert_eq!(
            json_of(&body)["approvals"][0]["approval_id"],
            approval,
            "{language}: the line names the pending approval: {}",
            json_of(&body)
        );
        let (status, _) = served.post(
            &format!("/v1/approvals/{approval}?tenant_id={TENANT}"),
            &json!({"decision": "approve", "approver": "ops"}),
        );
        assert_eq!(status, 200);
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "{language}: {output:?}");
        assert!(
            !output.stdout.is_empty(),
            "{language}: the call's value: {output:?}"
        );
    }
    assert_eq!(served.external_writes(), 2);
}

/// The shared protocol test: a Python and a TypeScript script make the same
/// calls through their turns and read the same values.
#[test]
fn both_clients_read_values_artifacts_denials_and_approvals() {
    let served = Served::here().start();
    let session = session(&served);
    let folder = tempfile::tempdir().unwrap();
    let client = sandbox_bridge().join("typescript/toolgate_bridge.mjs");
    let typescript = TYPESCRIPT.replace("CLIENT", &format!("file://{}", client.display()));
    let script_file = folder.path().join("script.mjs");
    std::fs::write(&script_file, &typescript).unwrap();
    let expected_large: usize = (0..12000).map(|line| format!("line {line}\n").len()).sum();
    for (language, script) in [("python", PYTHON), ("typescript", typescript.as_str())] {
        let run = Uuid::new_v4();
        let (_, socket, token) = served.turn(session, run, script, None);
        let approver = approve_when_pending(&served);
        let output = match language {
            "python" => in_turn(
                Command::new("python3").arg("-c").arg(script),
                &socket,
                &token,
            ),
            _ => in_turn(Command::new("node").arg(&script_file), &socket, &token),
        };
        succeeded(&output, language);
        assert_eq!(approver.join().unwrap(), 200, "{language}");
        let out: Value = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|_| panic!("{language}: {}", String::from_utf8_lossy(&output.stdout)));
        assert_eq!(out["echo"], "hello from a script", "{language}: {out}");
        assert_eq!(out["city"], "Lisbon", "{language}: {out}");
        assert_eq!(out["temperature"], 21.5, "{language}: {out}");
        assert_eq!(out["large_declared"], expected_large, "{language}: {out}");
        assert_eq!(out["large_read"], expected_large, "{language}: {out}");
        assert_eq!(
            out["large_trust"], "external_untrusted",
            "{language}: {out}"
        );
        assert_eq!(out["denied"], "policy.rule.denied", "{language}: {out}");
        assert!(out["approved"].is_string(), "{language}: {out}");
    }
    assert_eq!(served.external_writes(), 2);

    // Stubs generated from a real turn's tools type-check strictly.
    let (_, socket, token) = served.turn(session, Uuid::new_v4(), "stubs", None);
    let stubs = in_turn(
        Command::new("python3")
            .arg(sandbox_bridge().join("toolgate_bridge.py"))
            .arg("stubs"),
        &socket,
        &token,
    );
    succeeded(&stubs, "python stubs");
    let declarations = in_turn(
        Command::new("node").arg(&client).arg("declarations"),
        &socket,
        &token,
    );
    succeeded(&declarations, "typescript declarations");
    let python = String::from_utf8(stubs.stdout).unwrap();
    assert!(
        python.contains("def mcp_reads_weather(*, city: str) -> mcp_reads_weather_result:"),
        "{python}"
    );
    type_check_python(
        &python,
        "from tools_stub import mcp_reads_weather\n\ndef use() -> float:\n    return mcp_reads_weather(city=\"x\")[\"temperature\"]\n",
    );
    let typescript = String::from_utf8(declarations.stdout).unwrap();
    assert!(typescript.contains("export declare function mcp_reads_weather(input: { \"city\": string }): Promise<mcp_reads_weather_result>;"), "{typescript}");
    type_check_typescript(
        &typescript,
        "import { mcp_reads_weather } from \"./tools\";\nexport async function use(): Promise<number> {\n  return (await mcp_reads_weather({ city: \"x\" })).temperature;\n}\n",
    );

    // Another tenant's artifact id is not found on this turn.
    let authorization = format!("Bearer {token}");
    let (status, _, _) = http(
        &socket,
        "GET",
        &format!("/v1/artifacts/{}", Uuid::new_v4()),
        &[("Authorization", &authorization)],
        None,
    );
    assert_eq!(status, 404);
}

fn type_check_python(stubs: &str, usage: &str) {
    let folder = tempfile::tempdir().unwrap();
    std::fs::write(folder.path().join("tools_stub.py"), stubs).unwrap();
    std::fs::write(folder.path().join("usage.py"), usage).unwrap();
    let output = Command::new(installed("python/bin/mypy"))
        .args(["--strict", "--no-incremental", "tools_stub.py", "usage.py"])
        .env("MYPYPATH", sandbox_bridge())
        .current_dir(folder.path())
        .output()
        .expect("mypy runs");
    succeeded(&output, &format!("mypy --strict\n{stubs}"));
}

fn type_check_typescript(declarations: &str, usage: &str) {
    let folder = tempfile::tempdir().unwrap();
    std::fs::write(folder.path().join("tools.d.ts"), declarations).unwrap();
    std::fs::write(folder.path().join("usage.ts"), usage).unwrap();
    let output = Command::new(installed("typescript/node_modules/.bin/tsc"))
        .args([
            "--noEmit",
            "--strict",
            "--target",
            "es2022",
            "--module",
            "es2022",
            "--moduleResolution",
            "bundler",
            "usage.ts",
            "tools.d.ts",
        ])
        .current_dir(folder.path())
        .output()
        .expect("tsc runs");
    succeeded(&output, &format!("tsc --strict\n{declarations}"));
}

/// A catalog of hostile names, descriptions and schema keys.
fn hostile_catalog() -> Value {
    let hostile = "*/ \"\"\" ''' ${x} `; import os; os.system('echo INJECTED') /* \\";
    json!([
        {"name": "mcp.evil.c-d", "description": hostile,
         "input_schema": {"type": "object", "properties": {hostile: {"type": "string"}, "from": {"type": "integer"},
                          "class": {"enum": ["a'b", "c\"d", 3]}}, "required": ["from"]},
         "output_schema": {"type": "object", "properties": {hostile: {"type": ["string", "null"]},
                           "n": {"type": "array", "items": {"type": "number"}}}, "required": ["n"]}},
        {"name": "mcp.evil.c_d", "description": "second\nline */", "input_schema": {}},
        {"name": "str", "description": "", "input_schema": {"type": "object"},
         "output_schema": {"type": "object"}},
        {"name": "delete", "description": "", "input_schema": {"type": "object", "properties": {
            "deep": {"type": "object", "properties": {"deeper": {"type": "array"}}}}}},
    ])
}

/// The generators' output type-checks strictly whatever a server names.
#[test]
fn stubs_of_a_hostile_catalog_type_check_strictly() {
    let catalog = hostile_catalog().to_string();
    let python = Command::new("python3")
        .args([
            "-c",
            "import json, sys, toolgate_bridge; sys.stdout.write(toolgate_bridge.generate_stubs(json.loads(sys.argv[1])))",
            &catalog,
        ])
        .env("PYTHONPATH", sandbox_bridge())
        .output()
        .expect("python3 runs");
    succeeded(&python, "generate_stubs");
    let stubs = String::from_utf8(python.stdout).unwrap();
    type_check_python(
        &stubs,
        "from tools_stub import mcp_evil_c_d\n\ndef use() -> list[float]:\n    return mcp_evil_c_d(from_=1)[\"n\"]\n",
    );
    let node = Command::new("node")
        .args([
            "--input-type=module",
            "-e",
            &format!(
                "import {{ generateDeclarations }} from {}; process.stdout.write(generateDeclarations(JSON.parse(process.argv[1])));",
                serde_json::to_string(&format!(
                    "file://{}",
                    sandbox_bridge().join("typescript/toolgate_bridge.mjs").display()
                ))
                .unwrap()
            ),
            &catalog,
        ])
        .output()
        .expect("node runs");
    succeeded(&node, "generateDeclarations");
    let declarations = String::from_utf8(node.stdout).unwrap();
    type_check_typescript(
        &declarations,
        "import { mcp_evil_c_d } from \"./tools\";\nexport async function use(): Promise<number[]> {\n  return (await mcp_evil_c_d({ \"from\": 1 })).n;\n}\n",
    );
}

/// A turn opened with the run's deadline gives every call that deadline: a
/// slow tool ends at it, not at its own timeout.
#[test]
fn a_turns_calls_carry_the_run_deadline() {
    let served = Served::here().start();
    let session = session(&served);
    let script = "deadline";
    let deadline = chrono::Utc::now() + chrono::Duration::seconds(3);
    let (status, body) = served.post(
        "/v1/turns",
        &json!({"session_id": session, "run_id": Uuid::new_v4(), "step_number": 1,
                "script_sha256": crate::serve::sha256(script), "origin_trust": "user",
                "deadline_at": deadline.to_rfc3339()}),
    );
    assert_eq!(status, 200, "{body}");
    let socket = PathBuf::from(body["socket_path"].as_str().unwrap());
    let authorization = format!("Bearer {}", body["token"].as_str().unwrap());
    let started = Instant::now();
    let (status, _, answer) = http(
        &socket,
        "POST",
        "/v1/call",
        &[("Authorization", &authorization)],
        Some(br#"{"call": "mcp.reads.sleep", "arguments": {"seconds": 8}}"#),
    );
    assert_eq!(status, 200);
    let answer = json_of(&answer);
    assert_eq!(answer["reason_code"], "tool.timeout", "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    // Past the deadline the turn itself has ended.
    std::thread::sleep(
        deadline
            .signed_duration_since(chrono::Utc::now())
            .to_std()
            .unwrap_or_default(),
    );
    let (status, _, _) = http(
        &socket,
        "POST",
        "/v1/call",
        &[("Authorization", &authorization)],
        Some(br#"{"call": "demo.echo", "arguments": {"text": "late"}}"#),
    );
    assert_eq!(status, 410);
}
