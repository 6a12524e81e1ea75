//! An echo through the whole persisted pipeline to an MCP server, against
//! a direct client call to the same server, interleaved in blocks in one
//! run so both see the same machine:
//!
//! - over stdio, `@modelcontextprotocol/server-everything` against a plain
//!   rmcp client on another child of it;
//! - over streamable HTTP, the scripted server's HTTP mode through egress,
//!   against a bare rmcp session on toolgate's HTTP transport (the same
//!   dialer and client, no pipeline); with the CPU this process spends per
//!   call on each side.
//!
//! `demo.echo` through the same pipeline alongside separates the store's
//! share from the MCP path's.
//!
//! `cargo bench --bench mcp` (PostgreSQL when `DATABASE_URL` is set,
//! embedded SQLite otherwise; `TOOLGATE_BENCH_CALLS` calls per side, default
//! 2000; server-everything comes from `scripts/test`'s install, or
//! `TOOLGATE_MCP_SERVERS`).

// These time and pace real processes from outside them: the system's clock
// is the one they share (clippy.toml keeps it out of `src`).
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::ServiceExt as _;
use rmcp::model::CallToolRequestParams;
use serde_json::json;
use toolgate::adapters::artifacts::FsArtifactStore;
use toolgate::adapters::credentials::EnvFileResolver;
use toolgate::adapters::mcp::{McpServerSet, StdioServerSettings};
use toolgate::adapters::policy::RuleFilePolicy;
use toolgate::domain::mcp_server::{AuthScheme, ServerClassification};
use toolgate::domain::{
    AgentSpec, ArgumentTrust, IdempotencyClass, PolicyProfile, Principal, RiskLevel,
    RuntimeEnvironment, SideEffectClass, TargetKind, ToolOutcomeStatus, TrustLevel,
};
use toolgate::pipeline::{
    CallRequest, NodePlace, Pipeline, PipelineParts, PipelineSettings, RegistryLimits,
    ToolRegistry, Worker, WorkerSettings, prepare_mcp,
};
use toolgate::ports::{Store, SystemClock};
use uuid::Uuid;

const BLOCK: usize = 50;
const MCP_ECHO: &str = "mcp.everything.echo";
/// The same pipeline on a builtin: what the store costs without MCP.
const BUILTIN_ECHO: &str = "demo.echo";

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let servers = PathBuf::from(
        std::env::var("TOOLGATE_MCP_SERVERS")
            .unwrap_or_else(|_| "/var/tmp/toolgate-mcp-servers".into()),
    );
    let script =
        servers.join("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let calls: usize = std::env::var("TOOLGATE_BENCH_CALLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let folder = tempfile::tempdir().expect("folder");
        // On PostgreSQL, a schema of its own, dropped at the end.
        let schema = format!("bench_mcp_{}", Uuid::new_v4().simple());
        let mut admin = None;
        let (store, backend): (Arc<dyn Store>, &str) = match std::env::var("DATABASE_URL") {
            Ok(admin_url) => {
                use sqlx::Connection as _;
                let mut connection = sqlx::PgConnection::connect(&admin_url)
                    .await
                    .expect("DATABASE_URL connects");
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
                    .execute(&mut connection)
                    .await
                    .expect("schema");
                admin = Some(connection);
                let separator = if admin_url.contains('?') { '&' } else { '?' };
                let url = format!("{admin_url}{separator}options=-c%20search_path%3D{schema}");
                (
                    toolgate::adapters::store::connect(&url)
                        .await
                        .expect("store"),
                    "postgres",
                )
            }
            Err(_) => {
                let url = format!("sqlite://{}", folder.path().join("bench.db").display());
                (
                    toolgate::adapters::store::connect(&url)
                        .await
                        .expect("store"),
                    "sqlite",
                )
            }
        };
        store.migrate().await.expect("migrations");
        let registry = Arc::new(
            ToolRegistry::with_builtins(
                RegistryLimits {
                    maximum_output_bytes_ceiling: 1 << 20,
                    tenant_catalog_tools: 10_000,
                },
                toolgate::builtin::demo::tools(folder.path()),
            )
            .expect("registry"),
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
            policy: Arc::new(
                RuleFilePolicy::parse("[[rules]]\ntools = [\"*\"]\ndecision = \"allow\"\n")
                    .expect("policy"),
            ),
            artifacts: Arc::new(FsArtifactStore::new(folder.path().join("artifacts"))),
            credentials: Arc::new(EnvFileResolver::default()),
            clock: clock.clone(),
            observer: Arc::new(toolgate::pipeline::Unobserved),
            mcp: None,
            lease: worker.lease(),
            settings: PipelineSettings {
                inline_maximum_bytes: 4096,
            },
        }));
        if script.exists() {
            let node = PathBuf::from("/usr/bin/node");
            let everything = McpServerSet::new(
                vec![StdioServerSettings {
                    server_id: "everything".into(),
                    program: node.display().to_string(),
                    args: vec![script.display().to_string(), "stdio".into()],
                    env: Default::default(),
                    auth_scheme: AuthScheme::None,
                    auth_name: None,
                    credential_ref: None,
                    classification: ServerClassification {
                        side_effect: SideEffectClass::ExternalRead,
                        risk: RiskLevel::Low,
                        idempotency: IdempotencyClass::ReadOnly,
                        required_scopes: BTreeSet::new(),
                        timeout_seconds: 30,
                        maximum_output_bytes: 65536,
                    },
                    connect_timeout: Duration::from_secs(30),
                    request_timeout: Duration::from_secs(30),
                    idle_timeout: Duration::from_secs(900),
                    enabled: true,
                    state_dir: folder.path().join("state/everything"),
                    run_as: None,
                    path: None,
                }],
                Arc::new(EnvFileResolver::default()),
                store.clone(),
                clock.clone(),
                Arc::new(toolgate::adapters::telemetry::MetricsRegistry::default()),
            );
            let prepared = prepare_mcp(
                &registry,
                store.as_ref(),
                clock.as_ref(),
                "bench",
                None,
                &everything,
            )
            .await
            .expect("preparation");
            assert!(
                prepared
                    .registered
                    .contains(&"mcp.everything.echo".to_owned())
            );
            let agent = AgentSpec {
                tools: vec!["mcp.*".into(), "demo.echo".into()],
            };
            let principal = Principal {
                id: "bench".into(),
                scopes: BTreeSet::from(["demo.use".to_owned()]),
            };
            let pinned = registry.specs_for_session(
                "bench",
                &agent,
                &principal,
                &PolicyProfile::default(),
                &RuntimeEnvironment {
                    targets: [TargetKind::McpServer, TargetKind::InProcess].into(),
                },
            );

            // The direct side: a plain rmcp client on its own child.
            let mut child = tokio::process::Command::new(&node)
                .arg(&script)
                .arg("stdio")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("server starts");
            let transport = (
                child.stdout.take().expect("stdout"),
                child.stdin.take().expect("stdin"),
            );
            let direct = ().serve(transport).await.expect("handshake");

            let session_id = Uuid::new_v4();
            let toolgate_call = |tool: &'static str, i: usize| {
                let request = CallRequest {
                    tenant_id: "bench".into(),
                    session_id,
                    run_id: Uuid::new_v4(),
                    step_number: 1,
                    call_id: format!("call-{i}"),
                    name: tool.into(),
                    arguments: if tool == "demo.echo" {
                        json!({"text": format!("hello {i}")})
                    } else {
                        json!({"message": format!("hello {i}")})
                    },
                    principal: principal.clone(),
                    agent: agent.clone(),
                    pinned: pinned.clone(),
                    origin_trust: TrustLevel::User,
                    argument_trust: ArgumentTrust::default(),
                    deadline_at: Some(chrono::Utc::now() + chrono::Duration::seconds(60)),
                    parallel_group: None,
                    recovering: None,
                    caller: Default::default(),
                };
                let pipeline = pipeline.clone();
                async move {
                    let started = Instant::now();
                    let outcome = pipeline.call(request).await;
                    assert_eq!(
                        outcome.status(),
                        Some(ToolOutcomeStatus::Succeeded),
                        "{outcome:?}"
                    );
                    started.elapsed()
                }
            };
            let direct_call = |i: usize| {
                let peer = direct.peer().clone();
                async move {
                    let params = CallToolRequestParams::new("echo").with_arguments(
                        json!({"message": format!("hello {i}")})
                            .as_object()
                            .cloned()
                            .unwrap_or_default(),
                    );
                    let started = Instant::now();
                    peer.call_tool(params).await.expect("direct echo");
                    started.elapsed()
                }
            };
            // Warm both.
            for i in 0..BLOCK {
                toolgate_call(MCP_ECHO, i).await;
                toolgate_call(BUILTIN_ECHO, i).await;
                direct_call(i).await;
            }
            let (mut through, mut plain) = (Vec::with_capacity(calls), Vec::with_capacity(calls));
            let mut builtin = Vec::with_capacity(calls);
            let mut i = BLOCK;
            while through.len() < calls {
                for _ in 0..BLOCK {
                    through.push(toolgate_call(MCP_ECHO, i).await);
                    i += 1;
                }
                for _ in 0..BLOCK {
                    builtin.push(toolgate_call(BUILTIN_ECHO, i).await);
                    i += 1;
                }
                for _ in 0..BLOCK {
                    plain.push(direct_call(i).await);
                    i += 1;
                }
            }
            through.sort();
            plain.sort();
            builtin.sort();
            let (b50, b99) = (percentile(&builtin, 0.5), percentile(&builtin, 0.99));
            let (t50, t99) = (percentile(&through, 0.5), percentile(&through, 0.99));
            let (d50, d99) = (percentile(&plain, 0.5), percentile(&plain, 0.99));
            println!(
                "mcp echo, {calls} calls per side, store {backend}, interleaved in blocks of {BLOCK}"
            );
            println!("{:>28} | {:>9} | {:>9}", "", "p50", "p99");
            println!(
                "{:>28} | {:>9.2?} | {:>9.2?}",
                "toolgate pipeline (stdio)", t50, t99
            );
            println!(
                "{:>28} | {:>9.2?} | {:>9.2?}",
                "toolgate pipeline demo.echo", b50, b99
            );
            println!(
                "{:>28} | {:>9.2?} | {:>9.2?}",
                "direct rmcp client (stdio)", d50, d99
            );
            println!(
                "{:>28} | {:>9.2} | {:>9.2}",
                "ratio",
                t50.as_secs_f64() / d50.as_secs_f64(),
                t99.as_secs_f64() / d99.as_secs_f64()
            );
            let _ = direct.cancel().await;
            everything.shutdown().await;
        } else {
            println!(
                "mcp bench (stdio): {} is missing; run scripts/test once",
                script.display()
            );
        }
        http_phase(&pipeline, &registry, store.clone(), calls).await;
        worker.release().await.ok();
        if let Some(mut admin) = admin {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
                .execute(&mut admin)
                .await
                .ok();
        }
    });
}

/// This process's CPU time so far (user and system), from `/proc`.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command's closing parenthesis; utime and stime are
    // the 12th and 13th of them, in clock ticks (100 per second on Linux).
    let fields: Vec<u64> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|field| field.parse().ok())
        .collect();
    let ticks = fields.get(10).copied().unwrap_or(0) + fields.get(11).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// The scripted server in streamable-HTTP mode, built beside this bench.
fn scripted_http() -> (std::process::Child, u16) {
    use std::io::BufRead as _;
    let status = std::process::Command::new(env!("CARGO"))
        .args(["build", "--release", "--example", "scripted_server"])
        .status()
        .expect("cargo runs");
    assert!(status.success(), "the scripted server builds");
    let exe = std::env::current_exe().expect("bench path");
    let server = exe
        .parent()
        .and_then(std::path::Path::parent)
        .expect("target folder")
        .join("examples/scripted_server");
    let mut child = std::process::Command::new(server)
        .env("SCRIPTED_HTTP", "127.0.0.1:0")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the scripted server starts");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("it says where it listens");
    let port = line
        .trim()
        .strip_prefix("listening ")
        .and_then(|port| port.parse().ok())
        .expect("a port");
    (child, port)
}

/// Echo over streamable HTTP: the pipeline beside a bare rmcp session on
/// the same transport, interleaved; latency and this process's CPU per call.
async fn http_phase(
    pipeline: &Arc<Pipeline>,
    registry: &Arc<ToolRegistry>,
    store: Arc<dyn Store>,
    calls: usize,
) {
    use toolgate::adapters::egress::{Dialer, EgressSettings};
    use toolgate::adapters::mcp::HttpServerSettings;
    use toolgate::adapters::mcp::auth::{AuthSettings, Authenticator};
    use toolgate::adapters::mcp::client::Connection;
    use toolgate::adapters::mcp::framing::Ceilings;
    use toolgate::adapters::mcp::http::EgressClient;
    use toolgate::domain::egress::{AllowEntry, AllowedCidrs, EgressAllowlist};

    let (mut server, port) = scripted_http();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let dialer = Arc::new(
        Dialer::new(
            EgressSettings {
                allowlist: EgressAllowlist::new(vec![
                    AllowEntry::parse(&format!("http://127.0.0.1:{port}")).expect("entry"),
                ]),
                allowed_cidrs: AllowedCidrs::parse(&["127.0.0.1/32"]).expect("range"),
                connect_timeout: Duration::from_secs(5),
                tls_timeout: Duration::from_secs(5),
            },
            None,
        )
        .expect("dialer"),
    );
    let none = AuthSettings {
        scheme: AuthScheme::None,
        name: None,
        credential_ref: None,
        token_endpoint: None,
        token_scopes: Vec::new(),
    };
    let clock = Arc::new(SystemClock);
    let servers = McpServerSet::new(
        Vec::new(),
        Arc::new(EnvFileResolver::default()),
        store.clone(),
        clock.clone(),
        Arc::new(toolgate::adapters::telemetry::MetricsRegistry::default()),
    )
    .with_http(
        vec![HttpServerSettings {
            server_id: "scripted".into(),
            url: url.clone(),
            auth: none.clone(),
            classification: ServerClassification {
                side_effect: SideEffectClass::ExternalRead,
                risk: RiskLevel::Low,
                idempotency: IdempotencyClass::ReadOnly,
                required_scopes: BTreeSet::new(),
                timeout_seconds: 30,
                maximum_output_bytes: 65536,
            },
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(900),
            enabled: true,
        }],
        dialer.clone(),
        Duration::from_secs(300),
        toolgate::domain::mcp_server::TenantCeilings {
            maximum_output_bytes: toolgate::config::DEFAULT_MAXIMUM_OUTPUT_BYTES_CEILING,
            timeout_seconds: toolgate::config::DEFAULT_MAXIMUM_TIMEOUT_SECONDS,
        },
    );
    let prepared = prepare_mcp(
        registry,
        store.as_ref(),
        clock.as_ref(),
        "bench",
        None,
        &servers,
    )
    .await
    .expect("preparation");
    assert!(
        prepared
            .registered
            .contains(&"mcp.scripted.echo".to_owned())
    );
    let agent = AgentSpec {
        tools: vec!["mcp.scripted.echo".into()],
    };
    let principal = Principal {
        id: "bench".into(),
        scopes: BTreeSet::new(),
    };
    let pinned = registry.specs_for_session(
        "bench",
        &agent,
        &principal,
        &PolicyProfile::default(),
        &RuntimeEnvironment {
            targets: [TargetKind::McpServer].into(),
        },
    );
    let ceilings = Ceilings::new(1 << 20);
    let authenticator = Arc::new(Authenticator::new(
        none,
        Arc::new(EnvFileResolver::default()),
        dialer.clone(),
        clock.clone(),
    ));
    let client = EgressClient::new(
        "direct",
        dialer,
        authenticator,
        Duration::from_secs(30),
        ceilings.clone(),
    );
    let direct = Connection::open_http("direct", client, &url, Duration::from_secs(10), ceilings)
        .await
        .expect("direct handshake");
    let session_id = Uuid::new_v4();
    let through_call = |i: usize| {
        let request = CallRequest {
            tenant_id: "bench".into(),
            session_id,
            run_id: Uuid::new_v4(),
            step_number: 1,
            call_id: format!("http-{i}"),
            name: "mcp.scripted.echo".into(),
            arguments: json!({"text": format!("hello {i}")}),
            principal: principal.clone(),
            agent: agent.clone(),
            pinned: pinned.clone(),
            origin_trust: TrustLevel::User,
            argument_trust: ArgumentTrust::default(),
            deadline_at: Some(chrono::Utc::now() + chrono::Duration::seconds(60)),
            parallel_group: None,
            recovering: None,
            caller: Default::default(),
        };
        let pipeline = pipeline.clone();
        async move {
            let started = Instant::now();
            let outcome = pipeline.call(request).await;
            assert_eq!(
                outcome.status(),
                Some(ToolOutcomeStatus::Succeeded),
                "{outcome:?}"
            );
            started.elapsed()
        }
    };
    let direct_call = |i: usize| {
        let arguments = json!({"text": format!("hello {i}")})
            .as_object()
            .cloned()
            .unwrap_or_default();
        let direct = &direct;
        async move {
            let started = Instant::now();
            direct
                .call_tool("echo", arguments, "bench", Duration::from_secs(30))
                .await
                .expect("direct echo");
            started.elapsed()
        }
    };
    for i in 0..BLOCK {
        through_call(i).await;
        direct_call(i).await;
    }
    let (mut through, mut plain) = (Vec::with_capacity(calls), Vec::with_capacity(calls));
    let (mut through_cpu, mut plain_cpu) = (Duration::ZERO, Duration::ZERO);
    let mut i = BLOCK;
    while through.len() < calls {
        let before = cpu_time();
        for _ in 0..BLOCK {
            through.push(through_call(i).await);
            i += 1;
        }
        let middle = cpu_time();
        for _ in 0..BLOCK {
            plain.push(direct_call(i).await);
            i += 1;
        }
        through_cpu += middle.saturating_sub(before);
        plain_cpu += cpu_time().saturating_sub(middle);
    }
    through.sort();
    plain.sort();
    let (t50, t99) = (percentile(&through, 0.5), percentile(&through, 0.99));
    let (d50, d99) = (percentile(&plain, 0.5), percentile(&plain, 0.99));
    let per_call = |total: Duration| total / u32::try_from(calls).unwrap_or(u32::MAX);
    println!(
        "mcp echo over streamable HTTP, {calls} calls per side, interleaved in blocks of {BLOCK}"
    );
    println!(
        "{:>28} | {:>9} | {:>9} | {:>12}",
        "", "p50", "p99", "cpu/call"
    );
    println!(
        "{:>28} | {:>9.2?} | {:>9.2?} | {:>12.2?}",
        "toolgate pipeline (http)",
        t50,
        t99,
        per_call(through_cpu)
    );
    println!(
        "{:>28} | {:>9.2?} | {:>9.2?} | {:>12.2?}",
        "direct rmcp session (http)",
        d50,
        d99,
        per_call(plain_cpu)
    );
    println!(
        "{:>28} | {:>9.2} | {:>9.2} |",
        "ratio",
        t50.as_secs_f64() / d50.as_secs_f64(),
        t99.as_secs_f64() / d99.as_secs_f64()
    );
    direct.close(Duration::from_secs(2)).await;
    servers.shutdown().await;
    let _ = server.kill();
    let _ = server.wait();
}
