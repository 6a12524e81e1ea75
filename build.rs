//! The build's revision, for `toolgate --version` and `toolgate_build_info`:
//! `TOOLGATE_REVISION` when the builder sets it (a container build has no
//! repository), else the repository's commit, else `unknown`.

fn main() {
    println!("cargo:rerun-if-env-changed=TOOLGATE_REVISION");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    let revision = std::env::var("TOOLGATE_REVISION")
        .ok()
        .filter(|revision| !revision.is_empty())
        .or_else(|| {
            std::process::Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()
                .filter(|output| output.status.success())
                .and_then(|output| String::from_utf8(output.stdout).ok())
                .map(|revision| revision.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=TOOLGATE_REVISION={revision}");
}
