//! The crash torture, small: 20 kills of a real `serve` per backend, with
//! concurrent scripts writing through a non-idempotent MCP tool; and three
//! nodes on one PostgreSQL killed in turn under 48 concurrent scripts. The
//! large runs are `cargo bench --bench torture`.

#[path = "../torture/cluster.rs"]
mod cluster;
#[path = "../torture/driver.rs"]
mod driver;

use std::path::PathBuf;
use std::time::Duration;

use driver::{Torture, run};

fn torture(store_url: Option<String>, seed: u64) -> Torture {
    Torture {
        toolgate: PathBuf::from(env!("CARGO_BIN_EXE_toolgate")),
        server: crate::mcp::scripted_server(),
        store_url,
        kills: 20,
        scripts: 3,
        calls: 16,
        seed,
    }
}

#[test]
fn torture_on_sqlite_applies_no_effect_twice() {
    let figures = run(&torture(None, 7));
    eprintln!("sqlite: {figures}");
    assert!(figures.sound(), "{figures}");
    assert!(figures.succeeded_applied > 0, "{figures}");
}

#[test]
fn torture_on_postgres_applies_no_effect_twice() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let Some(schema) = runtime.block_on(crate::store::PgSchema::create()) else {
        eprintln!("DATABASE_URL unset: the PostgreSQL torture is skipped");
        return;
    };
    let figures = run(&torture(Some(schema.url.clone()), 11));
    eprintln!("postgres: {figures}");
    assert!(figures.sound(), "{figures}");
    assert!(figures.succeeded_applied > 0, "{figures}");
}

/// Three nodes on one PostgreSQL database, 48 scripts at once, a node
/// killed every two to three seconds and started again (or, one time in
/// five, paused past its lease), interrupted scripts replayed on another
/// node: no effect twice, no untrue answer, every call settled.
#[test]
fn three_nodes_killed_in_turn_apply_no_effect_twice_and_answer_truly() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let Some(schema) = runtime.block_on(crate::store::PgSchema::create()) else {
        eprintln!("DATABASE_URL unset: the three-node torture is skipped");
        return;
    };
    let figures = cluster::run(&cluster::Cluster {
        toolgate: PathBuf::from(env!("CARGO_BIN_EXE_toolgate")),
        server: crate::mcp::scripted_server(),
        store_url: schema.url.clone(),
        admin_url: std::env::var("DATABASE_URL").ok(),
        nodes: 3,
        scripts: 48,
        calls: 6,
        duration: Duration::from_secs(75),
        kill_every: Some((Duration::from_secs(2), Duration::from_secs(3))),
        // A pause past the nodes' 10-second lease, now and then.
        pause: Some((5, Duration::from_secs(13))),
        seed: 0x6e6f_6465,
    });
    eprintln!("three nodes: {figures}");
    assert!(figures.sound(), "{figures}");
    assert!(figures.kills >= 5 && figures.pauses >= 1, "{figures}");
    assert!(figures.replays > 0, "{figures}");
    assert!(figures.succeeded_applied > 0, "{figures}");
}
