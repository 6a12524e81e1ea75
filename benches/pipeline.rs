//! Load driver: the persisted pipeline on `demo.echo` against PostgreSQL
//! with 1 and 8 concurrent callers, side by side with pgbench doing the four
//! transactions of a call that may have an effect (toolgate makes two for
//! a read the breaker has nothing to count for: its intent is its claim and
//! shows the tally empty) on the same database, two ways: as plain SQL
//! statements (each transaction's BEGIN, tenant setting, writes, events and
//! COMMIT), and as the functions toolgate's store calls, one per commit (the
//! four kept as they were, so the ratios compare across versions).
//!
//! `DATABASE_URL=postgres://… cargo bench --bench pipeline`
//! (`TOOLGATE_BENCH_SECONDS` sets each run's length, default 10;
//! `TOOLGATE_BENCH_ROUNDS` repeats the comparison and prints medians;
//! `TOOLGATE_BENCH_RUNTIME=current_thread` runs the callers on one thread.)

// These time and pace real processes from outside them: the system's clock
// is the one they share (clippy.toml keeps it out of `src`).
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use toolgate::adapters::artifacts::FsArtifactStore;
use toolgate::adapters::credentials::EnvFileResolver;
use toolgate::adapters::policy::RuleFilePolicy;
use toolgate::adapters::store::PostgresStore;
use toolgate::domain::{
    AgentSpec, ArgumentTrust, PolicyProfile, Principal, RuntimeEnvironment, TargetKind, TrustLevel,
};
use toolgate::pipeline::{
    CallRequest, NodePlace, Pipeline, PipelineParts, PipelineSettings, RegistryLimits,
    ToolRegistry, Worker, WorkerSettings,
};
use toolgate::ports::{Store, SystemClock};
use uuid::Uuid;

/// The pgbench script: the four transactions of a call with an effect, with
/// rows and event bodies of the sizes toolgate writes. (A space follows
/// every colon in the JSON so pgbench does not read `:name` as a variable.)
const PGBENCH_SCRIPT: &str = r#"
BEGIN;
SELECT set_config('toolgate.tenant_id', 'bench', true), set_config('toolgate.scope', '', true);
SELECT outcome_status, reason_code, count(*) FROM tool_invocations WHERE tenant_id = 'bench' AND run_id = '6f1c1d9e-2b1a-4c7e-9f00-0123456789ab' AND tool_name = 'demo.echo' AND arguments_hash = 'x' AND outcome_status IS NOT NULL GROUP BY outcome_status, reason_code;
SELECT base FROM breaker_evidence WHERE tenant_id = 'bench' AND run_id = '6f1c1d9e-2b1a-4c7e-9f00-0123456789ab' AND tool_name = 'demo.echo' AND arguments_hash = 'x';
COMMIT;
BEGIN;
SELECT set_config('toolgate.tenant_id', 'bench', true), set_config('toolgate.scope', '', true);
INSERT INTO tool_invocations (id, tenant_id, session_id, run_id, step_number, call_id, tool_name, tool_version, tool_source, arguments, arguments_hash, idempotency_key, status, idempotency_class, side_effect, principal, origin_trust, worker_id, lease_epoch, created_at) VALUES (gen_random_uuid(), 'bench', gen_random_uuid(), gen_random_uuid(), 1, md5(random()::text), 'demo.echo', '1', 'builtin', '{"text": "hello"}', md5(random()::text), md5(random()::text) || md5(random()::text), 'authorized', 'read_only', 'none', '{"id": "bench","scopes": ["demo.use"]}', 'user', gen_random_uuid(), 0, now()) ON CONFLICT (idempotency_key) DO NOTHING RETURNING id \gset
INSERT INTO events (tenant_id, event_type, payload, created_at) VALUES ('bench', 'tool.call.proposed', '{"invocation_id": "3f0c2a7e-52b1-4d3a-9a43-0d8f2d3c1b7e","run_id": "6f1c1d9e-2b1a-4c7e-9f00-0123456789ab","step_number": 1,"call_id": "9b2f4c1d8e7a4b3c9d2e1f0a8b7c6d5e","tool_name": "demo.echo","tool_source": "builtin","tool_version": "1","outcome_status": null,"reason_code": null,"idempotency_class": "read_only","effect_sent": false,"duration_ms": null,"output_bytes": null,"truncated": false,"parallel_group": null}', now());
INSERT INTO events (tenant_id, event_type, payload, created_at) VALUES ('bench', 'tool.call.authorized', '{"invocation_id": "3f0c2a7e-52b1-4d3a-9a43-0d8f2d3c1b7e","run_id": "6f1c1d9e-2b1a-4c7e-9f00-0123456789ab","step_number": 1,"call_id": "9b2f4c1d8e7a4b3c9d2e1f0a8b7c6d5e","tool_name": "demo.echo","tool_source": "builtin","tool_version": "1","outcome_status": null,"reason_code": null,"idempotency_class": "read_only","effect_sent": false,"duration_ms": null,"output_bytes": null,"truncated": false,"parallel_group": null}', now());
COMMIT;
BEGIN;
SELECT set_config('toolgate.tenant_id', 'bench', true), set_config('toolgate.scope', '', true);
UPDATE tool_invocations SET status = 'running', lease_epoch = lease_epoch + 1, started_at = now() WHERE id = :id AND status = 'authorized' AND tenant_id = 'bench' RETURNING id;
INSERT INTO events (tenant_id, event_type, payload, created_at) VALUES ('bench', 'tool.call.started', '{"invocation_id": "3f0c2a7e-52b1-4d3a-9a43-0d8f2d3c1b7e","run_id": "6f1c1d9e-2b1a-4c7e-9f00-0123456789ab","step_number": 1,"call_id": "9b2f4c1d8e7a4b3c9d2e1f0a8b7c6d5e","tool_name": "demo.echo","tool_source": "builtin","tool_version": "1","outcome_status": null,"reason_code": null,"idempotency_class": "read_only","effect_sent": false,"duration_ms": null,"output_bytes": null,"truncated": false,"parallel_group": null}', now());
COMMIT;
BEGIN;
SELECT set_config('toolgate.tenant_id', 'bench', true), set_config('toolgate.scope', '', true);
UPDATE tool_invocations SET status = 'succeeded', outcome_status = 'succeeded', result = '{"content": [{"type": "text","text": "<<EXTERNAL_UNTRUSTED nonce=0f3a9c2b7d1e4f5a8b6c9d0e1f2a3b4c source=builtin tool=demo.echo>>\nhello\n<<END EXTERNAL_UNTRUSTED nonce=0f3a9c2b7d1e4f5a8b6c9d0e1f2a3b4c>>","trust": "external_untrusted"}]}', output_bytes = 5, completed_at = now() WHERE id = :id AND status IN ('authorized', 'running') AND tenant_id = 'bench';
INSERT INTO events (tenant_id, event_type, payload, created_at) VALUES ('bench', 'tool.call.completed', '{"invocation_id": "3f0c2a7e-52b1-4d3a-9a43-0d8f2d3c1b7e","run_id": "6f1c1d9e-2b1a-4c7e-9f00-0123456789ab","step_number": 1,"call_id": "9b2f4c1d8e7a4b3c9d2e1f0a8b7c6d5e","tool_name": "demo.echo","tool_source": "builtin","tool_version": "1","outcome_status": null,"reason_code": null,"idempotency_class": "read_only","effect_sent": false,"duration_ms": null,"output_bytes": null,"truncated": false,"parallel_group": null}', now());
COMMIT;
"#;

/// The same four as calls to the functions toolgate's PostgreSQL store
/// uses: the breaker read and the insert, claim and completion, with
/// arguments and event bodies of toolgate's sizes.
const PGBENCH_FUNCTIONS_SCRIPT: &str = r#"
SELECT * FROM toolgate_tally('bench', gen_random_uuid(), 'demo.echo', md5(random()::text));
SELECT id AS iid FROM toolgate_intent('bench', gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 1, md5(random()::text), 'demo.echo', '1', 'builtin', NULL, '{"text": "hello"}', md5(random()::text), md5(random()::text) || md5(random()::text), 'authorized', 'read_only', 'none', '{"id": "bench","scopes": ["demo.use"]}', 'user', NULL, now() + interval '30 seconds', NULL, NULL, NULL, '0f3a9c2b-7d1e-4f5a-8b6c-9d0e1f2a3b4c', now(), NULL, ARRAY['tool.call.proposed', 'tool.call.authorized'], ARRAY['EVENT'::jsonb, 'EVENT'::jsonb], NULL, false) \gset
SELECT id FROM toolgate_claim('bench', :iid, '0f3a9c2b-7d1e-4f5a-8b6c-9d0e1f2a3b4c', 0, now(), ARRAY['tool.call.started'], ARRAY['EVENT'::jsonb]);
SELECT toolgate_complete_invocation('bench', :iid, '0f3a9c2b-7d1e-4f5a-8b6c-9d0e1f2a3b4c', 1, 'succeeded', 'succeeded', NULL, '{"content": [{"type": "text","text": "<<EXTERNAL_UNTRUSTED nonce=0f3a9c2b7d1e4f5a8b6c9d0e1f2a3b4c source=builtin tool=demo.echo>>\nhello\n<<END EXTERNAL_UNTRUSTED nonce=0f3a9c2b7d1e4f5a8b6c9d0e1f2a3b4c>>","trust": "external_untrusted"}]}', NULL, 5, false, NULL, NULL, NULL, NULL, now(), ARRAY['tool.call.completed'], ARRAY['EVENT'::jsonb], NULL);
"#;

/// An event body of the size toolgate writes, for the functions script.
const PGBENCH_EVENT: &str = r#"{"invocation_id": "3f0c2a7e-52b1-4d3a-9a43-0d8f2d3c1b7e","run_id": "6f1c1d9e-2b1a-4c7e-9f00-0123456789ab","step_number": 1,"call_id": "9b2f4c1d8e7a4b3c9d2e1f0a8b7c6d5e","tool_name": "demo.echo","tool_source": "builtin","tool_version": "1","outcome_status": null,"reason_code": null,"idempotency_class": "read_only","effect_sent": false,"duration_ms": null,"output_bytes": null,"truncated": false,"parallel_group": null}"#;

/// Process CPU time (user + system) from /proc, in seconds.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesized command name; utime and stime are the
    // 14th and 15th of the whole line.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // Linux reports in clock ticks of 1/100 s.
    (ticks(11) + ticks(12)) / 100.0
}

/// CPU time (user + system) of every PostgreSQL server process on this
/// machine, in seconds: what the database spent, to set beside our own.
/// The children's fields count the backends that have exited (pgbench's
/// connections end with its run; the postmaster reaps them).
fn server_cpu_seconds() -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    entries
        .flatten()
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("stat")).ok())
        .filter_map(|stat| {
            let (head, rest) = stat.rsplit_once(')')?;
            if !head.ends_with("(postgres") {
                return None;
            }
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let ticks = |i: usize| {
                fields
                    .get(i)
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            Some((ticks(11) + ticks(12) + ticks(13) + ticks(14)) / 100.0)
        })
        .sum()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

struct Figures {
    calls_per_second: f64,
    p50: Duration,
    p99: Duration,
    cpu_per_call: Duration,
    server_cpu_per_call: Duration,
}

async fn drive(
    pipeline: Arc<Pipeline>,
    registry: Arc<ToolRegistry>,
    callers: usize,
    seconds: u64,
) -> Figures {
    let agent = AgentSpec {
        tools: vec!["demo.*".into()],
    };
    let principal = Principal {
        id: "bench".into(),
        scopes: ["demo.use".to_owned()].into(),
    };
    let environment = RuntimeEnvironment {
        targets: [TargetKind::InProcess].into(),
    };
    let pinned = registry.specs_for_session(
        "bench",
        &agent,
        &principal,
        &PolicyProfile::default(),
        &environment,
    );
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let cpu_before = cpu_seconds();
    let server_before = server_cpu_seconds();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let (pipeline, agent, principal, pinned) = (
            pipeline.clone(),
            agent.clone(),
            principal.clone(),
            pinned.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let request = CallRequest {
                    tenant_id: "bench".into(),
                    session_id: Uuid::new_v4(),
                    // A run per call: identical calls in one run would (rightly)
                    // trip the loop breaker.
                    run_id: Uuid::new_v4(),
                    step_number: 1,
                    call_id: Uuid::new_v4().simple().to_string(),
                    name: "demo.echo".into(),
                    arguments: json!({"text": "hello"}),
                    principal: principal.clone(),
                    agent: agent.clone(),
                    pinned: pinned.clone(),
                    origin_trust: TrustLevel::User,
                    argument_trust: ArgumentTrust::default(),
                    deadline_at: Some(chrono::Utc::now() + chrono::Duration::seconds(30)),
                    parallel_group: None,
                    recovering: None,
                    caller: Default::default(),
                };
                let begun = Instant::now();
                let outcome = pipeline.call(request).await;
                assert_eq!(
                    outcome.status(),
                    Some(toolgate::domain::ToolOutcomeStatus::Succeeded),
                    "{outcome:?}"
                );
                latencies.push(begun.elapsed());
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("a caller finished"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu_before;
    let server = server_cpu_seconds() - server_before;
    latencies.sort();
    Figures {
        calls_per_second: latencies.len() as f64 / elapsed,
        p50: percentile(&latencies, 0.5),
        p99: percentile(&latencies, 0.99),
        cpu_per_call: Duration::from_secs_f64(cpu / latencies.len().max(1) as f64),
        server_cpu_per_call: Duration::from_secs_f64(server / latencies.len().max(1) as f64),
    }
}

/// pgbench's calls per second and the server CPU each cost.
fn pgbench(
    admin_url: &str,
    schema: &str,
    script_text: &str,
    clients: usize,
    seconds: u64,
) -> Option<(f64, Duration)> {
    let folder = tempfile::tempdir().ok()?;
    let script = folder.path().join("pipeline.sql");
    std::fs::write(&script, script_text).ok()?;
    let server_before = server_cpu_seconds();
    let output = std::process::Command::new("pgbench")
        .args([
            "-n",
            "-M",
            "prepared",
            "-c",
            &clients.to_string(),
            "-j",
            &clients.to_string(),
            "-T",
            &seconds.to_string(),
            "-f",
        ])
        .arg(&script)
        .arg(admin_url)
        .env("PGOPTIONS", format!("-c search_path={schema}"))
        // The sqlx build has no TLS; neither may the comparison.
        .env("PGSSLMODE", "disable")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        eprintln!(
            "pgbench failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        return None;
    }
    let server = server_cpu_seconds() - server_before;
    let tps: f64 = text
        .lines()
        .find(|line| line.starts_with("tps = "))
        .and_then(|line| line.trim_start_matches("tps = ").split_whitespace().next())
        .and_then(|tps| tps.parse().ok())?;
    let calls = tps * seconds as f64;
    Some((tps, Duration::from_secs_f64(server / calls.max(1.0))))
}

fn main() {
    let Ok(admin_url) = std::env::var("DATABASE_URL") else {
        println!("pipeline bench: DATABASE_URL is unset; nothing to measure");
        return;
    };
    let seconds: u64 = std::env::var("TOOLGATE_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let rounds: usize = std::env::var("TOOLGATE_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1);
    // TOOLGATE_BENCH_RUNTIME=current_thread compares a single-threaded
    // runtime, which saves the cross-thread wake-ups of each round trip.
    let runtime = match std::env::var("TOOLGATE_BENCH_RUNTIME").as_deref() {
        Ok("current_thread") => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build(),
    }
    .expect("a runtime");
    let schema = format!("bench_{}", Uuid::new_v4().simple());
    runtime.block_on(async {
        use sqlx::Connection as _;
        let mut admin = sqlx::PgConnection::connect(&admin_url)
            .await
            .expect("DATABASE_URL connects");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .execute(&mut admin)
            .await
            .expect("schema");
        let separator = if admin_url.contains('?') { '&' } else { '?' };
        let url = format!("{admin_url}{separator}options=-c%20search_path%3D{schema}");
        let store: Arc<dyn Store> = Arc::new(PostgresStore::connect(&url).await.expect("store"));
        store.migrate().await.expect("migrations");
        let folder = tempfile::tempdir().expect("folder");
        let registry = Arc::new(
            ToolRegistry::with_builtins(
                RegistryLimits {
                    maximum_output_bytes_ceiling: 1 << 20,
                    tenant_catalog_tools: 10_000,
                },
                toolgate::builtin::demo::tools(folder.path()),
            )
            .expect("builtins"),
        );
        let clock = Arc::new(SystemClock);
        // A lease that outlasts the run: nothing renews it here.
        let worker = Worker::register(
            store.clone(),
            clock.clone(),
            &NodePlace {
                node: uuid::Uuid::new_v4().to_string(),
                host: "bench".into(),
            },
            WorkerSettings {
                lease: std::time::Duration::from_secs(86_400),
                heartbeat: std::time::Duration::from_secs(3_600),
                ..WorkerSettings::default()
            },
        )
        .await
        .expect("worker");
        let pipeline = Arc::new(Pipeline::new(PipelineParts {
            registry: registry.clone(),
            invocations: store.clone(),
            approvals: store.clone(),
            events: store.clone(),
            policy: Arc::new(RuleFilePolicy::built_in()),
            artifacts: Arc::new(FsArtifactStore::new(folder.path().join("artifacts"))),
            credentials: Arc::new(EnvFileResolver::default()),
            clock,
            observer: Arc::new(toolgate::pipeline::Unobserved),
            mcp: None,
            lease: worker.lease(),
            settings: PipelineSettings {
                inline_maximum_bytes: 4096,
            },
        }));
        // Warm the pool and the plan caches.
        drive(pipeline.clone(), registry.clone(), 1, 1).await;
        let functions_script = PGBENCH_FUNCTIONS_SCRIPT.replace("EVENT", PGBENCH_EVENT);
        let scripts = [
            ("pgbench statements", PGBENCH_SCRIPT),
            ("pgbench functions", functions_script.as_str()),
        ];
        println!(
            "{:>7} | {:<18} | {:>8} | {:>9} | {:>9} | {:>10} | {:>10} | {:>14}",
            "callers", "driver", "calls/s", "p50", "p99", "its cpu", "db cpu", "toolgate/this"
        );
        // (callers, driver) -> per-round calls/s, client CPU, db CPU, ratio.
        let mut rounds_seen: Vec<(usize, &str, Vec<[f64; 4]>)> = Vec::new();
        let mut note = |callers: usize, driver: &'static str, figures: [f64; 4]| {
            match rounds_seen
                .iter_mut()
                .find(|(c, d, _)| *c == callers && *d == driver)
            {
                Some((_, _, seen)) => seen.push(figures),
                None => rounds_seen.push((callers, driver, vec![figures])),
            }
        };
        for _ in 0..rounds {
            for callers in [1usize, 8] {
                let figures = drive(pipeline.clone(), registry.clone(), callers, seconds).await;
                println!(
                    "{:>7} | {:<18} | {:>8.0} | {:>9.2?} | {:>9.2?} | {:>10.2?} | {:>10.2?} | {:>14}",
                    callers,
                    "toolgate",
                    figures.calls_per_second,
                    figures.p50,
                    figures.p99,
                    figures.cpu_per_call,
                    figures.server_cpu_per_call,
                    "",
                );
                note(
                    callers,
                    "toolgate",
                    [
                        figures.calls_per_second,
                        figures.cpu_per_call.as_secs_f64(),
                        figures.server_cpu_per_call.as_secs_f64(),
                        1.0,
                    ],
                );
                for (driver, script) in scripts {
                    let Some((tps, server)) = pgbench(&admin_url, &schema, script, callers, seconds)
                    else {
                        println!("{callers:>7} | {driver:<18} | n/a");
                        continue;
                    };
                    let ratio = figures.calls_per_second / tps;
                    println!(
                        "{:>7} | {:<18} | {:>8.0} | {:>9} | {:>9} | {:>10} | {:>10.2?} | {:>14.2}",
                        callers, driver, tps, "", "", "", server, ratio,
                    );
                    note(callers, driver, [tps, 0.0, server.as_secs_f64(), ratio]);
                }
            }
        }
        if rounds > 1 {
            println!("medians of {rounds} rounds:");
            for (callers, driver, seen) in &rounds_seen {
                let median = |k: usize| {
                    let mut values: Vec<f64> = seen.iter().map(|f| f[k]).collect();
                    values.sort_by(f64::total_cmp);
                    let middle = values.len() / 2;
                    if values.len().is_multiple_of(2) {
                        (values[middle - 1] + values[middle]) / 2.0
                    } else {
                        values[middle]
                    }
                };
                let (client, ratio) = if *driver == "toolgate" {
                    (format!("{:.2?}", Duration::from_secs_f64(median(1))), String::new())
                } else {
                    (String::new(), format!("{:.2}", median(3)))
                };
                println!(
                    "{:>7} | {:<18} | {:>8.0} | {:>9} | {:>9} | {:>10} | {:>10.2?} | {:>14}",
                    callers,
                    driver,
                    median(0),
                    "",
                    "",
                    client,
                    Duration::from_secs_f64(median(2)),
                    ratio,
                );
            }
        }
        worker.release().await.ok();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
            .execute(&mut admin)
            .await
            .ok();
    });
}
