//! `deploy/`: the systemd unit verifies with systemd-analyze and scores
//! what deploy/README.md says; the Kubernetes manifests parse and keep
//! their invariants (paths agree with the ConfigMap, probes on the
//! operations port, non-root, the init container's one capability); the
//! Containerfile's stages hold what they claim; the images' and the
//! ConfigMap's configurations pass `check-config`. `identity` runs each
//! artifact as it runs toolgate; `packages` builds, installs and removes
//! the Debian package and checks the release archive.

mod identity;
mod packages;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde_json::Value;

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_owned()
}

fn deploy() -> PathBuf {
    repository().join("deploy")
}

fn toolgate() -> &'static str {
    env!("CARGO_BIN_EXE_toolgate")
}

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|ci| ci == "true")
}

/// Whether `tool` is installed. Missing, a test skips, except under
/// `CI=true`: every tool these tests use is installable from Debian, and
/// `.ci/run` installs it.
fn required_tool(tool: &str) -> bool {
    let found = std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|folder| folder.join(tool).is_file())
    });
    if !found {
        assert!(!ci(), "{tool} is not installed: .ci/run installs it");
        eprintln!("{tool} is not installed: skipped here");
    }
    found
}

/// The users and groups the unit and the package name, made for real by
/// systemd-sysusers: one test at a time holds them, and whichever of them
/// did not exist before are removed when it ends.
struct SystemUsers {
    _held: MutexGuard<'static, ()>,
    users: Vec<&'static str>,
    groups: Vec<&'static str>,
}

static SYSTEM_USERS: Mutex<()> = Mutex::new(());

impl SystemUsers {
    fn take() -> SystemUsers {
        let held = SYSTEM_USERS.lock().unwrap_or_else(PoisonError::into_inner);
        let absent = |kind: &str, name: &str| {
            !Command::new("getent")
                .args([kind, name])
                .output()
                .is_ok_and(|output| output.status.success())
        };
        SystemUsers {
            _held: held,
            users: ["toolgate", "toolgate-mcp"]
                .into_iter()
                .filter(|user| absent("passwd", user))
                .collect(),
            groups: ["toolgate-control", "toolgate", "toolgate-mcp"]
                .into_iter()
                .filter(|group| absent("group", group))
                .collect(),
        }
    }
}

impl Drop for SystemUsers {
    fn drop(&mut self) {
        for user in &self.users {
            // A failed test may leave a process of a user it made (a
            // server's child); userdel refuses a user with one.
            if let Ok(Some(account)) = nix::unistd::User::from_name(user) {
                let uid = account.uid.as_raw();
                for pid in identity::processes_of(uid, Path::new("/")) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX)),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                for _ in 0..40 {
                    if identity::processes_of(uid, Path::new("/")).is_empty() {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
            }
            let _ = Command::new("userdel").arg(user).output();
        }
        // userdel takes a user's own group with it; what is left goes here.
        for group in &self.groups {
            let _ = Command::new("groupdel").arg(group).output();
        }
    }
}

/// `config` with `policy` beside it passes `toolgate check-config`.
fn checks(config: &str, policy: &str) {
    let folder = tempfile::tempdir().unwrap();
    std::fs::write(folder.path().join("toolgate.toml"), config).unwrap();
    std::fs::write(folder.path().join("policy.toml"), policy).unwrap();
    let output = Command::new(toolgate())
        .arg("check-config")
        .arg(folder.path().join("toolgate.toml"))
        .env_remove("TOOLGATE_STORE_URL")
        .env_remove("TOOLGATE_CONTROL_SOCKET")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}\n{config}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `systemd-analyze security`'s overall exposure of the unit at `path`
/// (with the drop-ins in `<path>.d/`).
fn exposure(path: &Path) -> f64 {
    let security = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--no-pager"])
        .arg(path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&security.stdout);
    text.lines()
        .find_map(|line| {
            line.split("toolgate.service: ")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no exposure level in:\n{text}"))
}

/// The unit and its drop-in verify, and score what deploy/README.md says
/// they score with the systemd it names (with another systemd, no worse
/// than its figures).
#[test]
fn the_systemd_unit_verifies_and_scores_as_documented() {
    if !required_tool("systemd-analyze") {
        return;
    }
    let version = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&version.stdout)
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_owned();
    let unit = std::fs::read_to_string(deploy().join("systemd/toolgate.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/bin/toolgate "));
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("toolgate.service");
    std::fs::write(&path, unit.replace("/usr/bin/toolgate", toolgate())).unwrap();
    // Its Documentation= names the manual page, which only an install puts
    // where man finds it (the package test verifies the installed unit);
    // the missing page alone makes verify exit non-zero.
    let installed_manual = Command::new("man")
        .args(["-w", "toolgate"])
        .output()
        .is_ok_and(|output| output.status.success());
    let verifies = |path: &Path| {
        let verify = Command::new("systemd-analyze")
            .arg("verify")
            .arg(path)
            .output()
            .unwrap();
        let complaints: Vec<String> = String::from_utf8_lossy(&verify.stderr)
            .lines()
            .filter(|line| installed_manual || !line.contains("Command 'man toolgate(1)' failed"))
            .map(str::to_owned)
            .collect();
        assert!(
            (verify.status.success() || !installed_manual) && complaints.is_empty(),
            "{complaints:?}"
        );
    };
    verifies(&path);
    let base = exposure(&path);
    let drop_ins = folder.path().join("toolgate.service.d");
    std::fs::create_dir(&drop_ins).unwrap();
    std::fs::copy(
        deploy().join("systemd/run-as.conf"),
        drop_ins.join("run-as.conf"),
    )
    .unwrap();
    verifies(&path);
    let with_drop_in = exposure(&path);
    assert!(with_drop_in > base, "the drop-in's capabilities count");

    let readme = std::fs::read_to_string(deploy().join("README.md")).unwrap();
    let sentence = readme
        .split("`systemd-analyze security toolgate.service` rates the unit ")
        .nth(1)
        .expect("deploy/README.md gives the unit's score");
    let words: Vec<&str> = sentence.split_whitespace().collect();
    let number = |word: &str| -> f64 {
        word.trim_matches(|c: char| !c.is_ascii_digit() && c != '.')
            .parse()
            .unwrap_or_else(|_| panic!("{word}: {sentence}"))
    };
    // "rates the unit 1.5 (\"OK\") with systemd 252, and 2.1 with `run-as.conf`"
    let documented = (number(words[0]), number(words[4]), number(words[6]));
    if words[4].trim_end_matches(',') == version {
        assert_eq!(
            (base, with_drop_in),
            (documented.0, documented.2),
            "systemd {version} scores the unit {base} and with run-as.conf {with_drop_in}"
        );
    } else {
        assert!(
            base <= documented.0 && with_drop_in <= documented.2,
            "systemd {version} scores the unit {base} and with run-as.conf {with_drop_in}"
        );
    }
}

/// The manifests, parsed by a YAML parser (PyYAML, installed by
/// scripts/test), as JSON.
fn manifest(name: &str) -> Value {
    let python = PathBuf::from(
        std::env::var("TOOLGATE_MCP_SERVERS")
            .unwrap_or_else(|_| "/var/tmp/toolgate-mcp-servers".into()),
    )
    .join("python/bin/python");
    assert!(python.exists(), "run the tests with scripts/test (PyYAML)");
    let output = Command::new(python)
        .args([
            "-c",
            "import json, sys, yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)",
        ])
        .arg(deploy().join("kubernetes").join(name))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn the_kubernetes_manifests_keep_their_invariants() {
    let kustomization = manifest("kustomization.yaml");
    for resource in kustomization["resources"].as_array().unwrap() {
        assert!(
            deploy()
                .join("kubernetes")
                .join(resource.as_str().unwrap())
                .exists(),
            "{resource}"
        );
    }
    let base = manifest("base/kustomization.yaml");
    for resource in base["resources"].as_array().unwrap() {
        assert!(
            deploy()
                .join("kubernetes/base")
                .join(resource.as_str().unwrap())
                .exists(),
            "{resource}"
        );
    }
    let configmap = manifest("base/configmap.yaml");
    let daemonset = manifest("base/daemonset.yaml");
    let secret = manifest("secret.example.yaml");
    assert_eq!(daemonset["kind"], "DaemonSet");
    let config_text = configmap["data"]["toolgate.toml"].as_str().unwrap();
    let policy_text = configmap["data"]["policy.toml"].as_str().unwrap();
    checks(config_text, policy_text);
    let config: toml::Value = toml::from_str(config_text).unwrap();
    let pod = &daemonset["spec"]["template"]["spec"];
    let container = &pod["containers"][0];

    // Non-root, nothing to escalate to.
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_ne!(pod["securityContext"]["runAsUser"], 0);
    assert_eq!(
        container["securityContext"]["allowPrivilegeEscalation"],
        false
    );
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(
        container["securityContext"]["capabilities"]["drop"][0],
        "ALL"
    );
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert!(container["resources"]["requests"]["memory"].is_string());
    // The pod is in the control socket's group, which toolgate gives it.
    let control_group: u64 = config["control"]["socket_group"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        pod["securityContext"]["supplementalGroups"]
            .as_array()
            .unwrap()
            .contains(&Value::from(control_group))
    );
    // fsGroup does nothing for hostPath volumes: the init container hands
    // them to toolgate's user, as root with CHOWN alone.
    assert!(pod["securityContext"]["fsGroup"].is_null());
    let init = &pod["initContainers"][0];
    assert_eq!(init["securityContext"]["runAsUser"], 0);
    assert_eq!(init["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(
        init["securityContext"]["capabilities"],
        serde_json::json!({"drop": ["ALL"], "add": ["CHOWN"]})
    );
    let owner = format!(
        "{}:{}",
        pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]
    );
    assert!(
        init["command"]
            .as_array()
            .unwrap()
            .contains(&Value::from(owner))
    );
    // The stdio-servers overlay changes the image and the capabilities
    // alone, and its capabilities are those the stdio image's binary
    // carries.
    let overlay = manifest("stdio-servers/kustomization.yaml");
    assert_eq!(overlay["resources"], serde_json::json!(["../base"]));
    let patch = manifest("stdio-servers/daemonset.yaml");
    let patched = &patch["spec"]["template"]["spec"]["containers"][0];
    let added: Vec<String> = patched["securityContext"]["capabilities"]["add"]
        .as_array()
        .unwrap()
        .iter()
        .map(|name| format!("cap_{}", name.as_str().unwrap().to_lowercase()))
        .collect();
    let containerfile = std::fs::read_to_string(deploy().join("container/Containerfile")).unwrap();
    assert!(
        containerfile.contains(&format!("setcap {}+ep /usr/bin/toolgate", added.join(","))),
        "{added:?}"
    );

    // Probes on the operations listener's port.
    let ops_port = config["ops"]["listen"]
        .as_str()
        .unwrap()
        .rsplit_once(':')
        .unwrap()
        .1
        .parse::<u64>()
        .unwrap();
    let ports = container["ports"].as_array().unwrap();
    let named = |name: &str| {
        ports
            .iter()
            .find(|port| port["name"] == name)
            .and_then(|port| port["containerPort"].as_u64())
    };
    for probe in ["livenessProbe", "readinessProbe"] {
        let port = &container[probe]["httpGet"]["port"];
        let number = port
            .as_u64()
            .or_else(|| named(port.as_str().unwrap_or_default()));
        assert_eq!(number, Some(ops_port), "{probe}");
    }
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");

    // Every path the configuration names is under a mounted volume.
    let mounts: Vec<(String, String)> = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|mount| {
            (
                mount["name"].as_str().unwrap().to_owned(),
                mount["mountPath"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let mounted = |path: &str| {
        mounts
            .iter()
            .any(|(_, mount)| Path::new(path).starts_with(mount))
    };
    for path in [
        config["control"]["socket"].as_str(),
        config["bridge"]["directory"].as_str(),
        config["artifacts"]["directory"].as_str(),
        config["node"]["directory"].as_str(),
        config["mcp"]["state_directory"].as_str(),
        config["store"]["url"]
            .as_str()
            .and_then(|url| url.strip_prefix("sqlite://")),
    ] {
        let path = path.expect("the key is set");
        assert!(mounted(path), "{path} is on no volume: {mounts:?}");
    }
    let config_mount = &mounts.iter().find(|(name, _)| name == "config").unwrap().1;
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        args.contains(&format!("{config_mount}/toolgate.toml").as_str()),
        "{args:?}"
    );

    // The socket folder is the node's, shared with the sandboxes.
    let sockets = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|volume| volume["name"] == "sockets")
        .unwrap();
    assert!(sockets["hostPath"]["path"].is_string());

    // The drain finishes before the kill.
    let drain = config["runtime"]["drain_timeout_seconds"]
        .as_integer()
        .unwrap();
    assert!(pod["terminationGracePeriodSeconds"].as_i64().unwrap() > drain);

    // The store URL is the Secret's, never the ConfigMap's.
    let store = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|variable| variable["name"] == "TOOLGATE_STORE_URL")
        .unwrap();
    assert_eq!(
        store["valueFrom"]["secretKeyRef"]["name"],
        secret["metadata"]["name"]
    );
    assert!(!config_text.contains("postgres://"));
}

/// A stage of the Containerfile: its instructions, continued lines joined.
fn stage(containerfile: &str, name: &str) -> Vec<String> {
    let joined = containerfile.replace("\\\n", " ");
    let mut lines = Vec::new();
    let mut inside = false;
    for line in joined.lines() {
        if line.starts_with("FROM ") {
            inside = line.ends_with(&format!(" AS {name}"));
            continue;
        }
        if inside && !line.trim().is_empty() && !line.starts_with('#') {
            lines.push(line.to_owned());
        }
    }
    assert!(!lines.is_empty(), "no stage {name}");
    lines
}

/// A stage's first instruction of a kind, after its keyword.
fn instruction<'a>(lines: &'a [String], keyword: &str) -> &'a str {
    lines
        .iter()
        .find_map(|line| line.strip_prefix(&format!("{keyword} ")))
        .unwrap_or_else(|| panic!("no {keyword}"))
}

/// The Containerfile holds what it claims, as far as a file is checked
/// without an engine (none runs here): pinned bases; the revision as a
/// required build argument, handed to the build script that reads it;
/// nothing a COPY takes dropped by .dockerignore; both images non-root,
/// with tini, the operations port and a configuration that passes
/// `check-config`; the default image the last stage; the stdio image with
/// Node.js and Python and the user its configuration runs servers as.
#[test]
fn the_containerfile_holds_what_it_claims() {
    let containerfile = std::fs::read_to_string(deploy().join("container/Containerfile")).unwrap();
    let policy = std::fs::read_to_string(repository().join("config/policy.toml")).unwrap();
    let stages: Vec<&str> = containerfile
        .lines()
        .filter_map(|line| line.strip_prefix("FROM "))
        .collect();
    assert_eq!(stages.len(), 3, "{stages:?}");
    for from in &stages {
        let image = from.split_whitespace().next().unwrap();
        assert!(
            image.starts_with("docker.io/library/") && image.contains(':'),
            "{from}"
        );
    }
    assert!(
        stages[2].ends_with(" AS toolgate"),
        "the default image is the last stage"
    );

    // The revision: a build argument the build refuses to go without, in
    // the environment of the build, where build.rs reads it first.
    let build = stage(&containerfile, "build");
    assert!(build.contains(&"ARG TOOLGATE_REVISION".to_owned()));
    let run = instruction(&build, "RUN");
    assert!(run.starts_with("test -n \"$TOOLGATE_REVISION\""), "{run}");
    assert!(
        run.contains("TOOLGATE_REVISION=\"$TOOLGATE_REVISION\" cargo build --release --locked"),
        "{run}"
    );
    let build_script = std::fs::read_to_string(repository().join("build.rs")).unwrap();
    assert!(build_script.contains("std::env::var(\"TOOLGATE_REVISION\")"));

    // .dockerignore drops .git (hence the argument) and nothing a COPY
    // takes from the context.
    let ignored: Vec<String> = std::fs::read_to_string(repository().join(".dockerignore"))
        .unwrap()
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| line.trim_start_matches("**/").to_owned())
        .collect();
    assert!(ignored.iter().any(|line| line == ".git/"));
    assert!(ignored.iter().any(|line| line == "target/"));
    for line in containerfile.lines() {
        let Some(copy) = line.strip_prefix("COPY ") else {
            continue;
        };
        if copy.starts_with("--from") {
            continue;
        }
        let source = copy.split_whitespace().next().unwrap();
        if source != "." {
            assert!(repository().join(source).is_file(), "{source}");
            assert!(
                !ignored
                    .iter()
                    .any(|pattern| source.starts_with(pattern.as_str())),
                "{source} is ignored"
            );
        }
    }

    for (name, config_name) in [
        ("toolgate", "toolgate.toml"),
        ("stdio", "toolgate-stdio.toml"),
    ] {
        let lines = stage(&containerfile, name);
        let user = instruction(&lines, "USER");
        let (uid, gid) = user.split_once(':').expect("USER uid:gid");
        assert!(
            uid.parse::<u32>().unwrap() > 0 && gid.parse::<u32>().unwrap() > 0,
            "{user}"
        );
        let config = std::fs::read_to_string(deploy().join("container").join(config_name)).unwrap();
        checks(&config, &policy);
        assert!(lines.contains(&format!(
            "COPY deploy/container/{config_name} /etc/toolgate/toolgate.toml"
        )));
        assert!(lines.contains(&"COPY config/policy.toml /etc/toolgate/policy.toml".to_owned()));
        let parsed: toml::Value = toml::from_str(&config).unwrap();
        let port = parsed["ops"]["listen"]
            .as_str()
            .unwrap()
            .rsplit_once(':')
            .unwrap()
            .1;
        assert_eq!(instruction(&lines, "EXPOSE"), port);
        let run = instruction(&lines, "RUN");
        assert!(run.contains(" tini"), "{run}");
        assert!(
            instruction(&lines, "ENTRYPOINT")
                .starts_with("[\"/usr/bin/tini\", \"--\", \"/usr/bin/toolgate\"")
        );
        if name == "stdio" {
            assert!(run.contains(" python3 python3-venv"), "{run}");
            let run_as = parsed["mcp"]["run_as"].as_str().unwrap();
            let (server_uid, server_gid) = run_as.split_once(':').unwrap();
            assert!(
                run.contains(&format!(
                    "groupadd --system --gid {server_gid} toolgate-mcp"
                )),
                "{run}"
            );
            assert!(
                run.contains(&format!(
                    "useradd --system --uid {server_uid} --gid toolgate-mcp "
                )),
                "{run}"
            );
        } else {
            assert!(
                parsed["mcp"].get("run_as").is_none(),
                "the default image cannot change users"
            );
        }
    }
    // Node.js comes with the stdio image's base.
    assert!(
        stages[1].starts_with("docker.io/library/node:"),
        "{}",
        stages[1]
    );
}

/// Where kubectl is installed (it is not a Debian package), both
/// kustomizations render: the base, and the stdio-servers overlay with the
/// stdio image and its capabilities over the base's.
#[test]
fn the_kustomizations_render_with_kubectl() {
    let render = |folder: &str| {
        let output = Command::new("kubectl")
            .args(["kustomize"])
            .arg(deploy().join(folder))
            .output()
            .ok()?;
        assert!(
            output.status.success(),
            "{folder}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Some(String::from_utf8_lossy(&output.stdout).into_owned())
    };
    let Some(base) = render("kubernetes") else {
        eprintln!("kubectl is not installed: the kustomizations are not rendered here");
        return;
    };
    for rendered in [&base, &render("kubernetes/stdio-servers").unwrap()] {
        assert!(rendered.contains("kind: DaemonSet") && rendered.contains("kind: ConfigMap"));
        assert!(rendered.contains("app.kubernetes.io/part-of: toolgate"));
        assert!(rendered.contains("name: folders"), "the init container");
    }
    let overlay = render("kubernetes/stdio-servers").unwrap();
    assert!(
        !base.contains("toolgate-stdio") && overlay.contains("image: localhost/toolgate-stdio:")
    );
    assert!(overlay.contains("allowPrivilegeEscalation: true") && overlay.contains("- SETUID"));
    assert!(!base.contains("allowPrivilegeEscalation: true"));
}
