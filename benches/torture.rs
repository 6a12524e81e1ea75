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
//!
//! `TOOLGATE_TORTURE_SCALE=1,3,8` measures instead what nodes on one
//! database serve, nothing killed: for each count, `TOOLGATE_TORTURE_SCRIPTS`
//! (8) scripts per node for `TOOLGATE_TORTURE_SECONDS` (60), printing calls/s
//! per node, serve's CPU per call per node and the PostgreSQL backends' CPU
//! per call.

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

/// A schema of its own on the database `admin_url` names: its URL, and
/// what drops it.
fn schema_on(admin_url: &str) -> (String, impl Fn()) {
    let schema = format!("bench_torture_{}", uuid::Uuid::new_v4().simple());
    let psql = {
        let admin_url = admin_url.to_owned();
        move |sql: &str| {
            let status = Command::new("psql")
                .args([admin_url.as_str(), "-q", "-c", sql])
                .status()
                .expect("psql runs");
            assert!(status.success(), "{sql}");
        }
    };
    psql(&format!("CREATE SCHEMA {schema}"));
    let separator = if admin_url.contains('?') { '&' } else { '?' };
    let url = format!("{admin_url}{separator}options=-c%20search_path%3D{schema}");
    (url, move || psql(&format!("DROP SCHEMA {schema} CASCADE")))
}

/// What 1, 3 and 8 (or the counts asked for) nodes on one database serve.
fn scale(admin_url: &str, counts: &str) {
    let number = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|value| value.parse().ok())
            .unwrap_or(default)
    };
    let seconds = number("TOOLGATE_TORTURE_SECONDS", 60);
    let scripts = number("TOOLGATE_TORTURE_SCRIPTS", 8) as usize;
    for count in counts
        .split(',')
        .filter_map(|count| count.trim().parse::<usize>().ok())
    {
        let (url, drop_schema) = schema_on(admin_url);
        let figures = cluster::run(&cluster::Cluster {
            toolgate: PathBuf::from(env!("CARGO_BIN_EXE_toolgate")),
            server: scripted_server(),
            store_url: url,
            admin_url: Some(admin_url.to_owned()),
            nodes: count,
            scripts: scripts * count,
            calls: 6,
            duration: std::time::Duration::from_secs(seconds),
            kill_every: None,
            pause: None,
            seed: 0x7363_616c,
        });
        drop_schema();
        println!("{count} node(s), {} scripts: {figures}", scripts * count);
        assert!(figures.sound(), "{figures}");
    }
}

fn main() {
    if let (Ok(counts), Ok(admin_url)) = (
        std::env::var("TOOLGATE_TORTURE_SCALE"),
        std::env::var("DATABASE_URL"),
    ) {
        scale(&admin_url, &counts);
        return;
    }
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
        let (url, drop_schema) = schema_on(&admin_url);
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
            kill_every: Some((
                std::time::Duration::from_secs(2),
                std::time::Duration::from_secs(3),
            )),
            pause: Some((10, std::time::Duration::from_secs(13))),
            seed: 0x636c_7573,
        });
        drop_schema();
        println!("three nodes: {nodes}");
        assert!(postgres.sound(), "{postgres}");
        assert!(nodes.sound(), "{nodes}");
    }
    assert!(sqlite.sound(), "{sqlite}");
}
