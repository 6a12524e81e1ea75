//! `deploy/`: the systemd unit verifies (and scores) with systemd-analyze
//! where it is installed; the Kubernetes manifests parse and keep their
//! invariants (paths agree with the ConfigMap, probes on the operations
//! port, non-root, no privilege); the container's and the ConfigMap's
//! configurations pass `check-config`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

fn toolgate() -> &'static str {
    env!("CARGO_BIN_EXE_toolgate")
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

#[test]
fn the_systemd_unit_verifies() {
    let Ok(version) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("systemd-analyze is not installed: the unit is not verified here");
        return;
    };
    assert!(version.status.success());
    let unit = std::fs::read_to_string(deploy().join("systemd/toolgate.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/bin/toolgate "));
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("toolgate.service");
    std::fs::write(&path, unit.replace("/usr/bin/toolgate", toolgate())).unwrap();
    let verify = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        verify.status.success() && verify.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );
    let security = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--no-pager"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&security.stdout);
    let exposure: f64 = text
        .lines()
        .find_map(|line| {
            line.split("toolgate.service: ")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no exposure level in:\n{text}"));
    assert!(exposure <= 2.0, "exposure {exposure}:\n{text}");
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
    let configmap = manifest("configmap.yaml");
    let daemonset = manifest("daemonset.yaml");
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

#[test]
fn the_container_image_runs_its_configuration_as_non_root() {
    let containerfile = std::fs::read_to_string(deploy().join("container/Containerfile")).unwrap();
    let config = std::fs::read_to_string(deploy().join("container/toolgate.toml")).unwrap();
    let policy =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("config/policy.toml"))
            .unwrap();
    checks(&config, &policy);
    let user = containerfile
        .lines()
        .find_map(|line| line.strip_prefix("USER "))
        .expect("a USER line");
    assert!(!user.starts_with('0') && user != "root", "{user}");
    let parsed: toml::Value = toml::from_str(&config).unwrap();
    let port = parsed["ops"]["listen"]
        .as_str()
        .unwrap()
        .rsplit_once(':')
        .unwrap()
        .1
        .to_owned();
    assert!(containerfile.contains(&format!("EXPOSE {port}")));
    assert!(
        containerfile.contains("COPY deploy/container/toolgate.toml /etc/toolgate/toolgate.toml")
    );
    let ignore =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(".dockerignore"))
            .unwrap();
    assert!(ignore.lines().any(|line| line == "target/"));
}

/// Where kubectl is installed, the kustomization renders.
#[test]
fn the_kustomization_renders_with_kubectl() {
    let Ok(output) = Command::new("kubectl")
        .args(["kustomize"])
        .arg(deploy().join("kubernetes"))
        .output()
    else {
        eprintln!("kubectl is not installed: the kustomization is not rendered here");
        return;
    };
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let rendered = String::from_utf8_lossy(&output.stdout);
    assert!(rendered.contains("kind: DaemonSet") && rendered.contains("kind: ConfigMap"));
    assert!(rendered.contains("app.kubernetes.io/part-of: toolgate"));
}
