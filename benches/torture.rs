//! The crash torture at full size: `serve` killed with SIGKILL 200 times per
//! backend (`TOOLGATE_TORTURE_KILLS`), with concurrent scripts writing
//! through a non-idempotent MCP tool whose effects are counted from
//! outside. Prints, per backend, the duplicates (must be 0), the answers by
//! class against the effects, and the restart-to-settled times.
//!
//! With PostgreSQL, then, three nodes on one database: 48 scripts at once,
//! a node killed every two to three seconds (one fault in ten a pause past
//! the lease) for `TOOLGATE_TORTURE_SECONDS` (720, about 200 kills).
//!
//! `DATABASE_URL=postgres://… cargo bench --bench torture` (SQLite always;
//! PostgreSQL when `DATABASE_URL` is set).

// These time and pace real processes from outside them: the system's clock
// is the one they share (clippy.toml keeps it out of `src`).
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

#[path = "../tests/torture/cluster.rs"]
mod cluster;
#[path = "../tests/torture/driver.rs"]
mod driver;

use std::path::PathBuf;
use std::process::Command;

use driver::{Torture, run};

/// The scripted server, built beside this benchmark.
fn scripted_server() -> PathBuf {
    let exe = std::env::current_exe().expect("bench path");
    let profile = exe
        .parent()
        .and_then(std::path::Path::parent)
        .expect("target folder");
    let path = profile.join("examples/scripted_server");
    if !path.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "--release", "--example", "scripted_server"])
            .status()
            .expect("cargo runs");
        assert!(status.success(), "the scripted server builds");
    }
    path
}

fn main() {
    let kills: usize = std::env::var("TOOLGATE_TORTURE_KILLS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(200);
    let torture = |store_url: Option<String>| Torture {
        toolgate: PathBuf::from(env!("CARGO_BIN_EXE_toolgate")),
        server: scripted_server(),
        store_url,
        kills,
        scripts: 3,
        calls: 16,
        seed: 0x746f_7274,
    };
    let sqlite = run(&torture(None));
    println!("sqlite:   {sqlite}");
    if let Ok(admin_url) = std::env::var("DATABASE_URL") {
        let schema = format!("bench_torture_{}", uuid::Uuid::new_v4().simple());
        let psql = |sql: &str| {
            let status = Command::new("psql")
                .args([admin_url.as_str(), "-q", "-c", sql])
                .status()
                .expect("psql runs");
            assert!(status.success(), "{sql}");
        };
        psql(&format!("CREATE SCHEMA {schema}"));
        let separator = if admin_url.contains('?') { '&' } else { '?' };
        let url = format!("{admin_url}{separator}options=-c%20search_path%3D{schema}");
        let postgres = run(&torture(Some(url.clone())));
        println!("postgres: {postgres}");
        let seconds: u64 = std::env::var("TOOLGATE_TORTURE_SECONDS")
            .ok()
            .and_then(|value| value.parse().ok())
            .unwrap_or(720);
        let nodes = cluster::run(&cluster::Cluster {
            toolgate: PathBuf::from(env!("CARGO_BIN_EXE_toolgate")),
            server: scripted_server(),
            store_url: url,
            admin_url: Some(admin_url.clone()),
            nodes: 3,
            scripts: 48,
            calls: 6,
            duration: std::time::Duration::from_secs(seconds),
            kill_every: (
                std::time::Duration::from_secs(2),
                std::time::Duration::from_secs(3),
            ),
            pause: Some((10, std::time::Duration::from_secs(13))),
            seed: 0x636c_7573,
        });
        psql(&format!("DROP SCHEMA {schema} CASCADE"));
        println!("three nodes: {nodes}");
        assert!(postgres.sound(), "{postgres}");
        assert!(nodes.sound(), "{nodes}");
    }
    assert!(sqlite.sound(), "{sqlite}");
}
