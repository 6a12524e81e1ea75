//! The crash torture, small: 20 kills of a real `serve` per backend, with
//! concurrent scripts writing through a non-idempotent MCP tool. The large
//! run is `cargo bench --bench torture`.

#[path = "../torture/driver.rs"]
mod driver;

use std::path::PathBuf;

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
