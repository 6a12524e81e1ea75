//! Steps 4 and 5 on the hot path: validate a typical 1 KB argument object
//! against a cached validator, canonicalize, hash, derive the key.
//!
//! `cargo bench --bench arguments`

// These time and pace real processes from outside them: the system's clock
// is the one they share (clippy.toml keeps it out of `src`).
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use serde_json::{Value, json};
use toolgate::domain::idempotency_key;
use toolgate::pipeline::{CompiledSchema, SchemaCache, SchemaOrigin};

fn main() {
    divan::main();
}

fn schema() -> Value {
    json!({
        "type": "object",
        "required": ["to", "subject", "body"],
        "properties": {
            "to": {"type": "array", "items": {"type": "string", "maxLength": 254}, "maxItems": 20},
            "cc": {"type": "array", "items": {"type": "string", "maxLength": 254}, "maxItems": 20},
            "subject": {"type": "string", "maxLength": 200},
            "body": {"type": "string", "maxLength": 20000},
            "priority": {"type": "string", "enum": ["low", "normal", "high"], "default": "normal"},
            "send_at": {"type": "string"},
            "labels": {"type": "array", "items": {"type": "string"}},
            "thread": {"type": "object", "properties": {
                "id": {"type": "string"}, "reply": {"type": "boolean"}
            }}
        }
    })
}

/// About 1 KB serialized, with non-ASCII text that needs NFC checking.
fn arguments() -> Value {
    json!({
        "to": ["alice@example.com", "bob@example.org", "carol.dupont@example.fr"],
        "cc": ["team-leads@example.com"],
        "subject": "Quarterly review: résumé of open items and next steps",
        "body": "Hello all,\n\nAttached is the résumé of this quarter's open items. \
                 Please review the action list before Thursday's meeting; we will go \
                 through ownership, deadlines and the naïve estimates we made in July. \
                 Münster and Zürich offices: please confirm room bookings. \
                 Thanks — the platform team.\n\nPS: the dashboard link is in the wiki \
                 under Operations › Reviews › 2026 › Q4, next to last quarter's notes, \
                 which also need a look from everyone who owned an item there. \
                 If a date does not work for you, reply to this thread with the slots \
                 you can make, and we will find one that suits the most people. The \
                 notes from July are linked from the same page for reference. Best, P.",
        "labels": ["review", "q4", "operations", "résumé", "planning", "offices"],
        "send_at": "2026-12-01T09:00:00Z",
        "thread": {"id": "thr_8f1c2a9d", "reply": false}
    })
}

#[divan::bench]
fn validate_canonicalize_hash_key(bencher: divan::Bencher) {
    let cache = SchemaCache::default();
    let schema = schema();
    let arguments = arguments();
    let size = serde_json::to_vec(&arguments).unwrap().len();
    assert!((1000..1200).contains(&size), "{size} bytes");
    let compiled = cache
        .get_or_compile(&schema, SchemaOrigin::Local)
        .expect("the schema compiles");
    bencher.bench_local(|| {
        let canonical = compiled
            .validate(divan::black_box(&arguments).clone())
            .expect("valid");
        idempotency_key(
            "6f1c1d9e-2b1a-4c7e-9f00-0123456789ab",
            7,
            "call_abc123",
            "email.send",
            "1",
            &canonical.sha256,
        )
    });
}

#[divan::bench]
fn cached_validator_lookup(bencher: divan::Bencher) {
    let cache = SchemaCache::default();
    let schema = schema();
    cache.get_or_compile(&schema, SchemaOrigin::Local).unwrap();
    bencher.bench_local(|| {
        cache
            .get_or_compile(divan::black_box(&schema), SchemaOrigin::Local)
            .unwrap()
    });
}

#[divan::bench]
fn compile_schema(bencher: divan::Bencher) {
    let schema = schema();
    bencher.bench_local(|| {
        CompiledSchema::compile(divan::black_box(&schema), SchemaOrigin::Local).unwrap()
    });
}
