//! Something to install: the Debian package `scripts/package-deb` builds,
//! installed on this machine with dpkg, its unit verified where it lands,
//! and purged leaving nothing behind; the release archive `scripts/release`
//! builds, its contents and checksums. Both are built from the debug binary
//! `cargo test` made (`--binary`), which spares them a release build.

use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::{SystemUsers, ci, deploy, repository, required_tool, toolgate};

fn succeeded(what: &str, output: &Output) -> String {
    assert!(
        output.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn run(program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> String {
    let program = program.as_ref();
    let output = Command::new(program).args(args).output().unwrap();
    succeeded(&format!("{} {args:?}", program.to_string_lossy()), &output)
}

/// `toolgate --version` of `binary`: its version and revision, the
/// revision a commit's (hexadecimal), never `unknown`.
fn revision_of(binary: &Path) -> String {
    let version = run(binary, &["--version"]);
    let revision = version
        .trim()
        .strip_prefix(concat!("toolgate ", env!("CARGO_PKG_VERSION"), " ("))
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{version}"))
        .to_owned();
    assert!(
        revision.len() >= 7 && revision.chars().all(|c| c.is_ascii_hexdigit()),
        "{version}"
    );
    revision
}

/// The pages a manual page lists (`toolgate\-serve(1)` and the like).
fn listed_pages(page: &str) -> Vec<String> {
    page.split("toolgate\\-")
        .skip(1)
        .filter_map(|rest| {
            let name = rest.split("(1)").next()?;
            (!name.contains(char::is_whitespace))
                .then(|| format!("toolgate-{}", name.replace("\\-", "-")))
        })
        .collect()
}

/// Every page reachable from `toolgate` through the pages' lists is in
/// `folder` (as `name.1` or `name.1.gz`), and there is one per subcommand.
fn every_listed_page_is_there(folder: &Path, read: impl Fn(&Path) -> String) {
    let mut seen = BTreeSet::new();
    let mut next = vec!["toolgate".to_owned()];
    while let Some(name) = next.pop() {
        let path = ["1", "1.gz"]
            .iter()
            .map(|extension| folder.join(format!("{name}.{extension}")))
            .find(|path| path.exists())
            .unwrap_or_else(|| panic!("{name}(1) is listed and missing from {}", folder.display()));
        for listed in listed_pages(&read(&path)) {
            if seen.insert(listed.clone()) {
                next.push(listed);
            }
        }
    }
    for subcommand in [
        "serve",
        "check-config",
        "migrate",
        "invocations-show",
        "review-resolve",
        "man",
    ] {
        assert!(
            seen.contains(&format!("toolgate-{subcommand}")),
            "{subcommand}: {seen:?}"
        );
    }
    assert!(!seen.contains("toolgate-help"), "no page for help is made");
}

/// The package, built from this repository, installed with dpkg: the
/// binary names this build's revision; the unit, snippets and configuration
/// installed are the repository's; the postinst made the users, the group
/// and the folders; the installed unit verifies (its manual page found);
/// every page the manual lists is installed; the configuration is a
/// conffile and passes `check-config`. Then `dpkg -P` leaves none of it.
#[test]
fn the_debian_package_installs_verifies_and_purges_cleanly() {
    let root = nix::unistd::geteuid().is_root();
    assert!(
        root || !ci(),
        "the package test installs a package: CI runs as root"
    );
    if !root {
        eprintln!("not root: the package is not installed here");
        return;
    }
    for tool in [
        "dpkg-deb",
        "dpkg",
        "objdump",
        "systemd-analyze",
        "systemd-sysusers",
        "man",
    ] {
        if !required_tool(tool) {
            return;
        }
    }
    let _users = SystemUsers::take();
    let installed = Command::new("dpkg-query")
        .args(["-W", "toolgate"])
        .output()
        .unwrap();
    assert!(
        !installed.status.success(),
        "a toolgate package is installed on this machine already; the test would remove it"
    );
    let out = tempfile::tempdir().unwrap();
    let package = run(
        repository().join("scripts/package-deb"),
        &[
            "--binary",
            toolgate(),
            "--out",
            out.path().to_str().unwrap(),
        ],
    );
    let package = PathBuf::from(package.trim());
    let conffiles = run(
        "dpkg-deb",
        &["--info", package.to_str().unwrap(), "conffiles"],
    );
    assert_eq!(
        conffiles,
        "/etc/toolgate/toolgate.toml\n/etc/toolgate/policy.toml\n"
    );
    let contents = run("dpkg-deb", &["--contents", package.to_str().unwrap()]);
    let files: Vec<PathBuf> = contents
        .lines()
        .filter(|line| line.starts_with('-'))
        .filter_map(|line| line.split_whitespace().last())
        .map(|path| PathBuf::from(path.trim_start_matches('.')))
        .collect();
    assert!(files.len() > 30, "{contents}");

    let purge = || {
        Command::new("dpkg")
            .args(["-P", "toolgate"])
            .output()
            .unwrap()
    };
    /// Purges the package when the test ends, however it ends.
    struct Installed;
    impl Drop for Installed {
        fn drop(&mut self) {
            let _ = Command::new("dpkg").args(["-P", "toolgate"]).output();
        }
    }
    succeeded(
        "dpkg -i",
        &Command::new("dpkg")
            .arg("-i")
            .arg(&package)
            .output()
            .unwrap(),
    );
    let _installed = Installed;

    assert_eq!(
        revision_of(Path::new("/usr/bin/toolgate")),
        revision_of(Path::new(toolgate()))
    );
    for (installed, source) in [
        (
            "/usr/lib/systemd/system/toolgate.service",
            "systemd/toolgate.service",
        ),
        (
            "/usr/lib/sysusers.d/toolgate.conf",
            "systemd/toolgate.sysusers",
        ),
        (
            "/usr/lib/tmpfiles.d/toolgate.conf",
            "systemd/toolgate.tmpfiles",
        ),
        ("/etc/toolgate/toolgate.toml", "systemd/toolgate.toml"),
        (
            "/usr/share/doc/toolgate/examples/run-as.conf",
            "systemd/run-as.conf",
        ),
    ] {
        assert_eq!(
            std::fs::read(installed).unwrap(),
            std::fs::read(deploy().join(source)).unwrap(),
            "{installed}"
        );
    }
    // The postinst: users, the control group with toolgate in it, folders.
    let toolgate_uid = nix::unistd::User::from_name("toolgate")
        .unwrap()
        .expect("the toolgate user")
        .uid;
    assert!(
        nix::unistd::User::from_name("toolgate-mcp")
            .unwrap()
            .is_some()
    );
    let control = nix::unistd::Group::from_name("toolgate-control")
        .unwrap()
        .expect("toolgate-control");
    assert!(
        control.mem.iter().any(|member| member == "toolgate"),
        "{control:?}"
    );
    for (folder, mode) in [
        ("/var/lib/toolgate", 0o711),
        ("/var/lib/toolgate/mcp", 0o711),
        ("/var/lib/toolgate/node", 0o700),
        ("/run/toolgate", 0o711),
        ("/run/toolgate/turns", 0o711),
    ] {
        let metadata = std::fs::metadata(folder).unwrap();
        assert_eq!(metadata.uid(), toolgate_uid.as_raw(), "{folder}");
        assert_eq!(metadata.permissions().mode() & 0o7777, mode, "{folder}");
    }
    // The installed unit verifies, its manual page found by man.
    let verify = Command::new("systemd-analyze")
        .args(["verify", "/usr/lib/systemd/system/toolgate.service"])
        .output()
        .unwrap();
    assert!(
        verify.status.success() && verify.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );
    every_listed_page_is_there(Path::new("/usr/share/man/man1"), |path| {
        run("zcat", &[path.to_str().unwrap()])
    });
    run("man", &["-w", "toolgate-serve"]);
    let completion =
        std::fs::read_to_string("/usr/share/bash-completion/completions/toolgate").unwrap();
    assert!(completion.contains("_toolgate()"));
    let checked = run(
        "/usr/bin/toolgate",
        &["check-config", "/etc/toolgate/toolgate.toml"],
    );
    assert!(checked.contains(": ok"), "{checked}");

    succeeded("dpkg -P", &purge());
    let left: Vec<&PathBuf> = files.iter().filter(|file| file.exists()).collect();
    assert!(left.is_empty(), "left after a purge: {left:?}");
    for folder in [
        "/etc/toolgate",
        "/usr/share/doc/toolgate",
        "/var/lib/toolgate",
        "/run/toolgate",
    ] {
        assert!(
            !Path::new(folder).exists(),
            "{folder} is left after a purge"
        );
    }
    assert!(
        !Command::new("dpkg-query")
            .args(["-W", "toolgate"])
            .output()
            .unwrap()
            .status
            .success()
    );
    // Its users and group stay, as Debian's do (this test's guard removes
    // those it made).
    assert!(nix::unistd::User::from_name("toolgate").unwrap().is_some());
    assert!(
        nix::unistd::Group::from_name("toolgate-control")
            .unwrap()
            .is_some()
    );
}

/// The release archive: named after the binary's version and revision,
/// its checksum beside it right, its SHA256SUMS covering every file and
/// right; the binary, a manual page for everything the manual lists,
/// completions, README, docs, deploy/ and the example configuration, which
/// passes `check-config` from where the archive unpacks.
#[test]
fn the_release_archive_holds_what_it_says_with_checksums() {
    for tool in ["tar", "sha256sum"] {
        if !required_tool(tool) {
            return;
        }
    }
    let revision = revision_of(Path::new(toolgate()));
    let out = tempfile::tempdir().unwrap();
    let archive = run(
        repository().join("scripts/release"),
        &[
            "--binary",
            toolgate(),
            "--out",
            out.path().to_str().unwrap(),
        ],
    );
    let archive = PathBuf::from(archive.trim());
    let name = format!(
        "toolgate-{}-{revision}-{}-linux",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH
    );
    assert_eq!(archive, out.path().join(format!("{name}.tar.gz")));
    let check = Command::new("sha256sum")
        .args(["--check", "--strict", &format!("{name}.tar.gz.sha256")])
        .current_dir(out.path())
        .output()
        .unwrap();
    succeeded("the archive's checksum", &check);

    let unpacked = tempfile::tempdir().unwrap();
    run(
        "tar",
        &[
            "-xzf",
            archive.to_str().unwrap(),
            "-C",
            unpacked.path().to_str().unwrap(),
        ],
    );
    let top: Vec<String> = std::fs::read_dir(unpacked.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        top,
        std::slice::from_ref(&name),
        "one folder, named as the archive"
    );
    let folder = unpacked.path().join(&name);
    let sums = Command::new("sha256sum")
        .args(["--check", "--strict", "SHA256SUMS"])
        .current_dir(&folder)
        .output()
        .unwrap();
    succeeded("SHA256SUMS", &sums);
    // Every file is summed.
    let summed: BTreeSet<String> = std::fs::read_to_string(folder.join("SHA256SUMS"))
        .unwrap()
        .lines()
        .map(|line| line.split_once("  ").unwrap().1.to_owned())
        .collect();
    let mut files = BTreeSet::new();
    let mut walk = vec![folder.clone()];
    while let Some(path) = walk.pop() {
        for entry in std::fs::read_dir(&path).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk.push(path);
            } else {
                files.insert(
                    path.strip_prefix(&folder)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    files.remove("SHA256SUMS");
    assert_eq!(files, summed);
    for expected in [
        "toolgate",
        "README.md",
        "LICENSE",
        "REVISION",
        "docs/operations.md",
        "docs/configuration.md",
        "deploy/README.md",
        "deploy/systemd/toolgate.service",
        "deploy/systemd/run-as.conf",
        "deploy/container/Containerfile",
        "deploy/kubernetes/base/daemonset.yaml",
        "deploy/kubernetes/stdio-servers/daemonset.yaml",
        "config/toolgate.toml",
        "config/policy.toml",
        "completions/toolgate.bash",
        "completions/_toolgate",
        "completions/toolgate.fish",
    ] {
        assert!(
            files.contains(expected),
            "{expected} is not in the archive: {files:?}"
        );
    }
    // What the repository holds under docs/ and deploy/, the archive holds.
    for tree in ["docs", "deploy", "config"] {
        let mut walk = vec![repository().join(tree)];
        while let Some(path) = walk.pop() {
            for entry in std::fs::read_dir(&path).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk.push(path);
                } else {
                    let relative = path.strip_prefix(repository()).unwrap();
                    assert_eq!(
                        std::fs::read(folder.join(relative)).unwrap(),
                        std::fs::read(&path).unwrap(),
                        "{}",
                        relative.display()
                    );
                }
            }
        }
    }
    let shipped = folder.join("toolgate");
    assert_eq!(revision_of(&shipped), revision);
    assert_eq!(
        std::fs::read_to_string(folder.join("REVISION"))
            .unwrap()
            .trim(),
        revision
    );
    every_listed_page_is_there(&folder.join("man/man1"), |path| {
        std::fs::read_to_string(path).unwrap()
    });
    // The example configuration checks from the unpacked folder.
    let checked = Command::new(&shipped)
        .args(["check-config", "config/toolgate.toml"])
        .current_dir(&folder)
        .env_remove("TOOLGATE_STORE_URL")
        .output()
        .unwrap();
    succeeded("check-config", &checked);
}

/// What ships is what was committed: in a checkout whose example
/// configuration was edited (an operator's keys, say), the archive still
/// holds the committed file, taken from the commit its binary names.
#[test]
fn the_release_archive_ships_the_commit_not_the_working_tree() {
    for tool in ["git", "tar", "sha256sum"] {
        if !required_tool(tool) {
            return;
        }
    }
    let revision = revision_of(Path::new(toolgate()));
    let checkout = tempfile::tempdir().unwrap();
    let cloned = Command::new("git")
        .args(["clone", "--quiet"])
        .arg(repository())
        .arg(checkout.path())
        .output()
        .unwrap();
    succeeded("git clone", &cloned);
    let config = checkout.path().join("config/toolgate.toml");
    let committed = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!("{committed}\n# an operator's edit: tgk_secret\n"),
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let archive = run(
        checkout.path().join("scripts/release"),
        &[
            "--binary",
            toolgate(),
            "--out",
            out.path().to_str().unwrap(),
        ],
    );
    let unpacked = tempfile::tempdir().unwrap();
    run(
        "tar",
        &[
            "-xzf",
            archive.trim(),
            "-C",
            unpacked.path().to_str().unwrap(),
        ],
    );
    let name = format!(
        "toolgate-{}-{revision}-{}-linux",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH
    );
    let shipped =
        std::fs::read_to_string(unpacked.path().join(&name).join("config/toolgate.toml")).unwrap();
    let at_revision = run(
        "git",
        &[
            "-C",
            checkout.path().to_str().unwrap(),
            "show",
            &format!("{revision}:config/toolgate.toml"),
        ],
    );
    assert_eq!(shipped, at_revision);
    assert!(!shipped.contains("tgk_secret"));
}
